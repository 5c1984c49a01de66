"""Benchmark of the skinny NVFP4 GEMM on decode-like shapes: one command, one table.

``python -m pallas_kernels.gemm_skinny_bench [--sweep]`` times, for M in 1, 16, 64, 128
and N = K = 8192 and 2048 (fprop: X rowwise @ W in 16×16 tiles; BF16 output), and for
M <= 64 at N = K = 8192 in the dgrad layout (dY rowwise @ W.mT):

* BF16 ``jnp.dot`` on BF16 operands of the same shapes,
* the XLA path (decode to BF16 + ``lax.dot_general``, `pallas_kernels.gemm.reference`),
* the general kernel (`pallas_kernels.gemm_kernel`, M padded to 64, its skinny tuning),
* the skinny kernel (`pallas_kernels.gemm_skinny`, the default for M <= 64) as called
  (activation decode and split-K sum included) and the kernel launch alone,
* the byte floor: weight codes + tile scales + activations + output at the HBM copy
  bandwidth measured in the same run (`pallas_kernels.timing.copy_seconds`),

every time per call inside one compiled program (`pallas_kernels.timing.time_in_program`:
the slope of 16 and 32 calls, so the host's dispatch of a call, longer than these calls,
is not in it), cycling enough weight copies to defeat the L2.
It then checks the skinny kernel bit for bit against the XLA path on exact-sum data
and, with ``--sweep``, times a few `SkinnyConfig` variants (fprop M = 16 and 64, dgrad
M = 16).
"""

from __future__ import annotations

import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import gemm, gemm_skinny, timing
from pallas_kernels.gemm_config import SkinnyConfig, default_config
from pallas_kernels.gemm_data import layout_operands, views

_CALLS = 16  # per program; the slope of _CALLS and 2 * _CALLS calls is the time per call
TIMER = (f"timer: pallas_kernels.timing.time_in_program (per call, inside one program: "
         f"the slope of {_CALLS} and {2 * _CALLS} calls; host dispatch excluded)")


def _seconds(f, args_list, quick: bool = False) -> float:
    if quick:  # a smoke run: programs of one and two calls, run once
        return timing.time_in_program(f, args_list, calls_per_program=1, iters=1, warmup=0)
    return timing.time_in_program(f, args_list, calls_per_program=_CALLS, iters=10, warmup=1)


def _floor_bytes(m: int, n: int, k: int) -> int:
    """Bytes the GEMM must move: W codes and tile scales, X codes and scales, BF16 output."""
    return k * n // 2 + (k // 16) * (n // 16) + m * k // 2 + m * k // 16 + 2 * m * n


def _kernel_only(ops, cfg, interpret):
    """The skinny kernel's launch alone on prepared operands (no XLA passes): the function
    and its argument sets, one per (lhs, rhs) of ``ops``."""
    prepared = [gemm_skinny.operands(lhs, rhs, jnp.bfloat16) for lhs, rhs in ops]
    p = prepared[0][1]
    f = jax.jit(lambda *a: gemm_skinny.call_kernel(*a, p, cfg, interpret))
    return f, [(*args, jnp.ones((1,), jnp.float32)) for args, _ in prepared]


def _measure(row: dict, key, fn, *args) -> None:
    """``row[key] = fn(*args)``, or the error, printed, so one failure does not end the run."""
    try:
        row[key] = fn(*args)
    except Exception as e:  # noqa: BLE001 - report and go on
        row[key] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"  {key} failed: {row[key]}", flush=True)


def _ms(f, args_list, quick: bool) -> float:
    return _seconds(f, args_list, quick) * 1e3


def _rel_err(f, reference, args) -> float:
    got, want = f(*args).astype(jnp.float32), reference(*args).astype(jnp.float32)
    return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))


def _bitwise(f, reference, args) -> bool:
    return bool(np.array_equal(np.asarray(f(*args)).view(np.uint32),
                               np.asarray(reference(*args)).view(np.uint32)))


def _print_table(rows: list[dict]) -> None:
    def cell(r, key, fmt="7.4f"):
        v = r.get(key)
        return f"{v:{fmt}}" if isinstance(v, float) else f"{'-' if v is None else 'err':>7}"

    print(f"\n{'layout':>6} {'M x N x K':>16} {'bf16':>7} {'xla':>7} {'old':>7} {'new':>7} "
          f"{'kernel':>7} {'floor':>7} {'x bf16':>7} {'rel.err':>8}   (ms; x bf16 = bf16/new)")
    for r in rows:
        ratio = (r["bf16_ms"] / r["new_ms"]
                 if all(isinstance(r.get(k), float) for k in ("bf16_ms", "new_ms")) else None)
        print(f"{r['layout']:>6} {r['m']:>5} x {r['n']} x {r['k']:<4} " + " ".join(
            cell(r, k) for k in ("bf16_ms", "xla_ms", "old_ms", "new_ms", "kernel_ms",
                                 "floor_ms"))
            + f" {cell({'x': ratio}, 'x', '7.2f')} {cell(r, 'rel_err', '8.1e')}")


def _row(layout, m, nk, x16, w16, qx, qw, bw, interpret) -> dict:
    """One table row: every implementation of one (layout, M, N = K = nk) GEMM."""
    q = interpret
    dgrad = layout == "dgrad"
    bf16_dot = jax.jit(lambda a, b: jnp.dot(a, b.T if dgrad else b,
                                            preferred_element_type=jnp.bfloat16))

    xla = _as_in_step(layout, functools.partial(gemm.reference,
                                                preferred_element_type=jnp.bfloat16))
    ours = functools.partial(gemm.matmul, preferred_element_type=jnp.bfloat16,
                             interpret=interpret)
    ops = list(zip(qx, qw, strict=True))
    row = {"layout": layout, "m": m, "n": nk, "k": nk,
           "floor_ms": _floor_bytes(m, nk, nk) / bw * 1e3}
    old = _as_in_step(layout, functools.partial(
        ours, config=default_config(m, nk, nk, skinny=False)))
    cfg = default_config(m, nk, nk)
    _measure(row, "bf16_ms", _ms, bf16_dot, list(zip(x16, w16, strict=True)), q)
    _measure(row, "xla_ms", _ms, xla, ops, q)
    _measure(row, "old_ms", _ms, old, ops, q)
    if isinstance(cfg, SkinnyConfig):
        _measure(row, "new_ms", _ms, _as_in_step(layout, ours), ops, q)
        kernel, args_list = _kernel_only([views(layout, x, w)[:2] for x, w in ops], cfg,
                                         interpret)
        _measure(row, "kernel_ms", _ms, kernel, args_list, q)
        _measure(row, "rel_err", _rel_err, _as_in_step(layout, ours), xla, ops[0])
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None, *, sizes=(8192, 2048), ms=(1, 16, 64, 128),
         interpret: bool = False) -> list[dict]:
    """Prints the table (and the sweep with ``--sweep``); returns its rows.

    ``sizes`` (N = K), ``ms`` and ``interpret`` (Mosaic GPU interpret mode) let a CPU
    run the same code on small shapes (a smoke test; its times mean nothing). Run it
    with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (as
    tests/kernels/test_gemm.py does): with one host device, the interpreted general
    kernel hung at times on a 2-core host (jax 0.11.2).
    """
    from fp4jax.reference.quantization import quantize  # the operands' spec, lazily

    argv = sys.argv[1:] if argv is None else argv
    env = timing.environment()
    print(f"{env['device']}, jax {env['jax']}, {env['date']}", flush=True)
    print(TIMER + ("; this smoke run: 1 and 2 calls, once" if interpret else ""), flush=True)
    big = jnp.zeros((64, 1024) if interpret else (8192, 16384), jnp.bfloat16)
    bw = 2 * big.nbytes / timing.copy_seconds(big, warmup=2, iters=10, reps=10)
    del big
    print(f"HBM copy bandwidth (XLA x+1): {bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for nk in sizes:
        copies = 2 if interpret else timing.sets_to_defeat_l2(nk * nk // 2)
        keys = jax.random.split(jax.random.key(nk), copies)
        w16 = [jax.random.normal(kk, (nk, nk), jnp.bfloat16) for kk in keys]
        qw = [quantize(w, axis=0, block_2d=True) for w in w16]
        for layout in ("fprop", "dgrad") if nk == sizes[0] else ("fprop",):
            for m in ms if layout == "fprop" else [m for m in ms if m <= 64]:
                x16 = [jax.random.normal(jax.random.key(m + i), (m, nk), jnp.bfloat16)
                       for i in range(copies)]
                qx = [quantize(x) for x in x16]
                rows.append(_row(layout, m, nk, x16, w16, qx, qw, bw, interpret))
        del w16, qw
    exact = {}
    for layout in ("fprop", "dgrad"):
        for m in [m for m in ms if m <= 64]:
            lhs, rhs, _ = layout_operands(quantize, layout, m, 1024 // (4 if interpret else 1),
                                          512, seed=m)
            _measure(exact, (layout, m), _bitwise,
                     functools.partial(gemm.matmul, interpret=interpret),
                     jax.jit(gemm.reference), (lhs, rhs))
    print(f"\nbitwise == XLA path on exact-sum data (M x 1024 x 512, float32): {exact}")
    _print_table(rows)
    if "--sweep" in argv:
        _sweep(quantize, sizes[0], interpret)
    return rows


def _as_in_step(layout: str, f):
    """``f`` jitted on the stored operands, the layout's view of the weight taken inside
    the program (`gemm_data.views`), as in the training step."""
    return jax.jit(lambda x, w: f(*views(layout, x, w)[:2]))


def _sweep(quantize, nk: int = 8192, interpret: bool = False, *,
           variants: list[SkinnyConfig] | None = None,
           cases=(("fprop", 16), ("fprop", 64), ("dgrad", 16)), repeats: int = 1) -> None:
    """Times `SkinnyConfig` variants at N = K = ``nk`` for each (layout, M) of ``cases``.

    ``variants`` default to the default config at M = 16 and a few changes of it;
    ``repeats`` > 1 times the whole list again (an A/B in alternating order, so a drift
    of the GPU's clocks over the run does not favour the configs timed later).
    """
    if variants is None:
        base = default_config(16, nk, nk)
        variants = [base] + [dataclasses.replace(base, **kw) for kw in (
            {"k_splits": 2 * base.k_splits}, {"k_splits": max(1, base.k_splits // 2)},
            {"max_concurrent_steps": 4}, {"max_concurrent_steps": 8},
            {"tile_k": 256, "max_concurrent_steps": 4},
            {"tile_k": 256, "k_splits": max(1, base.k_splits // 2), "max_concurrent_steps": 3},
            {"k_substeps": 2}, {"tile_k": 256, "k_substeps": 2, "max_concurrent_steps": 4})]
        variants = list(dict.fromkeys(variants))  # distinct, in order
    copies = 2 if interpret else timing.sets_to_defeat_l2(nk * nk // 2)
    qw = [quantize(jax.random.normal(jax.random.key(i), (nk, nk), jnp.bfloat16),
                   axis=0, block_2d=True) for i in range(copies)]
    print(f"\nsweep (N = K = {nk}, BF16 output, ms per call):", flush=True)
    for layout, m in cases:
        ops = [(quantize(jax.random.normal(jax.random.key(100 + i), (m, nk))), w)
               for i, w in enumerate(qw)]
        for cfg in variants * repeats:
            f = _as_in_step(layout, functools.partial(
                gemm.matmul, config=cfg, preferred_element_type=jnp.bfloat16,
                interpret=interpret))
            row: dict = {}
            _measure(row, "ms", _ms, f, ops, interpret)
            t = row["ms"]
            print(f"  {layout} M={m:>3} {t:8.4f}  {cfg}" if isinstance(t, float) else
                  f"  {layout} M={m:>3} failed  {cfg}", flush=True)


if __name__ == "__main__":
    main()
