"""NVFP4 × NVFP4 GEMM for NVIDIA Hopper (sm_90) in Pallas Mosaic GPU.

Hopper has no FP4 tensor cores, so the kernel emulates the NVFP4 GEMM exactly
(docs/RECIPE.md §9): every 16-element block of packed E2M1 codes is decoded *inside
the kernel* to ``code · s`` in BF16 (exact: E2M1 × E4M3 has at most 6 significant
bits), the BF16 tiles go through ``wgmma`` with FP32 accumulation, and the epilogue
applies ``fl(gds_lhs · gds_rhs)`` and the output cast. No dequantized copy of either
operand is ever written to HBM: the kernel streams the packed 4-bit codes with TMA,
plus one BF16 scale factor per 16-block (``s · 2¹¹⁸``, prepared by XLA in the same
pass that puts the E4M3 scales in the kernel's layout: 5 bits per element in all).

* Decoding (`pallas_kernels.gemm_decode`) is a few integer ops per element on 32-bit
  registers: two codes become one ``bf16x2`` word whose bits are
  ``(c & 7) << 6 | (c & 8) << 12`` per half, the BF16 pattern of ``e2m1(c) · 2⁻¹²⁶``
  (code 1 lands on the subnormal 2⁻¹²⁷). One ``bf16x2`` multiply by the block's
  factor ``s · 2¹¹⁸`` makes each element ``e2m1 · s · 2⁻⁸`` exactly (a native BF16
  multiply keeps subnormal inputs; ``TuningConfig.decode="normal"`` avoids subnormals
  at two more ops per pair); the epilogue multiplies by ``2¹⁶`` (exact) and then by
  ``fl(gds_lhs · gds_rhs)``, so the result equals the reference GEMM up to the order
  of the float32 sums.
* The kernel body (`pallas_kernels.gemm_kernel`) reads both operands in their
  *stored* layout; its tuning is `pallas_kernels.gemm_config`.
* Small M (decode-like shapes) pads M up to one tile (cheap: at most one tile of
  the 4.5-bit lhs) and may split K across CTAs (``k_splits``); the float32 partial
  sums are then added and scaled outside the kernel.

Layouts the three GEMMs of a linear layer need:

========  ====================  ==============================  ===================
GEMM      lhs (stored as)       rhs (stored as)                 call
========  ====================  ==============================  ===================
fprop     X (M, K/2)            W 2D-tiled (K/2, N)             ``matmul(qx, qw)``
dgrad     dY (M, N/2)           W 2D-tiled (K/2, N), as ``W.T`` ``matmul(qg, qw.mT)``
wgrad     x_res (T/2, K)        dY (T/2, N)                     ``matmul(qx.mT, qg,
          as ``x_res.T``                                        lhs_from_mT=True)``
========  ====================  ==============================  ===================

``NVFP4Array.mT`` only transposes the arrays; the wrapper transposes them back to the
stored layout (XLA cancels the two transposes), so nothing is copied. Measured speeds:
docs/BENCHMARKS.md (``python -m pallas_kernels.gemm``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax.numerics import checks, layout, scales
from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.nvfp4_array import NVFP4Array
from pallas_kernels import gemm_decode as dec
from pallas_kernels import gemm_kernel, gemm_pipelined, gemm_skinny, timing
from pallas_kernels.gemm_config import (
    LARGE_CONFIG,
    MAX_PADDED_M,
    PIPELINED_CONFIG,
    SkinnyConfig,
    TuningConfig,
    default_config,
)
from pallas_kernels.gemm_data import layout_operands, stored_operands, views


def _expand_tiles(scales: jax.Array, axis: int, length: int) -> jax.Array:
    """Repeats 2D-tile scales 16× along ``axis`` and trims to ``length``."""
    s = jnp.repeat(scales, BLOCK, axis=axis)
    return lax.slice_in_dim(s, 0, length, axis=axis)


def _config(lhs: NVFP4Array, rhs: NVFP4Array,
            config: TuningConfig | SkinnyConfig | None) -> TuningConfig | SkinnyConfig:
    """``config``, or the default for the operands: the skinny kernel's where it takes
    them (M <= 64, a 16×16-tiled 2D weight or its ``.mT``), else the general kernel's."""
    if config is not None:
        return config
    m, n, k = lhs.shape[-2], rhs.shape[-1], lhs.padded_length
    cfg = default_config(m, n, k, skinny=gemm_skinny.variant_of(rhs) is not None)
    if isinstance(cfg, SkinnyConfig) and gemm_skinny.unsupported(lhs, rhs, cfg) is not None:
        cfg = default_config(m, n, k, skinny=False)
    return cfg


def _unsupported(lhs: NVFP4Array, rhs: NVFP4Array, lhs_from_mT: bool,
                 config: TuningConfig | SkinnyConfig | None) -> str | None:
    """`supports` under ``config`` (None: `default_config`), for valid operands."""
    nd = lhs.ndim
    shapes = f"lhs {lhs.shape} @ rhs {rhs.shape}"
    if lhs.axis != nd - 1:
        return (f"{shapes}: lhs is blocked along M (axis {lhs.axis}); the Pallas kernel needs "
                "the lhs blocked along K — use fp4jax.matmul")
    m, k = lhs.shape[-2:]
    n = rhs.shape[-1]
    if min(m, n, k) == 0:
        return f"{shapes}: empty dimensions are not supported"
    k_pad = lhs.padded_length
    cfg = _config(lhs, rhs, config)
    if isinstance(cfg, SkinnyConfig):
        return gemm_skinny.unsupported(lhs, rhs, cfg)
    if k_pad % (cfg.tile_k * cfg.k_splits):
        return (f"{shapes}: K={k} must be a multiple of tile_k·k_splits = "
                f"{cfg.tile_k}·{cfg.k_splits} = {cfg.tile_k * cfg.k_splits}")
    if n % cfg.cta_tile_n:
        return f"{shapes}: N={n} must be a multiple of the CTA tile width {cfg.cta_tile_n}"
    if m % cfg.cta_tile_m and not (m <= MAX_PADDED_M and not lhs_from_mT):
        return (f"{shapes}: M={m} must be a multiple of the CTA tile height {cfg.cta_tile_m} "
                f"(or at most {MAX_PADDED_M}, with lhs_from_mT=False, to be zero-padded)")
    if rhs.axis == nd - 1 and k % BLOCK:  # 2D-tiled rhs, codes packed along N
        return f"{shapes}: K={k} must be a multiple of 16"
    return None


def supports(lhs: NVFP4Array, rhs: NVFP4Array, *,
             lhs_from_mT: bool = False) -> str | None:
    """Whether `matmul` (default tuning) takes these operands: None, or why not.

    Operands that are no valid NVFP4 GEMM for any implementation raise (see
    `fp4jax.numerics.checks.check_gemm_operands`).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from fp4jax.reference.quantization import quantize
      >>> from pallas_kernels import gemm
      >>> x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
      >>> qx, qm, qw = jax.eval_shape(lambda a: (
      ...     quantize(a), quantize(a, axis=0, block_2d=True), quantize(a.T, axis=0)), x)
      >>> gemm.supports(qx, qw) is None
      True
      >>> "lhs is blocked along M" in gemm.supports(qm, qw)
      True
    """
    checks.check_gemm_operands(lhs, rhs)
    return _unsupported(lhs, rhs, lhs_from_mT, None)


@functools.partial(
    jax.jit,
    static_argnames=("preferred_element_type", "config", "interpret", "lhs_from_mT"),
)
def matmul(
    lhs: NVFP4Array,
    rhs: NVFP4Array,
    *,
    preferred_element_type: Any = jnp.float32,
    lhs_from_mT: bool = False,  # mirrors NVFP4Array.mT
    config: TuningConfig | SkinnyConfig | None = None,
    interpret: bool = False,
    output_scale: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    """NVFP4 GEMM on Hopper: ``lhs (..., M, K) @ rhs (..., K, N)`` with in-kernel decode.

    Same contract and result as the reference GEMM (`reference`, up to the order of
    float32 sums): the operands are decoded to ``code · s`` (exact in BF16), multiplied
    with FP32 accumulation, and the accumulator is scaled by ``fl(gds_lhs · gds_rhs)``
    and cast.

    Supported operand layouts (`supports`; others raise its reason as a `ValueError`):

    * ``lhs`` blocked along K (1D, or 2D tiles). Its codes are read as stored in
      ``lhs.data`` — ``(M, K/2)`` — unless ``lhs_from_mT`` says ``lhs`` is ``q.mT`` of
      a tensor ``q`` stored ``(K/2, M)`` (the wgrad operand ``x_res.mT``); then the
      kernel reads ``q``'s layout directly. Either flag value gives the same result;
      the wrong one only costs XLA a 4-bit transpose.
    * ``rhs`` blocked along K (``(K/2, N)``, fprop/wgrad), or 2D-tiled and blocked
      along N, i.e. ``W.mT`` of a 2D-tiled weight stored ``(K/2, N)`` (dgrad).
    * M, N multiples of the CTA tile, K a multiple of ``tile_k · k_splits``; an M of
      at most 64 is zero-padded to one tile (decode-like shapes).
    * M <= 64 with a 2D lhs and a 16×16-tiled 2D weight (fprop's ``W`` or dgrad's
      ``W.mT``), N a multiple of 256: the skinny kernel (`pallas_kernels.gemm_skinny`,
      a `SkinnyConfig`), chosen by default where it fits.

    Args:
      lhs: ``(..., M, K)`` `NVFP4Array`.
      rhs: ``(..., K, N)`` `NVFP4Array` with the same batch dims.
      preferred_element_type: output dtype (float32, bfloat16 or float16).
      lhs_from_mT: ``lhs`` is ``q.mT`` of a tensor stored with the codes packed along
        its rows (see above).
      config: a `TuningConfig` or `SkinnyConfig`; default `default_config(M, N, K)`.
      interpret: run in Mosaic GPU interpret mode (CPU; for tests).
      output_scale: ``fl(gds_lhs · gds_rhs)`` if the caller has it
        (`fp4jax.numerics.scales.output_scales`); computed from the amaxes otherwise.

    Returns:
      ``(..., M, N)`` array of ``preferred_element_type``.

    Mathematically equivalent to::

      dequantize(lhs) @ dequantize(rhs)   # up to float32 rounding

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from fp4jax.reference.quantization import quantize
      >>> from pallas_kernels import gemm
      >>> x = jax.random.normal(jax.random.key(0), (256, 512))
      >>> w = jax.random.normal(jax.random.key(1), (512, 256))
      >>> qx, qw = quantize(x), quantize(w, axis=0, block_2d=True)
      >>> jax.eval_shape(gemm.matmul, qx, qw).shape  # traces the kernel, runs nothing
      (256, 256)
      >>> qg = quantize(jax.random.normal(jax.random.key(2), (256, 256)))
      >>> jax.eval_shape(gemm.matmul, qg, qw.mT).shape  # the dgrad layout: dY @ W.T
      (256, 512)
      >>> y = gemm.matmul(qx, qw)  # doctest: +SKIP
    """
    checks.check_gemm_operands(lhs, rhs)
    out_dtype = jnp.dtype(preferred_element_type)
    if out_dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(
            f"preferred_element_type must be float32, bfloat16 or float16, got {out_dtype}"
        )
    reason = _unsupported(lhs, rhs, lhs_from_mT, config)
    if reason is not None:
        raise ValueError(reason)
    if output_scale is None:
        output_scale = scales.output_scale(lhs.amax, rhs.amax)
    out_scale = jnp.asarray(output_scale, jnp.float32).reshape(1)
    cfg = _config(lhs, rhs, config)
    if isinstance(cfg, SkinnyConfig):
        return gemm_skinny.matmul(lhs, rhs, out_scale, cfg, out_dtype, interpret)
    nd = lhs.ndim
    batch_shape = lhs.shape[:-2]
    b = math.prod(batch_shape)
    m, k = lhs.shape[-2:]
    n = rhs.shape[-1]
    rhs_cols = rhs.axis == nd - 1  # 2D-tiled, codes packed along N (W.mT in dgrad)
    k_pad = lhs.padded_length
    m_pad = m if m % cfg.cta_tile_m == 0 else cfg.cta_tile_m  # M <= MAX_PADDED_M here
    pipelined = cfg.mainloop == "pipelined"

    # lhs: codes (B, M, K/2) or (B, K/2, M); scales (B, K/16, M).
    lhs_s = lhs.scales
    if lhs.block_2d:
        lhs_s = _expand_tiles(lhs_s, nd - 2, m)
    lhs_s = jnp.swapaxes(lhs_s.reshape(b, m, k_pad // BLOCK), 1, 2)
    lhs_d = lhs.data.reshape(b, m, k_pad // 2)
    if lhs_from_mT:
        lhs_d = jnp.swapaxes(lhs_d, 1, 2)
    elif m_pad != m:
        lhs_d = layout.pad_axis(lhs_d, 1, m_pad)
        lhs_s = layout.pad_axis(lhs_s, 2, m_pad)

    # rhs: codes (B, K/2, N) with scales (B, K/16, N), or (B, N/2, K) with (B, N/16, K).
    if rhs_cols:
        rhs_d = jnp.swapaxes(rhs.data.reshape(b, k, n // 2), 1, 2)
        rhs_s = rhs.scales.reshape(b, -1, n // BLOCK)  # (B, K/16, N/16): 16×16 tiles
        if not pipelined:
            rhs_s = _expand_tiles(jnp.swapaxes(rhs_s, 1, 2), 2, k)
    else:
        rhs_d = rhs.data.reshape(b, k_pad // 2, n)
        rhs_s = rhs.scales
        if rhs.block_2d:
            rhs_s = _expand_tiles(rhs_s, nd - 1, n)
        rhs_s = rhs_s.reshape(b, k_pad // BLOCK, n)

    # Interpret mode decodes to exact e2m1 values (the CPU flushes subnormals).
    subnormal = cfg.decode == "subnormal" and not interpret
    lhs_s = dec.scale_factors(lhs_s, subnormal=subnormal)
    rhs_s = dec.scale_factors(rhs_s, subnormal=subnormal)
    p = gemm_kernel.Problem(b, m_pad, n, k_pad, lhs_from_mT, rhs_cols, out_dtype)
    kernel = gemm_pipelined if pipelined else gemm_kernel
    out = kernel.call_kernel(lhs_d, lhs_s, rhs_d, rhs_s, out_scale, p, cfg, interpret)
    if cfg.k_splits > 1:
        out = (jnp.sum(out, axis=0) * out_scale[0]).astype(out_dtype)
    if m_pad != m:
        out = out[:, :m]
    return out.reshape(*batch_shape, m, n)


def reference(
    lhs: NVFP4Array, rhs: NVFP4Array, *, preferred_element_type: Any = jnp.float32
) -> jax.Array:
    """The pure-XLA NVFP4 GEMM the kernel must match (`fp4jax.reference.gemm.matmul`)."""
    from fp4jax.reference import gemm as reference_gemm  # the spec, imported lazily

    return reference_gemm.matmul(lhs, rhs, preferred_element_type=preferred_element_type)


def _random_bf16(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape, jnp.bfloat16)


def _dense_args(layout_name: str, m: int, n: int, k: int, seed: int):
    """BF16 operands of the same GEMM, stored as the layout stores them, and the dot."""
    if layout_name == "fprop":
        return (_random_bf16((m, k), seed), _random_bf16((k, n), seed + 1)), jnp.dot
    if layout_name == "dgrad":  # W stored (n, k)
        return (_random_bf16((m, k), seed), _random_bf16((n, k), seed + 1)), (
            lambda g, w: jnp.dot(g, w.T))
    if layout_name == "wgrad":  # X stored (k, m)
        return (_random_bf16((k, m), seed), _random_bf16((k, n), seed + 1)), (
            lambda x, g: jnp.dot(x.T, g))
    raise ValueError(layout_name)


def _tflops(m, n, k, seconds):
    return 2 * m * n * k / seconds / 1e12


def _seconds(f, args_list, *, iters: int = 15) -> float:
    """Median seconds per call; cycling distinct inputs defeats the 60 MB L2."""
    return timing.time_fn(f, args_list, warmup=len(args_list), iters=iters, reps=10)


def main(argv: list[str] | None = None) -> None:
    """Benchmarks the kernel vs XLA dequantize+dot vs BF16 ``jnp.dot`` (TFLOP/s).

    ``--layouts`` adds the dgrad and wgrad layouts at 8192³; ``--sweep`` times the
    general kernel's tuning configs (`_sweep_configs`; the skinny kernel's are
    `gemm_skinny_bench`'s ``--sweep``). ``--mainloops`` instead prints
    the mainloop table (`_mainloops`: BF16, XLA, serial and pipelined in the three
    layouts at 4096³ and 8192³, and their bits on exact-sum data), after the sweep if
    both are asked for.
    """
    import sys

    from fp4jax.reference.quantization import quantize  # the operands' spec, lazily

    argv = sys.argv[1:] if argv is None else argv
    dev = jax.devices()[0]
    print(f"{dev.device_kind}, jax {jax.__version__}", flush=True)
    if "--mainloops" in argv:
        if "--sweep" in argv:
            _sweep(quantize)
        _mainloops(quantize)
        return
    xla_ref = jax.jit(reference)
    bf16_dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.bfloat16))
    print(f"{'layout':>6} {'M,N,K':>16} {'pallas':>8} {'xla-deq':>8} {'bf16':>8} "
          f"{'vs bf16':>8} {'vs xla':>7} {'rel.err':>8}  (TFLOP/s)", flush=True)
    rows = [("fprop", 4096, 4096, 4096), ("fprop", 8192, 8192, 8192), ("fprop", 16, 8192, 8192)]
    if "--layouts" in argv:
        rows += [("dgrad", 8192, 8192, 8192), ("wgrad", 8192, 8192, 8192)]
    for layout_name, m, n, k in rows:
        copies = 1 if m * k >= 4096 * 4096 else 4  # rotate inputs that fit in L2
        qargs = [layout_operands(quantize, layout_name, m, n, k, seed=10 * i, data=_random_bf16)
                 for i in range(copies)]
        kw = qargs[0][2]
        ops = [(lhs, rhs) for lhs, rhs, _ in qargs]
        ours = _seconds(functools.partial(matmul, **kw), ops)
        xla = _seconds(xla_ref, ops)
        dense = [(_random_bf16((m, k), 10 * i), _random_bf16((k, n), 10 * i + 1))
                 for i in range(copies)]
        bf16 = _seconds(bf16_dot, dense)
        got, want = matmul(*ops[0], **kw), xla_ref(*ops[0])
        err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
        print(f"{layout_name:>6} {f'{m},{n},{k}':>16} {_tflops(m, n, k, ours):8.1f} "
              f"{_tflops(m, n, k, xla):8.1f} {_tflops(m, n, k, bf16):8.1f} "
              f"{bf16 / ours:8.2f} {xla / ours:7.2f} {err:8.1e}", flush=True)
    if "--sweep" in argv:
        _sweep(quantize)


def _sweep_configs() -> dict[tuple[int, int, int], list]:
    """(M, N, K) -> the tuning configs `_sweep` times there (for choosing the defaults):
    the pipelined mainloop's pipeline depth and decoded buffers at 8192³ and 4096³. (The
    skinny kernel's configs: `gemm_skinny_bench`'s ``--sweep``.)"""
    replace = functools.partial(dataclasses.replace, PIPELINED_CONFIG)
    big = [
        PIPELINED_CONFIG,
        replace(max_concurrent_steps=4),
        replace(decoded_slots=3),
        LARGE_CONFIG,
    ]
    return {(8192, 8192, 8192): big, (4096, 4096, 4096): big}


def _sweep(quantize, interpret: bool = False, shapes=None) -> list[dict]:
    """Times `_sweep_configs` in the fprop layout with the in-program timer
    (`timing.time_in_program`, operand sets rotated past the L2 where they fit in it) and
    prints one line per config as it goes; returns the rows. ``interpret``: a CPU smoke
    run (one call per timing) of ``shapes`` (default: all)."""
    rows = []
    for (m, n, k), cfgs in _sweep_configs().items():
        if shapes is not None and (m, n, k) not in shapes:
            continue
        copies = 1 if interpret else timing.sets_to_defeat_l2((m * k + k * n) * 9 // 16)
        ops = [layout_operands(quantize, "fprop", m, n, k, seed=10 * i, data=_random_bf16)[:2]
               for i in range(copies)]
        for cfg in cfgs:
            f = functools.partial(matmul, config=cfg, interpret=interpret)
            try:
                if interpret:
                    t = timing.time_in_program(f, ops, calls_per_program=1, iters=1, warmup=0)
                else:
                    t = timing.time_in_program(f, ops, calls_per_program=8, iters=5)
                rows.append({"mnk": (m, n, k), "config": repr(cfg), "ms": 1e3 * t})
                print(f"sweep {m},{n},{k}: {1e3 * t:8.4f} ms {_tflops(m, n, k, t):7.1f} TFLOP/s"
                      f"  {cfg}", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on (e.g. SMEM overflow)
                print(f"sweep {m},{n},{k}: failed {type(e).__name__}: {str(e)[:200]}  {cfg}",
                      flush=True)
    for mnk in dict.fromkeys(r["mnk"] for r in rows):
        first, *_ = (r for r in rows if r["mnk"] == mnk)  # the shape's default config
        best = min((r for r in rows if r["mnk"] == mnk), key=lambda r: r["ms"])
        print(f"sweep best at {mnk}: {best['ms']:.4f} ms ({first['ms'] / best['ms']:.2f}x the "
              f"first config's {first['ms']:.4f}): {best['config']}", flush=True)
    return rows


def _kernel_on_stored(matmul_fn, layout: str, cfg, lhs, rhs):
    """``matmul_fn`` (BF16 output, ``cfg``) of the stored operands, the layout's views and
    their kwargs taken here (inside the caller's program)."""
    a, b, kw = views(layout, lhs, rhs)
    return matmul_fn(a, b, config=cfg, preferred_element_type=jnp.bfloat16, **kw)


def _mainloops(quantize, sizes=(4096, 8192), exact_mnk=(1024, 1024, 512),
               interpret: bool = False) -> None:
    """Times BF16 ``jnp.dot`` (the same layout's transposes), the XLA path (decode +
    dot), the serial mainloop (`LARGE_CONFIG`) and the pipelined one (`PIPELINED_CONFIG`,
    the default where it divides the problem) at ``sizes``³ in the fprop, dgrad and wgrad
    layouts, all with BF16 output; checks both mainloops bit for bit against the XLA
    path on exact-sum data (``exact_mnk``, every layout); prints the table last.
    ``interpret``: a CPU smoke run of the same code (one call per timing)."""
    def seconds(f, args_list):  # one call in a smoke run
        if interpret:
            return timing.time_fn(f, args_list, warmup=0, iters=1, reps=1)
        return timing.time_fn(f, args_list, warmup=len(args_list), iters=15, reps=10)

    bf16 = jnp.bfloat16
    matmul_ = functools.partial(matmul, interpret=interpret)
    xla_ref = jax.jit(functools.partial(reference, preferred_element_type=bf16))
    kernels = {"serial": LARGE_CONFIG, "pipelined": PIPELINED_CONFIG}
    rows, bits = [], []
    for size in sizes:
        for layout_name in ("fprop", "dgrad", "wgrad"):
            m = n = k = size
            # The stored operands; each timed program takes the layout's views itself, as
            # the training step does (a view made outside is a transposed copy).
            ops = stored_operands(quantize, layout_name, m, n, k, seed=size, data=_random_bf16)
            dense, dot = _dense_args(layout_name, m, n, k, seed=size)
            xla_in_step = jax.jit(lambda a, b, lay=layout_name: xla_ref(*views(lay, a, b)[:2]))
            times = {"bf16": seconds(jax.jit(lambda a, b, d=dot: d(a, b).astype(bf16)),
                                      [dense]),
                     "xla": seconds(xla_in_step, [ops])}
            want = xla_in_step(*ops)
            errs = {}
            for name, cfg in kernels.items():
                f = jax.jit(functools.partial(_kernel_on_stored, matmul_, layout_name, cfg))
                try:
                    times[name] = seconds(f, [ops])
                    got = f(*ops).astype(jnp.float32)
                    errs[name] = float(jnp.linalg.norm(got - want.astype(jnp.float32))
                                       / jnp.linalg.norm(want.astype(jnp.float32)))
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"{layout_name} {size}: {name} failed {type(e).__name__}: "
                          f"{str(e)[:300]}", flush=True)
                    times[name], errs[name] = float("nan"), float("nan")
            print(f"{layout_name} {size}³ ms: " + ", ".join(
                f"{key} {1e3 * t:.3f}" for key, t in times.items())
                + f"; rel.err vs XLA {errs}", flush=True)
            rows.append((layout_name, size, times))
    for layout_name in ("fprop", "dgrad", "wgrad"):
        *ops, kw = layout_operands(quantize, layout_name, *exact_mnk, seed=7)
        want = np.asarray(xla_ref(*ops)).view(np.uint16)
        for name, cfg in kernels.items():
            try:
                got = matmul_(*ops, config=cfg, preferred_element_type=bf16, **kw)
                bits.append((layout_name, name, bool(np.array_equal(
                    np.asarray(got).view(np.uint16), want))))
            except Exception as e:  # noqa: BLE001 - report and go on
                bits.append((layout_name, name, f"failed {type(e).__name__}"))
    print(f"\nMainloops, {jax.devices()[0].device_kind}, jax {jax.__version__}, BF16 output; "
          "TFLOP/s (x BF16 jnp.dot of the same run)", flush=True)
    print(f"{'layout':>6} {'M=N=K':>6} {'bf16':>7} {'xla':>13} {'serial':>13} "
          f"{'pipelined':>13} {'pipe/serial':>11}")
    for layout_name, size, t in rows:
        tf = {key: _tflops(size, size, size, v) for key, v in t.items()}
        cells = " ".join(f"{tf[key]:7.1f} ({t['bf16'] / t[key]:4.2f})"
                         for key in ("xla", "serial", "pipelined"))
        print(f"{layout_name:>6} {size:>6} {tf['bf16']:7.1f} {cells} "
              f"{t['serial'] / t['pipelined']:11.2f}")
    print(f"bits on exact-sum data ({'×'.join(map(str, exact_mnk))}) vs the XLA path: " + ", ".join(
        f"{layout_name} {name} {ok}" for layout_name, name, ok in bits), flush=True)


if __name__ == "__main__":
    main()
