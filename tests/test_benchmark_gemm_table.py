"""benchmarks/gemm_auto_table.py: which rows a re-measure takes from an existing table."""

from benchmarks import gemm_auto_table as table

_ENV = {"device": "NVIDIA H200", "jax": "0.11.2", "date": "2026-12-01 00:00 UTC"}


def _write_table(tmp_path, rows):
    path = tmp_path / "gemm_table.py"
    path.write_text(table.module_text(rows, _ENV, "python3 benchmarks/gemm_auto_table.py"))
    return str(path)


def _row(layout, m, n, k, xla, pallas):
    return {"layout": layout, "m": m, "n": n, "k": k, "xla_ms": xla, "pallas_ms": pallas}


def test_kernel_rows_within_a_factor_adds_the_close_rows_and_maps_back_to_layer_shapes(tmp_path):
    """``within`` = 1 keeps the rows the table runs on the kernel; a larger factor adds the
    rows where the kernel is at most that much slower; no row without a kernel time; every
    row comes back as (layout, tokens, d_in, d_out)."""
    path = _write_table(tmp_path, [
        _row("fprop", 16, 8192, 2048, 0.036, 0.021),  # kernel picked
        _row("dgrad", 8192, 2048, 8192, 0.433, 0.535),  # 1.24x slower
        _row("wgrad", 2048, 8192, 1024, 0.100, 0.133),  # 1.33x slower
        _row("wgrad", 2048, 2048, 16, 0.074, None),  # no kernel
    ])
    picked = {("fprop", 16, 2048, 8192)}
    assert table.kernel_rows(path) == picked
    assert table.kernel_rows(path, within=1.3) == picked | {("dgrad", 8192, 2048, 8192)}
    assert table.kernel_rows(path, within=1.4) == picked | {
        ("dgrad", 8192, 2048, 8192), ("wgrad", 1024, 2048, 8192)}


def test_kept_rows_are_the_old_rows_a_run_did_not_measure(tmp_path):
    """A partial re-measure keeps every other row of the old table, with its date."""
    old = [_row("fprop", 16, 8192, 2048, 0.036, 0.021), _row("fprop", 16, 2048, 2048, 0.05, 0.06)]
    kept, date, _ = table.kept_rows(_write_table(tmp_path, old),
                                    [_row("fprop", 16, 2048, 2048, 0.024, 0.023)])
    assert [(r["m"], r["n"], r["k"]) for r in kept] == [(16, 8192, 2048)]
    assert date == _ENV["date"]
