"""benchmarks/autotune_picks.py: reading XLA's autotuning dumps, comparing and merging."""

import gzip

import pytest

from benchmarks import autotune_picks

_GEMM = "      backend: CUBLASLT_FISSION\n      backend_config {{\n        gemm {{\n" \
        "          algorithm: {}\n          autotune_workspace_size: 33554432\n" \
        "        }}\n      }}\n"
_TRITON = "      backend: TRITON\n      backend_config {{\n        triton {{\n" \
          "          block_m: {}\n          block_n: 64\n          num_warps: 8\n" \
          "        }}\n      }}\n"


def _dump(*entries):
    """A dump as XLA 0.11 writes it (`--xla_gpu_dump_autotune_results_to`) of
    (hlo_fingerprint, config lines) entries."""
    return "".join(
        f'entries {{\n  key {{\n    target {{\n      device: "ed0e56ab8b2a0ecb"\n'
        f'      hlo_fingerprint: "{fingerprint}"\n    }}\n    environment {{\n'
        f'      codegen_version: "fe9062d0fff82a66"\n    }}\n  }}\n  value {{\n'
        f'    optimal_config {{\n{config}    }}\n    optimal_backend_version: "13.0.0"\n'
        f'  }}\n}}\n' for fingerprint, config in entries)


def test_picks_keys_each_entry_by_device_fingerprint_and_codegen_version():
    """Every entry is read, nested blocks whole; the pick is the value block collapsed."""
    got = autotune_picks.picks(_dump(("014e", _GEMM.format(5)), ("02e5", _TRITON.format(128))))
    key = ("ed0e56ab8b2a0ecb", "014e", "fe9062d0fff82a66")
    assert len(got) == 2 and got[key].startswith("optimal_config { backend: CUBLASLT_FISSION")
    assert "algorithm: 5 autotune_workspace_size: 33554432 } } }" in got[key]
    assert [autotune_picks.backend(p) for p in got.values()] == ["CUBLASLT_FISSION", "TRITON"]
    assert autotune_picks.picks("\n") == {}


def test_a_text_in_another_format_or_an_incomplete_entry_is_an_error_not_zero_picks():
    """The older `results { hlo ... result ... }` format (or any other) raises, rather
    than reading as a file in which nothing was tuned; so does an entry without value."""
    with pytest.raises(ValueError, match="no `entries"):
        autotune_picks.picks('version: 3\nresults {\n  device: "d"\n  hlo: "x"\n}\n')
    with pytest.raises(ValueError, match="without device, hlo_fingerprint"):
        autotune_picks.picks('entries {\n  key {\n    target { device: "d" }\n  }\n}\n')


def test_compare_counts_shared_keys_and_lists_the_different_picks(tmp_path, capsys):
    """Two dumps that tuned one program alike and one differently, each with one of its
    own: two shared keys, one differing; gzipped files are read; the summary counts the
    differing picks by backend."""
    a = _dump(("aa", _GEMM.format(3)), ("bb", _TRITON.format(64)), ("only_a", _GEMM.format(1)))
    b = _dump(("aa", _GEMM.format(3)), ("bb", _GEMM.format(2)), ("only_b", _GEMM.format(1)))
    pa, pb = tmp_path / "1-pure_llama.textproto.gz", tmp_path / "2-pure_llama.textproto"
    pa.write_bytes(gzip.compress(a.encode()))
    pb.write_text(b)
    shared, differ = autotune_picks.compare(autotune_picks.read_picks(pa),
                                            autotune_picks.read_picks(pb))
    assert shared == 2 and len(differ) == 1
    assert differ[0][0][1] == "bb" and "block_m: 64" in differ[0][1]
    assert "algorithm: 2" in differ[0][2]
    assert autotune_picks.main(["compare", str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert "2 tuned in both, 1 of them picked differently" in out
    assert "1 x TRITON -> CUBLASLT_FISSION" in out


def test_merge_keeps_each_programs_first_pick_and_writes_a_dump_that_reads_back(tmp_path):
    """The merged file holds the union of the keys; where two files picked differently the
    first file's pick is kept (and counted as overruling one); it parses as a dump."""
    a = tmp_path / "a.textproto.gz"
    a.write_bytes(gzip.compress(_dump(("aa", _GEMM.format(3)), ("bb", _GEMM.format(4))).encode()))
    b = tmp_path / "b.textproto"
    b.write_text(_dump(("aa", _GEMM.format(7)), ("bb", _GEMM.format(4)),
                       ("cc", _TRITON.format(32))))
    out = tmp_path / "merged.textproto"
    assert autotune_picks.main(["merge", str(out), str(a), str(b)]) == 0
    merged = autotune_picks.read_picks(out)
    assert sorted(k[1] for k in merged) == ["aa", "bb", "cc"]
    assert merged[next(k for k in merged if k[1] == "aa")] == \
        autotune_picks.read_picks(a)[next(k for k in merged if k[1] == "aa")]
    assert autotune_picks.merge([a, b])[1:] == (3, 1)
