"""Measures the NVFP4 GEMM's two Hopper implementations per shape and layout; writes the
table that ``impl="auto"`` reads (`fp4jax.gemm_table`).

For each layout of the three training GEMMs, built as `fp4jax.dot_general` builds them:

* ``fprop``: ``X (M, K)`` rowwise @ ``W (K, N)`` in 16×16 tiles;
* ``dgrad``: ``dY (M, N)`` rowwise @ ``Wᵀ`` (the tiled weight, transposed view);
* ``wgrad``: ``Xᵀ`` (X columnwise + RHT, transposed view, ``lhs_from_mT``) @ ``dY``
  columnwise + RHT — contraction over the M tokens;

and each (tokens, d_in, d_out), it times ``fp4jax.matmul(impl="xla")`` (decode to BF16 +
XLA's dot) and ``impl="pallas"`` (the in-kernel-decode kernel) per call inside one
compiled program (`pallas_kernels.timing.time_in_program`: many of these GEMMs take less
device time than the host takes to dispatch a call), rotating enough input sets to defeat
the L2, checks that both give the same result, and records the times.

Usage (GPU machine, repo root)::

  PYTHONPATH=. python3 benchmarks/gemm_auto_table.py --json OUT.json --module OUT.py

``--module`` writes a Python module in the form of `fp4jax/gemm_table.py` (copy it over
that file to change what ``auto`` does).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax
from pallas_kernels.gemm_data import views
from pallas_kernels.timing import environment, nbytes, sets_to_defeat_l2, time_in_program

TOKENS = (16, 128, 1024, 8192)
WIDTHS = ((2048, 2048), (8192, 8192), (2048, 8192), (8192, 2048))
CALLS = 16  # per program; the time per call is the slope of CALLS and 2 * CALLS calls
TIMER = f"time_in_program: per call, the slope of {CALLS} and {2 * CALLS} calls in one program"


def operands(layout: str, tokens: int, d_in: int, d_out: int, seed: int):
    """(lhs, rhs, (m, n, k)) of one GEMM as `fp4jax.dot_general` stores them, before the
    ``.mT`` it takes inside the step (`gemm_of`): dgrad's weight and wgrad's X as quantized.
    """
    lhs, rhs = _quantized_operands(layout, tokens, d_in, d_out, jnp.uint32(seed))
    m, n, k = {"fprop": (tokens, d_out, d_in), "dgrad": (tokens, d_in, d_out),
               "wgrad": (d_in, d_out, tokens)}[layout]
    return lhs, rhs, (m, n, k)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _quantized_operands(layout, tokens, d_in, d_out, seed):
    # Jitted: a table row builds up to 64 operand sets, which op by op took most of a
    # row's time on the H200.
    ks = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(ks[0], (tokens, d_in), jnp.bfloat16)
    w = (jax.random.normal(ks[1], (d_in, d_out)) / np.sqrt(d_in)).astype(jnp.bfloat16)
    g = jax.random.normal(ks[2], (tokens, d_out), jnp.bfloat16)
    if layout == "fprop":
        return fp4jax.quantize(x), fp4jax.quantize(w, axis=0, block_2d=True)
    if layout == "dgrad":
        return fp4jax.quantize(g), fp4jax.quantize(w, axis=0, block_2d=True)
    if layout == "wgrad":
        return fp4jax.quantize(x, axis=0, hadamard=True), fp4jax.quantize(g, axis=0, hadamard=True)
    raise ValueError(f"unknown layout {layout!r}")


def gemm_of(layout: str, impl: str):
    """The jitted GEMM of ``layout`` on `operands`, with the transposed views
    (`gemm_data.views`) taken inside the program, as in the training step."""
    def f(lhs, rhs):
        a, b, kw = views(layout, lhs, rhs)
        return fp4jax.matmul(a, b, preferred_element_type=jnp.bfloat16, impl=impl, **kw)
    return jax.jit(f)


def measure(layout: str, tokens: int, d_in: int, d_out: int, iters: int) -> dict:
    """One row: both implementations timed on rotating operand sets (seeds 0, 1, ...)."""
    sets = [operands(layout, tokens, d_in, d_out, 0)]
    copies = sets_to_defeat_l2(nbytes(sets[0][:2]))
    sets += [operands(layout, tokens, d_in, d_out, seed) for seed in range(1, copies)]
    mnk = sets[0][2]
    row = {"layout": layout, "m": mnk[0], "n": mnk[1], "k": mnk[2]}
    outs = {}
    for impl in ("xla", "pallas"):
        f = gemm_of(layout, impl)
        try:
            outs[impl] = np.asarray(f(sets[0][0], sets[0][1]), np.float32)
            row[f"{impl}_ms"] = 1e3 * time_in_program(f, [s[:2] for s in sets], iters=iters,
                                                      calls_per_program=CALLS)
        except Exception as e:  # noqa: BLE001 - recorded: a kernel that does not take it
            print(f"  {impl} does not take {layout} {mnk}: {type(e).__name__}", flush=True)
            row[f"{impl}_ms"] = None
            row[f"{impl}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if len(outs) == 2:
        ref = outs["xla"]
        row["max_rel_diff"] = float(np.max(np.abs(outs["pallas"] - ref))
                                    / max(np.max(np.abs(ref)), 1e-30))
    return row


def _ms(v: float | None) -> str:
    return "None" if v is None else f"{v:.4f}"


def module_text(rows: list[dict], env: dict, command: str, note: str = "") -> str:
    """The source of `fp4jax.gemm_table` holding ``rows`` (``note``: a sentence on where
    some rows come from)."""
    entries = "".join(
        f"    ({r['layout']!r}, {r['m']}, {r['n']}, {r['k']}): "
        f"({_ms(r['xla_ms'])}, {_ms(r['pallas_ms'])}),\n"
        for r in sorted(rows, key=lambda r: (r["layout"], r["m"], r["n"], r["k"])))
    return f'''"""Measured times of the NVFP4 GEMM implementations, read by ``impl="auto"``.

Generated by ``{command}``
on {env["device"]}, JAX {env["jax"]}, {env["date"]}.
Timer: {TIMER}.{note}
Do not edit by hand: rerun the benchmark.
`fp4jax.implementation.auto_prefers_gemm_kernel` reads `MEASURED` (its docstring gives the
rule for shapes that are not in the table).

Example:
  >>> from fp4jax import gemm_table
  >>> sorted({{layout for layout, *_ in gemm_table.MEASURED}})
  ['dgrad', 'fprop', 'wgrad']
"""

DEVICE = {env["device"]!r}
JAX_VERSION = {env["jax"]!r}
DATE = {env["date"]!r}

MEASURED: dict[tuple[str, int, int, int], tuple[float | None, float | None]] = {{
{entries}}}
"""(layout, M, N, K) -> (ms of XLA decode + dot, ms of the Pallas kernel); None where an
implementation does not take the shape."""
'''


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--module", help="also write the fp4jax/gemm_table.py module here")
    p.add_argument("--keep-rows-of", metavar="MODULE",
                   help="a gemm_table.py whose rows this run did not measure are kept in "
                        "--module (re-measure some shapes after a kernel change)")
    p.add_argument("--kernel-rows-of", metavar="MODULE",
                   help="measure only the shapes (of --tokens and --widths) where this "
                        "gemm_table.py picks the kernel: where auto picks XLA it cannot be "
                        "slower than XLA")
    p.add_argument("--within", type=float, default=1.0,
                   help="with --kernel-rows-of: also the rows where the kernel is at most this "
                        "factor slower than XLA (after a kernel change)")
    p.add_argument("--layouts", default="fprop,dgrad,wgrad")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--widths", default=",".join(f"{a}x{b}" for a, b in WIDTHS),
                   help="d_in x d_out pairs, e.g. 2048x8192,8192x8192")
    args = p.parse_args(argv)
    env = environment()
    print(env, flush=True)
    print(f"timer: {TIMER}", flush=True)
    rows = []
    print(f"{'layout':6s} {'M':>6s} {'N':>6s} {'K':>6s} {'xla ms':>9s} {'pallas ms':>9s} "
          f"{'pallas/xla':>10s}", flush=True)
    shapes = [(layout, tokens, d_in, d_out) for layout in args.layouts.split(",")
              for tokens in map(int, args.tokens.split(","))
              for d_in, d_out in (map(int, w.split("x")) for w in args.widths.split(","))]
    if args.kernel_rows_of:
        picked = kernel_rows(args.kernel_rows_of, args.within)
        shapes = [shape for shape in shapes if shape in picked]
    for layout, tokens, d_in, d_out in shapes:
        r = measure(layout, tokens, d_in, d_out, args.iters)
        rows.append(r)
        ratio = (r["pallas_ms"] / r["xla_ms"] if r["pallas_ms"] and r["xla_ms"]
                 else float("nan"))
        print(f"{layout:6s} {r['m']:6d} {r['n']:6d} {r['k']:6d} "
              f"{r['xla_ms'] or float('nan'):9.3f} {r['pallas_ms'] or float('nan'):9.3f}"
              f" {ratio:10.2f}", flush=True)
        _write(args, env, rows)  # after every row: a run cut short keeps what it measured


def _write(args, env: dict, rows: list[dict]) -> None:
    """The JSON of ``rows`` and, with ``--module``, the table module."""
    with open(args.json, "w") as f:
        json.dump({"environment": env, "timer": TIMER, "rows": rows}, f, indent=1)
    if args.module:
        command = "python3 benchmarks/gemm_auto_table.py --json J --module M"
        note = ""
        if args.keep_rows_of:
            old, old_date, old_timer = kept_rows(args.keep_rows_of, rows)
            rows = old + rows
            command += f"\n--tokens {args.tokens} --keep-rows-of {args.keep_rows_of}"
            if args.kernel_rows_of:
                command += f"\n--kernel-rows-of {args.kernel_rows_of}"
                if args.within != 1.0:
                    command += f" --within {args.within}"
            note = (f"\nThe rows this run did not measure are kept from the table of {old_date}"
                    f"\n(timer: {old_timer}).")
        with open(args.module, "w") as f:
            f.write(module_text(rows, env, command, note))


def _table(module_path: str) -> dict:
    scope: dict = {}
    with open(module_path) as f:
        exec(compile(f.read(), module_path, "exec"), scope)  # noqa: S102 - our own module
    return scope


def kernel_rows(module_path: str, within: float = 1.0) -> set[tuple[str, int, int, int]]:
    """(layout, tokens, d_in, d_out) of the rows where the table at ``module_path`` has the
    kernel faster than the XLA path (those ``impl="auto"`` runs on the kernel), or with
    ``within`` > 1 at most that factor slower (rows a faster kernel may flip)."""
    picked = set()
    for (layout, m, n, k), (xla, pallas) in _table(module_path)["MEASURED"].items():
        if pallas is not None and (xla is None or pallas < within * xla):
            tokens, d_in, d_out = {"fprop": (m, k, n), "dgrad": (m, n, k),
                                   "wgrad": (k, m, n)}[layout]
            picked.add((layout, tokens, d_in, d_out))
    return picked


def kept_rows(module_path: str, measured: list[dict]) -> tuple[list[dict], str, str]:
    """The rows of the table module at ``module_path`` whose shapes ``measured`` lacks,
    that table's date and its timer (a table that names none was timed with ``time_fn``,
    calls dispatched from Python)."""
    scope = _table(module_path)
    new = {(r["layout"], r["m"], r["n"], r["k"]) for r in measured}
    timers = [line.removeprefix("Timer: ").rstrip(".")
              for line in (scope.get("__doc__") or "").splitlines() if line.startswith("Timer: ")]
    timer = timers[0] if timers else "time_fn: calls dispatched back to back from Python"
    rows = [{"layout": key[0], "m": key[1], "n": key[2], "k": key[3], "xla_ms": xla,
             "pallas_ms": pallas}
            for key, (xla, pallas) in scope["MEASURED"].items() if key not in new]
    return rows, scope["DATE"], timer


if __name__ == "__main__":
    sys.exit(main())
