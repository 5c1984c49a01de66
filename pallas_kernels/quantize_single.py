"""Fused NVFP4 quantize of one tensor for Hopper (H200, sm_90) in Pallas Mosaic GPU.

One read of a BF16/FP16 tensor ``x`` gives packed E2M1 codes and E4M3 block scales
with exactly the reference's numerics and output layout
(`fp4jax.reference.quantization.quantize`): round-to-nearest-even or stochastic
rounding (the reference's counter-based bits: 8 per element, one 32-bit hash per 4
elements), optional 16×16 random Hadamard transform along the quantized axis, 1D
(1×16) or 2D (16×16) blocks. The global amax is either
passed in or computed by a separate reduction kernel (`pallas_kernels.amax`: one extra
read of ``x``; the quantize kernel needs the global scale before its first block), or,
unrotated and for a small input, by XLA (`pallas_kernels.amax.plain_amax`).

The kernel body is `pallas_kernels.quantize_engines` (rowwise engine for blocks along
the last axis, columnwise engine for blocks along the second-to-last), its numerics
`pallas_kernels.bit_tricks`, its TMA pipeline `pallas_kernels.tma_pipeline`. The kernel
does not divide in float32 (the GPU's division is not correctly rounded): the block
encode scales come from 8 correctly rounded reciprocals per tensor
(`bit_tricks.encode_scale`).

Shape support (`supports`; the wrapper raises its reason as a `ValueError`): 2D
``(M, K)`` or batched ``(..., M, K)`` inputs, bfloat16 or float16; quantized axis the
last or second-to-last; ``K % 128 == 0``; ``M % 16 == 0`` (rowwise, 1D or 2D blocks) or
``M % 64 == 0`` (columnwise); the RHT along the last axis needs a 2D input with
``M % 128 == 0`` and ``K % 64 == 0``. float32 inputs are not taken (the packed
two-elements-per-word trick needs 16-bit elements). A Hadamard transform along the last
(contiguous) axis is computed by the columnwise engine on ``x.T`` (an XLA transpose,
with the SR block numbers remapped to ``x``'s), because the butterfly needs each element
of a contiguous 16-run in its own register array.

Measured speeds: docs/BENCHMARKS.md (``python -m pallas_kernels.quantize_single``).

Example:
  >>> import jax, jax.numpy as jnp
  >>> from pallas_kernels import quantize_single
  >>> x = jax.random.normal(jax.random.key(0), (64, 128), jnp.bfloat16)
  >>> q = quantize_single.quantize(x, interpret=True)  # interpret=True runs on CPU
  >>> r = quantize_single.reference(x)
  >>> bool((q.data == r.data).all() and (q.scales == r.scales).all())
  True
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fp4jax.numerics import checks, layout
from fp4jax.numerics import hadamard as hadamard_lib
from fp4jax.numerics.nvfp4_array import NVFP4Array
from fp4jax.numerics.rounding import Rounding
from pallas_kernels import amax as amax_pass
from pallas_kernels import bit_tricks as bits
from pallas_kernels import quantize_engines as engines
from pallas_kernels import scale_kernels, timing
from pallas_kernels import tma_pipeline as tp


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizeConfig:
    """Tuning knobs of the quantize kernels (all static).

    Attributes:
      block_rows: rows of ``x`` per tile (rounded down to what divides M; a multiple
        of 16 for rowwise-only kernels, of 64 when a columnwise output is produced).
      block_cols: columns of ``x`` per tile (a multiple of 128 dividing K), or 64: narrow
        64 × 64 tiles with 32 elements per thread instead of 64 (`tma_pipeline.engine_layouts`;
        then ``block_rows`` must be a multiple of 64, and an ``M`` that is not falls back
        to 128-column tiles).
      stages: TMA loads in flight per CTA (SMEM holds ``stages`` input tiles).
      ctas_per_sm: CTAs launched per SM (persistent grid of ``ctas_per_sm * SMs``).
      num_ctas: explicit grid size (overrides ``ctas_per_sm``); None derives it.
      amax_block_rows / amax_block_cols / amax_stages: tiling of the amax pass.
      xla_amax_elements: a plain (not rotated) global amax of an input of at most this
        many elements is reduced by XLA instead of the amax kernel (0: always the kernel);
        see `pallas_kernels.amax.plain_amax`.
    """

    block_rows: int = 16
    block_cols: int = 512
    stages: int = 4
    ctas_per_sm: int = 4
    num_ctas: int | None = None
    amax_block_rows: int = 64
    amax_block_cols: int = 256
    amax_stages: int = 3
    xla_amax_elements: int = 1 << 22

    def __post_init__(self):
        for name in ("block_rows", "block_cols", "stages", "ctas_per_sm",
                     "amax_block_rows", "amax_block_cols", "amax_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"QuantizeConfig.{name} must be a positive int, got {v!r}")
        narrow = self.block_cols == tp.NARROW_COLS
        if self.block_rows % (64 if narrow else 16) or (self.block_cols % 128 and not narrow):
            raise ValueError(
                f"QuantizeConfig block ({self.block_rows}, {self.block_cols}) must be a "
                f"multiple of (16, 128), or (a multiple of 64, {tp.NARROW_COLS})"
            )
        if self.amax_block_rows % 64 or self.amax_block_cols % 128:
            raise ValueError(
                f"QuantizeConfig amax block ({self.amax_block_rows}, {self.amax_block_cols}) "
                "must be a multiple of (64, 128)"
            )
        if not isinstance(self.xla_amax_elements, int) or self.xla_amax_elements < 0:
            raise ValueError("QuantizeConfig.xla_amax_elements must be an int >= 0, got "
                             f"{self.xla_amax_elements!r}")
        if self.num_ctas is not None and (not isinstance(self.num_ctas, int) or self.num_ctas < 1):
            raise ValueError(f"QuantizeConfig.num_ctas must be None or >= 1, got {self.num_ctas!r}")

    @property
    def label(self) -> str:
        """Short name for benchmark tables, e.g. ``[16x512 s4 c4]``."""
        return f"[{self.block_rows}x{self.block_cols} s{self.stages} c{self.ctas_per_sm}]"


DEFAULT_CONFIG = QuantizeConfig()
"""Fastest measured on the H200 for the rowwise engine: 16x512 tiles, 4 stages, 4 CTAs/SM."""

COLUMNWISE_CONFIG = QuantizeConfig(block_rows=64, block_cols=128, stages=3, ctas_per_sm=2)
"""Fastest measured for the columnwise engine alone: 64x128 tiles, 3 stages, 2 CTAs/SM."""

TWO_OUTPUT_CONFIG = QuantizeConfig(block_rows=64, block_cols=64, stages=2, ctas_per_sm=8)
"""Fastest measured for the two-output kernels: narrow 64x64 tiles (32 elements per
thread), 2 stages, 8 persistent CTAs per SM. On the H200 at 32768 x 2048 / 5504
(docs/BENCHMARKS.md) the stochastic-rounding launch takes 7% less time than with 64x128
tiles at 2 CTAs/SM and the round-to-nearest one 12-14% less: the narrow tiles' fewer
registers per thread (123-206 instead of 176-255) let more warps run, until the ALU pipe
saturates (83-85% busy at this grid, Nsight Compute). Of the grids swept (3-8 CTAs per
SM, 2-4 stages), 8 CTAs with 2 stages was fastest for SR with the amax pass: 3% less time
than 4 CTAs with 3 stages at K = 2048 and 6% less at K = 5504; round-to-nearest changed
by under 3%."""


def supports(shape: Sequence[int], dtype: Any, *, axis: int, block_2d: bool,
             hadamard: bool) -> str | None:
    """Whether `quantize` takes this input: None, or why not (one line).

    An out-of-range ``axis`` is a bad argument for every implementation and raises.

    Example:
      >>> import jax.numpy as jnp
      >>> supports((64, 128), jnp.bfloat16, axis=-1, block_2d=False, hadamard=False) is None
      True
      >>> supports((64, 128), jnp.float32, axis=-1, block_2d=False, hadamard=False)[:45]
      'quantize: the Pallas quantize kernel takes bf'
    """
    del block_2d  # 1D and 2D blocks take the same shapes
    shape = tuple(shape)
    nd = len(shape)
    if nd < 2:
        return f"the Pallas quantize kernel needs a rank >= 2 array, got shape {shape}"
    ax = layout.normalize_axis(axis, nd)
    if ax not in (nd - 1, nd - 2):
        return (f"the Pallas quantize kernel quantizes along one of the last two axes; got "
                f"axis={axis} for shape {shape}")
    if ax == nd - 1 and hadamard:
        reason = engines.dtype_reason(shape, dtype, "quantize")
        if reason is not None:
            return reason
        if nd != 2 or shape[0] % 128 or shape[1] % 64:
            return ("quantize(hadamard=True) along the last axis needs a 2D input (M, K) with "
                    f"M % 128 == 0 and K % 64 == 0 (it runs on x.T); got shape {shape}")
        return None
    return engines.input_reason(shape, dtype, "quantize", 16 if ax == nd - 1 else 64)


@functools.partial(
    jax.jit,
    static_argnames=("axis", "block_2d", "rounding", "hadamard", "hadamard_signs", "config",
                     "interpret"),
)
def _quantize_jit(x, key, amax, *, axis, block_2d, rounding, hadamard, hadamard_signs, config,
                  interpret):
    lead = x.shape[:-2]
    m, k = x.shape[-2:]
    x2 = x.reshape(-1, k)
    rows = x2.shape[0]
    stochastic = rounding == "stochastic"
    signs = hadamard_signs
    transposed = axis == x.ndim - 1 and hadamard
    if transposed:
        # Hadamard along the contiguous axis: columnwise engine on x^T. Its 16-row group g
        # is x's 16-column block and its column c is x's row: block c * K/16 + g of x.
        xk = x2.T
        out = tp.OutputSpec(stochastic=stochastic, hadamard=True, signs=signs,
                            block_strides=(1, k // 16), poison=amax is not None)
    elif axis == x.ndim - 1:  # rowwise engine: block (row r, column block j) is r * K/16 + j
        xk = x2
        out = tp.OutputSpec(stochastic=stochastic, block_2d=block_2d,
                            block_strides=(k // 16, 1), poison=amax is not None)
    else:  # columnwise engine: block (16-row group g, column c) is g * K + c
        xk = x2
        out = tp.OutputSpec(stochastic=stochastic, block_2d=block_2d, hadamard=hadamard,
                            signs=signs, block_strides=(k, 1), poison=amax is not None)
    is_col = transposed or axis != x.ndim - 1

    def computed():
        if out.hadamard:
            return amax_pass.run_amax(xk, True, signs, config, interpret)[1]
        return amax_pass.plain_amax(xk, config, interpret)

    stored, amax_x = amax_pass.scales_from(
        amax, computed, lambda: amax_pass.finite_amax_xla(xk, out.hadamard, signs, 0))
    # One output's parameters in both the rowwise and the columnwise engine's slot.
    fp = scale_kernels.scale_params([amax_x, amax_x], interpret=interpret)
    up = jnp.concatenate([bits.sr_key_words(key), bits.sr_key_words(key)])
    (codes, scales), flags = engines.run_quantize(
        xk, None if is_col else out, out if is_col else None, fp, up, config, interpret)
    amax_out = stored(flags[1] if is_col else flags[0])
    if transposed:
        return (tp.as_bytes(codes, k // 2, rows).T, tp.as_bytes(scales, k // 16, rows).T,
                amax_out)
    if not is_col:
        data = codes.reshape(*lead, m, k // 2)
        scales = (scales.reshape(*lead, m // 16, k // 16) if block_2d
                  else scales.reshape(*lead, m, k // 16))
        return data, scales, amax_out
    data = tp.as_bytes(codes, rows // 2, k).reshape(*lead, m // 2, k)
    if block_2d:
        scales = scales.reshape(*lead, m // 16, k // 16)
    else:
        scales = tp.as_bytes(scales, rows // 16, k).reshape(*lead, m // 16, k)
    return data, scales, amax_out


def quantize(
    x: jax.typing.ArrayLike,
    *,
    axis: int = -1,
    block_2d: bool = False,
    rounding: Rounding = "nearest",
    key: jax.Array | None = None,
    hadamard: bool = False,
    hadamard_signs: Sequence[int] | None = None,
    amax: jax.typing.ArrayLike | None = None,
    config: QuantizeConfig | None = None,
    interpret: bool = False,
) -> NVFP4Array:
    """Quantizes ``x`` to NVFP4 with the fused Mosaic GPU kernel.

    Same semantics, output layout and bits as the reference quantize (including
    stochastic rounding: the same counter-based bits), for the shapes `supports` accepts;
    a `ValueError` carrying its reason otherwise.

    Args:
      x: bfloat16/float16 array ``(..., M, K)``.
      axis: the block axis: the last or the second-to-last.
      block_2d: one scale per 16×16 tile (weights).
      rounding: ``"nearest"`` or ``"stochastic"`` (needs ``key``).
      key: a ``jax.random`` key for stochastic rounding.
      hadamard: apply the 16×16 RHT along ``axis`` first (amax after the transform).
      hadamard_signs: RHT sign vector (default `fp4jax.numerics.hadamard.DEFAULT_SIGNS`).
      amax: precomputed global amax (skips the reduction pass).
      config: tuning (`QuantizeConfig`); None uses `DEFAULT_CONFIG` for the rowwise
        engine and `COLUMNWISE_CONFIG` for the columnwise one.
      interpret: run in Mosaic GPU interpret mode (CPU, slow; for tests).

    Returns:
      An `NVFP4Array`.

    Mathematically equivalent to::

      reference(x, axis=axis, block_2d=block_2d, rounding=rounding, key=key,
                hadamard=hadamard, hadamard_signs=hadamard_signs, amax=amax)

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from pallas_kernels import quantize_single
      >>> x = jax.random.normal(jax.random.key(1), (64, 128), jnp.bfloat16)
      >>> q = quantize_single.quantize(x, axis=0, hadamard=True, interpret=True)
      >>> r = quantize_single.reference(x, axis=0, hadamard=True)
      >>> bool((q.data == r.data).all()), q.scales.shape
      (True, (4, 128))
    """
    x = jnp.asarray(x)
    checks.check_input_dtype(x.dtype, "x")
    checks.check_quantize_options(rounding=rounding, key=key, hadamard=hadamard,
                                  block_2d=block_2d, hadamard_signs=hadamard_signs)
    reason = supports(x.shape, x.dtype, axis=axis, block_2d=block_2d, hadamard=hadamard)
    if reason is None and rounding == "stochastic":
        reason = engines.sr_reason(x.shape)
    if reason is not None:
        raise ValueError(reason)
    ax = layout.normalize_axis(axis, x.ndim)
    signs = hadamard_lib.check_signs(hadamard_signs)
    amax = checks.check_amax(amax)
    if config is None:
        config = DEFAULT_CONFIG if (ax == x.ndim - 1 and not hadamard) else COLUMNWISE_CONFIG
    data, scales, amax_out = _quantize_jit(
        x, key, amax, axis=ax, block_2d=bool(block_2d), rounding=rounding,
        hadamard=bool(hadamard), hadamard_signs=signs, config=config, interpret=bool(interpret))
    return NVFP4Array(
        data=data,
        scales=lax.bitcast_convert_type(scales, jnp.float8_e4m3fn),
        amax=amax_out,
        shape=tuple(x.shape),
        dtype=x.dtype,
        axis=ax,
        block_2d=bool(block_2d),
        hadamard=bool(hadamard),
    )


def reference(
    x: jax.typing.ArrayLike,
    *,
    axis: int = -1,
    block_2d: bool = False,
    rounding: Rounding = "nearest",
    key: jax.Array | None = None,
    hadamard: bool = False,
    hadamard_signs: Sequence[int] | None = None,
    amax: jax.typing.ArrayLike | None = None,
) -> NVFP4Array:
    """The pure-JAX reference quantize: the spec `quantize` matches bit for bit.

    Example:
      >>> import jax.numpy as jnp
      >>> from pallas_kernels import quantize_single
      >>> quantize_single.reference(jnp.ones((16, 16), jnp.bfloat16)).data.shape
      (16, 8)
    """
    from fp4jax.reference import quantization  # the spec, imported lazily

    return quantization.quantize(x, axis=axis, block_2d=block_2d, rounding=rounding, key=key,
                                 hadamard=hadamard, hadamard_signs=hadamard_signs, amax=amax)


def main(m: int = 8192, k: int = 8192, configs: Sequence[QuantizeConfig] | None = None, *,
         reps: int = 15, interpret: bool = False) -> list[dict]:
    """Benchmarks `quantize` (BF16 ``(m, k)``, 1D RNE and SR) on the default device; prints a
    table.

    Against the XLA reference (``jax.jit(reference)``) and the HBM copy bandwidth
    measured in the same run. Bytes counted: input read + codes/scales written (the amax
    pass's extra read is not counted, so "amax pass" rows show the end-to-end cost
    against the same byte count). Each kernel row is checked bit for bit against the XLA
    reference on the same device.
    """
    from fp4jax.reference import quantization  # the spec to compare with, lazily

    sweep = timing.Sweep(timing.sweep_input(m, k), reps=reps, interpret=interpret)
    x, add = sweep.x, sweep.add

    ref_1d = jax.jit(lambda a: quantization.quantize(a))
    key = jax.random.key(4)
    ref_sr = jax.jit(lambda a: quantization.quantize(a, rounding="stochastic", key=key))
    r1 = ref_1d(x)
    out1 = timing.nbytes((r1.data, r1.scales))
    add("XLA jit(reference quantize) 1D RNE", ref_1d, out1)
    for cfg in configs or (DEFAULT_CONFIG,):
        f = jax.jit(lambda a, cfg=cfg: quantize(a, config=cfg, interpret=interpret))
        add(f"kernel 1D RNE (amax pass) {cfg.label}", f, out1,
            lambda f=f: timing.bits_equal(f(x), r1))
        g = jax.jit(lambda a, s, cfg=cfg: quantize(a, amax=s, config=cfg, interpret=interpret))
        add(f"kernel 1D RNE (amax given) {cfg.label}", g, out1,
            lambda g=g: timing.bits_equal(g(x, r1.amax), r1), x, r1.amax)
        h = jax.jit(lambda a, s, cfg=cfg: quantize(a, amax=s, rounding="stochastic", key=key,
                                                   config=cfg, interpret=interpret))
        add(f"kernel 1D SR (amax given) {cfg.label}", h, out1,
            lambda h=h: timing.bits_equal(h(x, r1.amax), ref_sr(x)), x, r1.amax)
    return sweep.finish()


if __name__ == "__main__":
    main()
