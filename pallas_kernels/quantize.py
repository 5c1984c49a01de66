"""Fused NVFP4 quantize kernels for Hopper (H200, sm_90) in Pallas Mosaic GPU.

One read of a BF16/FP16 tensor ``x`` (M, K) gives packed E2M1 codes and E4M3 block
scales with exactly `fp4jax.quantize`'s numerics and output layout: round-to-nearest-
even or stochastic rounding (the reference's counter-based bits), optional 16×16 random
Hadamard transform along the quantized axis, 1D (1×16) or 2D (16×16) blocks. The
global amax is either passed in or computed by a separate reduction kernel (one extra
read of ``x``; the quantize kernel needs the global scale before its first block).
`quantize_rowwise_columnwise` produces, from one read of ``x``, the rowwise copy
(blocks along K) and the columnwise RHT copy (blocks along tokens) that the recipe
keeps for activations (RNE) and gradients (SR); its amax pass computes ``max|x|`` and
``max|RHT_col(x)|`` in the same read.

How the kernels are built (all Mosaic GPU, ``plgpu.kernel``, Lane semantics):

* ``x`` is viewed (free, in XLA) as uint32 words holding two adjacent 16-bit elements,
  shaped ``(M/16, 16, K/16, 8)``: 16-row groups × rows × 16-column blocks × words.
  Even elements sit in the low half, so packing two E2M1 codes per byte is a per-word
  operation, never a cross-element shuffle.
* A persistent grid of CTAs walks the tiles; each CTA keeps ``stages`` TMA loads in
  flight (a manual mbarrier pipeline) and writes codes/scales straight from registers
  to global memory (no SMEM staging, so every GMEM stride is allowed).
* Rowwise engine: one register layout holds a whole 16-element block in one thread
  (2 × 16-byte vectors), so the block amax is an in-thread reduction.
* Columnwise engine: the 16 rows of a 16-row group are 16 separate register arrays
  (16 strided SMEM loads, lanes along K, conflict-free); block amax, the Hadamard
  butterfly and code packing along M are then elementwise between those arrays.
* Every rounding is done with integer/bit operations or exact float operations
  (E4M3 scale: integer carry trick; E2M1 element: magic-number addition whose result
  bits are the code; RHT output: integer RNE to the input dtype), and the float
  operations are those of the reference in the same order, so nothing can be elided
  or contracted into a different rounding. Division is IEEE (Mosaic compiles with
  ``fast=false``), approximate math is off.

Shape support (a `ValueError` names the shape otherwise): 2D ``(M, K)`` or batched
``(..., M, K)`` inputs, bfloat16 or float16; quantized axis the last or second-to-last;
``K % 128 == 0``; ``M % 16 == 0`` (rowwise, 1D or 2D blocks) or ``M % 64 == 0``
(columnwise and the two-output variant); the RHT along the last axis needs a 2D input
with ``M % 128 == 0`` and ``K % 64 == 0``. float32 inputs are not taken by the kernel (the packed
two-elements-per-word trick needs 16-bit elements); use `fp4jax.quantize` for them.
A Hadamard transform along the last (contiguous) axis is computed by the columnwise
engine on ``x.T`` (an XLA transpose, then the SR counters are remapped), because the
butterfly needs each element of a contiguous 16-run in its own register array.

The Pallas Triton backend is not used.

Measured on one H200 (2026-11-29, jax 0.11.2, 8192×8192 BF16, median of 15×20 warm
runs; bytes = input read + codes/scales written; copy = XLA ``x + 1`` at 2956 GB/s):

==============================================  =========  =========  ===========
path                                            time (us)  GB/s       x copy BW
==============================================  =========  =========  ===========
XLA ``jit(fp4jax.quantize)`` 1D RNE               216.8      793        0.27
kernel 1D RNE, amax given (`DEFAULT_CONFIG`)       93.3     1842        0.62
kernel 1D RNE incl. amax pass (~32 us extra)      125.5     1370        0.46
XLA two-output rowwise + columnwise RHT, SR      2500.8       84        0.03
kernel two-output RHT, RNE, amaxes given          188.8     1111        0.38
kernel two-output RHT+SR incl. amax pass          567.6      370        0.13
(`TWO_OUTPUT_CONFIG`; other tilings in that sweep were 3-40% slower)
==============================================  =========  =========  ===========

Stochastic rounding is compute-bound: the reference's counter hash (three lowbias32
rounds, ~28 integer ops) runs once per element per output. In that run the columnwise
SR output was not bit-identical to the reference at 384×640 and in the 8192² two-output
check (it was at 1152×896 and in interpret mode); see the GPU tests.

Example:
  >>> import jax, jax.numpy as jnp, fp4jax
  >>> from pallas_kernels import quantize as qk
  >>> x = jax.random.normal(jax.random.key(0), (64, 128), jnp.bfloat16)
  >>> q = qk.quantize(x, interpret=True)  # interpret=True runs on CPU
  >>> r = fp4jax.quantize(x)
  >>> bool((q.data == r.data).all() and (q.scales == r.scales).all())
  True
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import fp4jax
from fp4jax import formats
from fp4jax import hadamard as hadamard_lib
from fp4jax import rounding as rnd
from fp4jax.quantize import check_amax, check_options, global_encode_scale
from fp4jax import random_bits
from fp4jax.formats import NVFP4Array

Rounding = Literal["nearest", "stochastic"]

_U32 = jnp.uint32
_F32 = jnp.float32
_FLT_MAX = float(np.finfo(np.float32).max)
_INV_6 = np.float32(1.0) / np.float32(6.0)

# Register layouts (see the module docstring). Words are uint32 pairs of 16-bit inputs.
# Rowwise: (groups, 16 rows, blocks, 8 words); warps over 4-row quads, lanes over
# 4 rows x 8 blocks, each thread holds one block as two 4-word vectors.
_ROW_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((1, 16, 8, 8), (4, 8, 8), (4,))),
    warp_dims=(-7,),
    lane_dims=(-4, -3),
    vector_dim=-1,
)
# Columnwise: (groups, blocks, 8 words) for one row of each 16-row group; warps over
# 4 groups, lanes over 8 blocks x 4 word pairs, 2-word vectors.
_COL_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((4, 8, 8), (2,))),
    warp_dims=(-4,),
    lane_dims=(-3, -2),
    vector_dim=-1,
)
_ROW_TILE = (16, 128)  # (rows, cols) divisibility of the rowwise engine's tile
_COL_TILE = (64, 128)  # (rows, cols) divisibility of the columnwise engine's tile


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizeConfig:
    """Tuning knobs of the quantize kernels (all static).

    Attributes:
      block_rows: rows of ``x`` per tile (rounded down to what divides M; a multiple
        of 16 for rowwise-only kernels, of 64 when a columnwise output is produced).
      block_cols: columns of ``x`` per tile (a multiple of 128 dividing K).
      stages: TMA loads in flight per CTA (SMEM holds ``stages`` input tiles).
      ctas_per_sm: CTAs launched per SM (persistent grid of ``ctas_per_sm * SMs``).
      num_ctas: explicit grid size (overrides ``ctas_per_sm``); None derives it.
      amax_block_rows / amax_block_cols / amax_stages: tiling of the amax pass.
    """

    block_rows: int = 16
    block_cols: int = 512
    stages: int = 4
    ctas_per_sm: int = 4
    num_ctas: int | None = None
    amax_block_rows: int = 64
    amax_block_cols: int = 256
    amax_stages: int = 3

    def __post_init__(self):
        for name in ("block_rows", "block_cols", "stages", "ctas_per_sm",
                     "amax_block_rows", "amax_block_cols", "amax_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"QuantizeConfig.{name} must be a positive int, got {v!r}")
        if self.block_rows % 16 or self.block_cols % 128:
            raise ValueError(
                f"QuantizeConfig block ({self.block_rows}, {self.block_cols}) must be a "
                "multiple of (16, 128)"
            )
        if self.amax_block_rows % 64 or self.amax_block_cols % 128:
            raise ValueError(
                f"QuantizeConfig amax block ({self.amax_block_rows}, {self.amax_block_cols}) "
                "must be a multiple of (64, 128)"
            )
        if self.num_ctas is not None and (not isinstance(self.num_ctas, int) or self.num_ctas < 1):
            raise ValueError(f"QuantizeConfig.num_ctas must be None or >= 1, got {self.num_ctas!r}")


DEFAULT_CONFIG = QuantizeConfig()
# Fastest measured on the H200 (see the module docstring): 1D rowwise 16x512 tiles,
# 4 stages, 4 CTAs/SM; two-output 64x128 tiles, 3 stages, 2 CTAs/SM.
TWO_OUTPUT_CONFIG = QuantizeConfig(block_rows=64, block_cols=128, stages=3, ctas_per_sm=2)


# --------------------------------------------------------------------------------------
# Elementwise numerics (work on jnp arrays inside the kernel and in plain JAX).
# --------------------------------------------------------------------------------------


def _f32(u):
    return lax.bitcast_convert_type(u, _F32)


def _u32(f):
    return lax.bitcast_convert_type(f, _U32)


def _unpack(w: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """(even, odd) float32 elements of uint32 words holding two 16-bit values."""
    if dtype == jnp.bfloat16:
        return _f32(w << 16), _f32(w & _U32(0xFFFF0000))
    lo = lax.bitcast_convert_type((w & _U32(0xFFFF)).astype(jnp.uint16), jnp.float16)
    hi = lax.bitcast_convert_type((w >> 16).astype(jnp.uint16), jnp.float16)
    return lo.astype(_F32), hi.astype(_F32)


def _round_to_dtype(y: jax.Array, dtype) -> jax.Array:
    """RNE of float32 ``y`` to bf16/f16 precision with integer ops (NaN not preserved).

    Same results as `fp4jax.rounding.round_to_dtype` for every non-NaN input; callers
    handle NaN at block level.
    """
    b = _u32(y)
    if dtype == jnp.bfloat16:
        return _f32((b + _U32(0x7FFF) + ((b >> 16) & _U32(1))) & _U32(0xFFFF0000))
    sign = b & _U32(0x80000000)
    mag = b & _U32(0x7FFFFFFF)
    normal = (mag + _U32(0xFFF) + ((mag >> 13) & _U32(1))) & _U32(0xFFFFE000)
    # Below 2**-14 the quantum is 2**-24: |y| + 0.5 rounds at exactly that spacing and
    # its low bits count the quanta (no add-then-subtract, which XLA would fold).
    sub = _u32((_u32(_f32(mag) + 0.5) - _U32(0x3F000000)).astype(_F32) * np.float32(2.0**-24))
    r = jnp.where(mag < _U32(0x38800000), sub, normal)
    r = jnp.where(_f32(r) > 65504.0, _U32(0x7F800000), r)
    return _f32(r | sign)


def _round_block_max(m: jax.Array, dtype) -> jax.Array:
    """Rounds a non-negative max to ``dtype``, keeping NaN."""
    return jnp.where(m != m, m, _round_to_dtype(m, dtype))


def _finite(x: jax.Array) -> jax.Array:
    """``x`` with NaN/±inf replaced by 0 (the reference ignores non-finite values)."""
    return jnp.where(jnp.abs(x) < np.float32(np.inf), x, 0.0)


# Smallest float32 magnitude that rounds to inf in each 16-bit dtype.
_OVERFLOW = {jnp.dtype(jnp.bfloat16): np.float32(np.uint32(0x7F7F8000).view(np.float32)),
             jnp.dtype(jnp.float16): np.float32(65520.0)}


def _block_scale(bamax: jax.Array, gds, mult):
    """Block scales from block amaxes (RECIPE.md §2.4-2.5).

    Returns:
      (enc, code, ok): float32 per-block encode scale, uint32 E4M3 bit pattern of the
      decode scale, and a bool that is False for NaN blocks (whose codes must be 0).
    """
    d = jnp.minimum(bamax * mult, 448.0)
    dbits = _u32(d)
    s_norm = (dbits + _U32(0x7FFFF) + ((dbits >> 20) & _U32(1))) & _U32(0xFFF00000)
    # Below 2**-6 (E4M3 subnormals) the quantum is 2**-9: d + 2**14 rounds at exactly
    # that spacing and its low bits count the quanta (= the E4M3 code).
    code_sub = _u32(d + 16384.0) - _U32(0x46800000)
    small = d < np.float32(2.0**-6)
    s = jnp.where(small, code_sub.astype(_F32) * np.float32(2.0**-9), _f32(s_norm))
    code_norm = (((s_norm >> 23) - _U32(120)) << 3) | ((s_norm >> 20) & _U32(7))
    ok = d == d
    code = jnp.where(ok, jnp.where(small, code_sub, code_norm), _U32(0x7F))
    enc = jnp.minimum(1.0 / (s * gds), _FLT_MAX)
    return enc, code, ok


def _nibble_nearest(x: jax.Array, enc: jax.Array) -> jax.Array:
    """E2M1 code (uint32, 0..15) of ``x * enc`` by round-to-nearest-even.

    ``a = min(|v|, 6)``; adding ``C = 2**22, 2**23 + 2, 2**24 + 8`` for ``a`` in
    ``[0, 2), [2, 4), [4, 6]`` rounds ``a`` to the E2M1 grid (the float addition is RNE
    at exactly the grid spacing) and leaves the code in the low 3 bits of the sum.
    """
    v = x * enc
    a = jnp.minimum(jnp.abs(v), 6.0)
    e = jnp.maximum(_u32(a) >> 23, _U32(127))
    c = e * _U32(0x800002) + _U32((0x4A800000 - 127 * 0x800002) & 0xFFFFFFFF)
    mag = _u32(a + _f32(c)) & _U32(7)
    return mag | jnp.where(v < 0, _U32(8), _U32(0))


def _nibble_stochastic(x: jax.Array, enc: jax.Array, u24: jax.Array) -> jax.Array:
    """E2M1 code of ``x * enc`` by the reference's stochastic rounding.

    With spacing ``h`` (0.5, 1, 2) at ``a``, rounds up iff ``u24 < frac * 2**24`` where
    ``frac = (a - floor(a / h) * h) / h``; all steps are exact.
    """
    v = x * enc
    a = jnp.minimum(jnp.abs(v), 6.0)
    e = jnp.maximum(_u32(a) >> 23, _U32(127))  # 127 + k, k = 0, 1, 2
    t = a * _f32((_U32(255) - e) << 23)  # a / h * 0.5... = a * 2**(1-k), exact, in [0, 4)
    n = _u32(t + 8388608.0) - _U32(0x4B000000)  # RNE(t) as an integer (t < 4)
    lo = n - jnp.where(n.astype(_F32) > t, _U32(1), _U32(0))  # floor(t)
    frac = t - lo.astype(_F32)
    up = u24.astype(_F32) < frac * 16777216.0
    mag = lo + ((e - _U32(127)) << 1) + jnp.where(up, _U32(1), _U32(0))
    return mag | jnp.where(v < 0, _U32(8), _U32(0))


def _u24(k0, k1, k2, index):
    """`fp4jax.random_bits.hash_bits` >> 8, with ``k2 = k0 * 0x9E3779B9``."""
    h = random_bits.mix32(index ^ k0)
    h = random_bits.mix32(h + k1)
    return random_bits.mix32(h ^ k2) >> 8


def _rht16(vals: Sequence[jax.Array], signs: Sequence[int]) -> list[jax.Array]:
    """The 16-point butterfly of `fp4jax.hadamard.rht` (without the final * 0.25)."""
    y = [v if s > 0 else -v for v, s in zip(vals, signs)]
    h = 1
    while h < formats.BLOCK:
        nxt = list(y)
        for start in range(0, formats.BLOCK, 2 * h):
            for i in range(start, start + h):
                a, b = y[i], y[i + h]
                nxt[i], nxt[i + h] = a + b, a - b
        y = nxt
        h *= 2
    return y


# --------------------------------------------------------------------------------------
# Kernel specs and bodies.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Out:
    """Static description of one quantized output of a kernel."""

    stochastic: bool
    block_2d: bool = False
    hadamard: bool = False
    signs: tuple[int, ...] = hadamard_lib.DEFAULT_SIGNS
    index_strides: tuple[int, int] | None = None  # SR counter strides (row, col)
    poison: bool = False  # also report whether a (rotated) value was non-finite


@dataclasses.dataclass(frozen=True)
class _Spec:
    m: int
    k: int
    dtype: Any
    bm: int
    bk: int
    stages: int
    grid: int
    row: _Out | None
    col: _Out | None


def _tiles(spec) -> tuple[int, int]:
    tk = spec.k // spec.bk
    return (spec.m // spec.bm) * tk, tk


def _pipeline(spec, x_gmem, x_smem, bar, body):
    """Persistent loop over this CTA's tiles with ``stages`` TMA loads in flight."""
    bg, bnb = spec.bm // 16, spec.bk // 16
    num_tiles, tk = _tiles(spec)
    cta = lax.axis_index("cta")
    n_local = (num_tiles - 1 - cta) // spec.grid + 1

    def origin(i):
        t = cta + i * spec.grid
        return (t // tk) * bg, (t % tk) * bnb

    def fetch(i, slot):
        g0, b0 = origin(i)
        plgpu.copy_gmem_to_smem(
            x_gmem.at[pl.ds(g0, bg), :, pl.ds(b0, bnb)], x_smem.at[slot], bar.at[slot]
        )

    for s in range(spec.stages):
        @pl.when(s < n_local)
        def _prologue():
            fetch(s, s)

    def step(i, carry):
        slot = lax.rem(i, spec.stages)
        g0, b0 = origin(i)
        plgpu.barrier_wait(bar.at[slot])
        carry = body(x_smem.at[slot], g0, b0, carry)
        plgpu.commit_smem()  # every warp is done reading the slot before it is refilled

        @pl.when(i + spec.stages < n_local)
        def _refill():
            fetch(i + spec.stages, slot)

        return carry

    return step, n_local


def _row_engine(tile, codes_ref, scales_ref, g0, b0, gds, mult, keys, out: _Out, spec, off,
                acc):
    """Rowwise (blocks along K) quantization of one tile; returns the poison accumulator."""
    bg, bnb = spec.bm // 16, spec.bk // 16
    shape = (bg, 16, bnb, 8)
    w = plgpu.load(tile, layout=_ROW_LAYOUT)
    xe, xo = _unpack(w, spec.dtype)
    if out.poison:
        acc = jnp.maximum(acc, jnp.maximum(jnp.abs(xe), jnp.abs(xo)))
    xe, xo = _finite(xe), _finite(xo)
    bamax = jnp.max(jnp.maximum(jnp.abs(xe), jnp.abs(xo)), axis=3)  # (bg, 16, bnb)
    if out.block_2d:
        tile_max = jnp.max(bamax, axis=1)  # (bg, bnb): one per 16x16 tile
        enc, code, ok = _block_scale(tile_max, gds, mult)
        red = _ROW_LAYOUT.reduce(3)
        enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, shape[:3], (0, 2)), red)
        scales_ref.at[pl.ds(g0, bg), pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    else:
        enc, code, ok = _block_scale(bamax, gds, mult)
        scales_ref.at[pl.ds(g0, bg), :, pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, shape, (0, 1, 2)), _ROW_LAYOUT)
    if out.stochastic:
        base = (g0 * 16 * out.index_strides[0] + b0 * 16 * out.index_strides[1]).astype(_U32)
        idx = off + base
        ne = _nibble_stochastic(xe, enc, _u24(*keys, idx))
        no = _nibble_stochastic(xo, enc, _u24(*keys, idx + _U32(out.index_strides[1])))
    else:
        ne = _nibble_nearest(xe, enc)
        no = _nibble_nearest(xo, enc)
    byte = ne | (no << 4)
    codes_ref.at[pl.ds(g0, bg), :, pl.ds(b0, bnb)][...] = byte.astype(jnp.uint8)
    return acc


def _col_engine(tile, codes_ref, scales_ref, g0, b0, gds, mult, keys, out: _Out, spec, off,
                acc):
    """Columnwise (blocks along M, optional RHT) quantization of one tile."""
    bg, bnb = spec.bm // 16, spec.bk // 16
    words = [plgpu.load(tile.at[:, j], layout=_COL_LAYOUT) for j in range(16)]
    halves = [_unpack(w, spec.dtype) for w in words]
    cols = [[h[0] for h in halves], [h[1] for h in halves]]  # even / odd column
    bamax = []
    for c in range(2):
        if out.hadamard:
            cols[c] = [_round_to_dtype(v * 0.25, spec.dtype) for v in _rht16(cols[c], out.signs)]
        if out.poison:
            acc = functools.reduce(jnp.maximum, [jnp.abs(v) for v in cols[c]], acc)
        cols[c] = [_finite(v) for v in cols[c]]
        bamax.append(functools.reduce(jnp.maximum, [jnp.abs(v) for v in cols[c]]))
    if out.block_2d:
        tile_max = jnp.max(jnp.maximum(bamax[0], bamax[1]), axis=2)  # (bg, bnb)
        enc, code, ok = _block_scale(tile_max, gds, mult)
        enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, (bg, bnb, 8), (0, 1)), _COL_LAYOUT)
        encs = (enc, enc)
        scales_ref.at[pl.ds(g0, bg), pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    else:
        (enc_e, code_e, ok_e), (enc_o, code_o, ok_o) = (
            _block_scale(bamax[0], gds, mult), _block_scale(bamax[1], gds, mult))
        encs = (enc_e, enc_o)
        pair = (code_e | (code_o << 8)).astype(jnp.uint16)
        scales_ref.at[pl.ds(g0, bg), pl.ds(b0, bnb)][...] = pair
    if out.stochastic:
        sr, sc = out.index_strides
        base = (g0 * 16 * sr + b0 * 16 * sc).astype(_U32) + off
    for p in range(8):
        word = None
        for c in range(2):
            for half in range(2):
                j = 2 * p + half
                if out.stochastic:
                    idx = base + _U32((j * sr + c * sc) & 0xFFFFFFFF)
                    nib = _nibble_stochastic(cols[c][j], encs[c], _u24(*keys, idx))
                else:
                    nib = _nibble_nearest(cols[c][j], encs[c])
                shift = 8 * c + 4 * half
                nib = nib << shift if shift else nib
                word = nib if word is None else word | nib
        codes_ref.at[pl.ds(g0, bg), p, pl.ds(b0, bnb)][...] = word.astype(jnp.uint16)
    return acc


def _sr_offsets(layout, shape, strides, row_dims):
    """Loop-invariant SR counter offsets of a tile's words (uint32, in ``layout``).

    ``row_dims``: per array axis, its row/col weight as (rows per unit, cols per unit).
    """
    sr, sc = strides
    off = None
    for axis, (rows, cols) in enumerate(row_dims):
        weight = rows * sr + cols * sc
        if weight == 0:
            continue
        term = plgpu.broadcasted_iota(_U32, shape, axis, layout=layout) * _U32(weight & 0xFFFFFFFF)
        off = term if off is None else off + term
    return off


def _quantize_kernel(x_gmem, fparams, uparams, *refs, spec: _Spec):
    outs = list(refs[:-2])
    x_smem, bar = refs[-2:]
    bg, bnb = spec.bm // 16, spec.bk // 16
    engines = []
    if spec.row is not None:
        codes, scales = outs.pop(0), outs.pop(0)
        off = None
        if spec.row.stochastic:
            off = _sr_offsets(_ROW_LAYOUT, (bg, 16, bnb, 8), spec.row.index_strides,
                              [(16, 0), (1, 0), (0, 16), (0, 2)])
        keys = tuple(uparams[i] for i in range(3))
        acc = plgpu.layout_cast(jnp.zeros((bg, 16, bnb, 8), _F32), _ROW_LAYOUT)
        engines.append((_row_engine, codes, scales, fparams[0], fparams[1], keys, spec.row, off,
                        acc))
    if spec.col is not None:
        codes, scales = outs.pop(0), outs.pop(0)
        off = None
        if spec.col.stochastic:
            off = _sr_offsets(_COL_LAYOUT, (bg, bnb, 8), spec.col.index_strides,
                              [(16, 0), (0, 16), (0, 2)])
        keys = tuple(uparams[i] for i in range(3, 6))
        acc = plgpu.layout_cast(jnp.zeros((bg, bnb, 8), _F32), _COL_LAYOUT)
        engines.append((_col_engine, codes, scales, fparams[2], fparams[3], keys, spec.col, off,
                        acc))
    poison_ref = outs.pop(0) if outs else None
    poison = [e[6].poison for e in engines]

    def body(tile, g0, b0, carry):
        carry = list(carry)
        for n, (engine, codes, scales, gds, mult, keys, out, off, _) in enumerate(engines):
            carry[n] = engine(tile, codes, scales, g0, b0, gds, mult, keys, out, spec, off,
                              carry[n])
        return tuple(carry)

    step, n_local = _pipeline(spec, x_gmem, x_smem, bar, body)
    init = tuple(e[-1] if p else None for e, p in zip(engines, poison))
    final = lax.fori_loop(0, n_local, step, init)
    if poison_ref is not None:
        cta = lax.axis_index("cta")
        for n, (acc, p) in enumerate(zip(final, poison)):
            if not p:
                continue
            acc = jnp.where(acc != acc, np.float32(np.inf), acc)  # NaN-safe reduction
            red = jnp.max(jnp.max(acc, axis=3), axis=1) if acc.ndim == 4 else jnp.max(acc, axis=2)
            poison_ref.at[cta, n][...] = red


def _amax_kernel(x_gmem, out_ref, x_smem, bar, *, spec: _Spec, overflow: float):
    """Per-CTA partial maxima of the amax pass (each (bg, bnb) per CTA).

    out[:, 0]: max|x| over finite x; out[:, 1]: max|x| (NaN/inf propagate: poison);
    out[:, 2]: max|y| over butterfly sums y whose rotated value 0.25*y rounds to a finite
    value; out[:, 3]: max|y| over all y.
    """
    bg, bnb = spec.bm // 16, spec.bk // 16
    want_rht = spec.col is not None and spec.col.hadamard
    limit = np.float32(np.inf) if 4.0 * overflow > _FLT_MAX else np.float32(4.0 * overflow)
    cta = lax.axis_index("cta")

    if not want_rht:  # rowwise layout: any M % 16 == 0
        zero = plgpu.layout_cast(jnp.zeros((bg, 16, bnb, 8), _F32), _ROW_LAYOUT)

        def row_body(tile, g0, b0, carry):
            fin, raw = carry
            for v in _unpack(plgpu.load(tile, layout=_ROW_LAYOUT), spec.dtype):
                a = jnp.abs(v)
                raw = jnp.maximum(raw, a)
                fin = jnp.maximum(fin, jnp.where(a < np.float32(np.inf), a, 0.0))
            return fin, raw

        step, n_local = _pipeline(spec, x_gmem, x_smem, bar, row_body)
        final = lax.fori_loop(0, n_local, step, (zero, zero))
        for n, acc in enumerate(final + final):
            acc = jnp.where(acc != acc, np.float32(np.inf), acc)  # NaN-safe reduction
            out_ref.at[cta, n][...] = jnp.max(jnp.max(acc, axis=3), axis=1)
        return

    zero = plgpu.layout_cast(jnp.zeros((bg, bnb, 8), _F32), _COL_LAYOUT)

    def body(tile, g0, b0, carry):
        fin, raw, fin_h, raw_h = carry
        words = [plgpu.load(tile.at[:, j], layout=_COL_LAYOUT) for j in range(16)]
        halves = [_unpack(w, spec.dtype) for w in words]
        for c in range(2):
            vals = [h[c] for h in halves]
            for v in vals:
                a = jnp.abs(v)
                raw = jnp.maximum(raw, a)
                fin = jnp.maximum(fin, jnp.where(a < np.float32(np.inf), a, 0.0))
            if want_rht:
                for v in _rht16(vals, spec.col.signs):
                    a = jnp.abs(v)
                    raw_h = jnp.maximum(raw_h, a)
                    fin_h = jnp.maximum(fin_h, jnp.where(a < limit, a, 0.0))
        return fin, raw, fin_h, raw_h

    step, n_local = _pipeline(spec, x_gmem, x_smem, bar, body)
    final = lax.fori_loop(0, n_local, step, (zero, zero, zero, zero))
    for n, acc in enumerate(final):
        acc = jnp.where(acc != acc, np.float32(np.inf), acc)  # NaN-safe reduction
        out_ref.at[cta, n][...] = jnp.max(acc, axis=2)


def _interpret_params(interpret: bool):
    return plgpu.InterpretGPUParams() if interpret else None


def _num_sms(interpret: bool) -> int:
    if interpret:
        return 2
    dev = jax.devices()[0]
    return int(getattr(dev, "core_count", 0) or 132)


def _grid(num_tiles: int, config: QuantizeConfig, interpret: bool) -> int:
    g = config.num_ctas if config.num_ctas is not None else config.ctas_per_sm * _num_sms(interpret)
    return max(1, min(g, num_tiles))


_SMEM_BUDGET = 200 * 1024  # bytes of input stages per CTA (the H200 has 227 KiB per block)


def _stages(spec) -> int:
    """Pipeline depth: the configured one, capped by SMEM and by this CTA's tile count."""
    num_tiles, _ = _tiles(spec)
    tile_bytes = spec.bm * spec.bk * 2
    return max(1, min(spec.stages, _SMEM_BUDGET // tile_bytes, -(-num_tiles // spec.grid)))


def _pick(extent: int, want: int, unit: int) -> int:
    """Largest multiple of ``unit`` that is <= ``want`` and divides ``extent``."""
    b = max(unit, want - want % unit)
    while b > unit and extent % b:
        b -= unit
    return b


def _words(x: jax.Array) -> jax.Array:
    """(M, K) 16-bit -> (M/16, 16, K/16, 8) uint32 words (a bitcast)."""
    m, k = x.shape
    w = lax.bitcast_convert_type(x.reshape(m, k // 2, 2), _U32)
    return w.reshape(m // 16, 16, k // 16, 8)


def _lane_params(**kw):
    return plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane, **kw)


def _run_amax(x2: jax.Array, want_rht: bool, signs, config, interpret):
    """Amax pass: ((amax, poisoned) of x, (amax, poisoned) of RHT_col(x) or None)."""
    m, k = x2.shape
    bm = _pick(m, config.amax_block_rows, 64 if want_rht else 16)
    bk = _pick(k, config.amax_block_cols, 128)
    col = _Out(stochastic=False, hadamard=True, signs=signs) if want_rht else None
    spec = _Spec(m, k, x2.dtype, bm, bk, config.amax_stages, 0, None, col)
    num_tiles, _ = _tiles(spec)
    spec = dataclasses.replace(spec, grid=_grid(num_tiles, config, interpret))
    stages = _stages(spec)
    spec = dataclasses.replace(spec, stages=stages)
    overflow = float(_OVERFLOW[jnp.dtype(x2.dtype)])
    kern = plgpu.kernel(
        functools.partial(_amax_kernel, spec=spec, overflow=overflow),
        out_type=jax.ShapeDtypeStruct((spec.grid, 4, bm // 16, bk // 16), _F32),
        grid=(spec.grid,),
        grid_names=("cta",),
        scratch_types=[
            plgpu.SMEM((stages, bm // 16, 16, bk // 16, 8), _U32),
            plgpu.Barrier(num_barriers=stages),
        ],
        compiler_params=_lane_params(),
        interpret=_interpret_params(interpret),
    )
    part = jnp.max(kern(_words(x2)), axis=(0, 2, 3))
    plain = (part[0], ~(part[1] < np.float32(np.inf)))
    if not want_rht:
        return plain, None
    # max |round(0.25 y)| = round(0.25 max |y|): rounding is monotone.
    rot = (_round_block_max(part[2] * np.float32(0.25), x2.dtype),
           ~(part[3] * np.float32(0.25) < np.float32(overflow)))
    return plain, rot


def _finite_amax_xla(x2: jax.Array, hadamard: bool, signs, axis: int) -> jax.Array:
    """max|x| over finite (rotated) values in plain XLA: the rare non-finite-amax branch."""
    xf = x2.astype(_F32)
    if hadamard:
        xf = hadamard_lib.rht(xf, axis, signs, round_to=x2.dtype)
    return jnp.max(jnp.where(jnp.isfinite(xf), jnp.abs(xf), np.float32(0.0)))


def _scales_from(given, computed, fallback):
    """(stored-amax function, gds, mult) exactly as `fp4jax.quantize` derives them.

    ``given``: the caller's amax or None; ``computed``: a thunk giving (finite amax,
    poisoned) from the amax pass; ``fallback``: a thunk giving the finite amax in XLA,
    evaluated only (``lax.cond``) when ``given`` is not finite. The returned function
    maps the quantize kernel's poison flag (used when ``given`` is not None) to the
    stored amax (NaN when poisoned).
    """
    if given is None:
        amax_x, poisoned = computed()
        finalize = lambda p: p  # noqa: E731
    else:
        ok = jnp.isfinite(given)
        amax_x = lax.cond(ok, lambda: given, fallback)
        finalize = lambda p: p | ~ok  # noqa: E731
        poisoned = None
    ges = global_encode_scale(amax_x)
    gds = rnd.div_rn(np.float32(1.0), ges)
    mult = ges * _INV_6

    def stored(kernel_poisoned):
        p = finalize(poisoned if poisoned is not None else kernel_poisoned)
        return jnp.where(p, np.float32(np.nan), amax_x).astype(_F32)

    return stored, gds, mult


def _key_params(key) -> jax.Array:
    if key is None:
        return jnp.zeros((3,), _U32)
    k0, k1 = random_bits.key_words(key)
    return jnp.stack([k0, k1, k0 * _U32(0x9E3779B9)])


def _run_quantize(x2, row: _Out | None, col: _Out | None, fparams, uparams, config, interpret):
    """Runs the quantize kernel; returns its outputs and per-output poison flags."""
    m, k = x2.shape
    unit_m = 64 if (col is not None) else 16
    bm = _pick(m, config.block_rows, unit_m)
    bk = _pick(k, config.block_cols, 128)
    spec = _Spec(m, k, x2.dtype, bm, bk, config.stages, 0, row, col)
    num_tiles, _ = _tiles(spec)
    spec = dataclasses.replace(spec, grid=_grid(num_tiles, config, interpret))
    stages = _stages(spec)
    spec = dataclasses.replace(spec, stages=stages)
    out_types = []
    if row is not None:
        out_types.append(jax.ShapeDtypeStruct((m // 16, 16, k // 16, 8), jnp.uint8))
        if row.block_2d:
            out_types.append(jax.ShapeDtypeStruct((m // 16, k // 16), jnp.uint8))
        else:
            out_types.append(jax.ShapeDtypeStruct((m // 16, 16, k // 16), jnp.uint8))
    if col is not None:
        out_types.append(jax.ShapeDtypeStruct((m // 16, 8, k // 16, 8), jnp.uint16))
        if col.block_2d:
            out_types.append(jax.ShapeDtypeStruct((m // 16, k // 16), jnp.uint8))
        else:
            out_types.append(jax.ShapeDtypeStruct((m // 16, k // 16, 8), jnp.uint16))
    want_poison = any(o is not None and o.poison for o in (row, col))
    if want_poison:
        out_types.append(jax.ShapeDtypeStruct((spec.grid, 2, bm // 16, bk // 16), _F32))
    kern = plgpu.kernel(
        functools.partial(_quantize_kernel, spec=spec),
        out_type=tuple(out_types),
        grid=(spec.grid,),
        grid_names=("cta",),
        scratch_types=[
            plgpu.SMEM((stages, bm // 16, 16, bk // 16, 8), _U32),
            plgpu.Barrier(num_barriers=stages),
        ],
        compiler_params=_lane_params(
            reduction_scratch_bytes=max(2048, (bm // 16) * (bk // 16) * 16 * 4)),
        interpret=_interpret_params(interpret),
    )
    res = list(kern(_words(x2), fparams, uparams))
    flags = [None, None]
    if want_poison:
        part = jnp.max(res.pop(), axis=(0, 2, 3))
        n = 0
        for i, o in enumerate((row, col)):
            if o is None:
                continue
            if o.poison:
                flags[i] = ~(part[n] < np.float32(np.inf))
            n += 1
    return res, flags


def _as_bytes(u16: jax.Array, rows: int, cols: int) -> jax.Array:
    """uint16 array holding byte pairs (low byte first) -> (rows, cols) uint8."""
    return lax.bitcast_convert_type(u16.reshape(rows, cols // 2), jnp.uint8).reshape(rows, cols)


# --------------------------------------------------------------------------------------
# Validation and public API.
# --------------------------------------------------------------------------------------


def _check_dtype(x: jax.Array, what: str) -> None:
    if x.ndim < 2:
        raise ValueError(
            f"{what}: the Pallas quantize kernel needs a rank >= 2 array, got shape {x.shape}")
    if x.dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(
            f"{what}: the Pallas quantize kernel takes bfloat16 or float16 inputs, got "
            f"{x.dtype} with shape {x.shape}; use fp4jax.quantize for other dtypes"
        )


def _check_x(x, what: str, need_rows: int) -> tuple[jax.Array, tuple[int, ...]]:
    x = jnp.asarray(x)
    _check_dtype(x, what)
    lead, (m, k) = x.shape[:-2], x.shape[-2:]
    rows = math.prod(lead) * m
    if k % 128 or m % 16 or rows % need_rows or rows == 0:
        raise ValueError(
            f"{what}: the Pallas quantize kernel needs the last axis to be a multiple of 128, "
            f"the second-to-last a multiple of 16 and the flattened row count a multiple of "
            f"{need_rows}; got shape {x.shape}. Use fp4jax.quantize for this shape"
        )
    return x, lead


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
        # Hadamard along the contiguous axis: columnwise engine on x^T, counters remapped.
        xk = x2.T
        out = _Out(stochastic=stochastic, hadamard=True, signs=signs, index_strides=(1, k),
                   poison=amax is not None)
    elif axis == x.ndim - 1:
        xk = x2
        out = _Out(stochastic=stochastic, block_2d=block_2d, index_strides=(k, 1),
                   poison=amax is not None)
    else:
        xk = x2
        out = _Out(stochastic=stochastic, block_2d=block_2d, hadamard=hadamard, signs=signs,
                   index_strides=(k, 1), poison=amax is not None)
    is_col = transposed or axis != x.ndim - 1

    def computed():
        plain, rot = _run_amax(xk, out.hadamard, signs, config, interpret)
        return rot if out.hadamard else plain

    stored, gds, mult = _scales_from(
        amax, computed, lambda: _finite_amax_xla(xk, out.hadamard, signs, 0))
    fp = jnp.stack([gds, mult, gds, mult])
    up = jnp.concatenate([_key_params(key), _key_params(key)])
    (codes, scales), flags = _run_quantize(
        xk, None if is_col else out, out if is_col else None, fp, up, config, interpret)
    amax_out = stored(flags[1] if is_col else flags[0])
    if transposed:
        return _as_bytes(codes, k // 2, rows).T, _as_bytes(scales, k // 16, rows).T, amax_out
    if not is_col:
        data = codes.reshape(*lead, m, k // 2)
        scales = (scales.reshape(*lead, m // 16, k // 16) if block_2d
                  else scales.reshape(*lead, m, k // 16))
        return data, scales, amax_out
    data = _as_bytes(codes, rows // 2, k).reshape(*lead, m // 2, k)
    if block_2d:
        scales = scales.reshape(*lead, m // 16, k // 16)
    else:
        scales = _as_bytes(scales, rows // 16, k).reshape(*lead, m // 16, k)
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

    Same semantics, output layout and bits as `fp4jax.quantize` (including stochastic
    rounding: the same counter-based bits), for the shapes the kernel takes (see the
    module docstring); a `ValueError` names any other shape or dtype.

    Args:
      x: bfloat16/float16 array ``(..., M, K)``.
      axis: the block axis: the last or the second-to-last.
      block_2d: one scale per 16×16 tile (weights).
      rounding: ``"nearest"`` or ``"stochastic"`` (needs ``key``).
      key: a ``jax.random`` key for stochastic rounding.
      hadamard: apply the 16×16 RHT along ``axis`` first (amax after the transform).
      hadamard_signs: RHT sign vector (default `fp4jax.hadamard.DEFAULT_SIGNS`).
      amax: precomputed global amax (skips the reduction pass).
      config: tuning (`QuantizeConfig`); None uses `DEFAULT_CONFIG` for the rowwise
        engine and `TWO_OUTPUT_CONFIG` for the columnwise one.
      interpret: run in Mosaic GPU interpret mode (CPU, slow; for tests).

    Returns:
      An `fp4jax.NVFP4Array`.

    Mathematically equivalent to::

      fp4jax.quantize(x, axis=axis, block_2d=block_2d, rounding=rounding, key=key,
                      hadamard=hadamard, hadamard_signs=hadamard_signs, amax=amax)

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from pallas_kernels import quantize as qk
      >>> x = jax.random.normal(jax.random.key(1), (64, 128), jnp.bfloat16)
      >>> q = qk.quantize(x, axis=0, hadamard=True, interpret=True)
      >>> r = fp4jax.quantize(x, axis=0, hadamard=True)
      >>> bool((q.data == r.data).all()), q.scales.shape
      (True, (4, 128))
    """
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"the Pallas quantize kernel needs a rank >= 2 array, got shape {x.shape}")
    ax = formats.normalize_axis(axis, x.ndim)
    if ax not in (x.ndim - 1, x.ndim - 2):
        raise ValueError(
            f"the Pallas quantize kernel quantizes along one of the last two axes; got axis={axis} "
            f"for shape {x.shape}")
    check_options(rounding=rounding, key=key, hadamard=hadamard, block_2d=block_2d,
                  hadamard_signs=hadamard_signs)
    signs = hadamard_lib.check_signs(hadamard_signs)
    if ax == x.ndim - 1 and hadamard:
        _check_dtype(x, "quantize")
        if x.ndim != 2 or x.shape[0] % 128 or x.shape[1] % 64:
            raise ValueError(
                "quantize(hadamard=True) along the last axis needs a 2D input (M, K) with "
                f"M % 128 == 0 and K % 64 == 0 (it runs on x.T); got shape {x.shape}")
    else:
        need_rows = 16 if ax == x.ndim - 1 else 64
        x, _ = _check_x(x, "quantize", need_rows)
    amax = check_amax(amax)
    if config is None:  # the columnwise engine's best tiling is TWO_OUTPUT_CONFIG's
        config = DEFAULT_CONFIG if (ax == x.ndim - 1 and not hadamard) else TWO_OUTPUT_CONFIG
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


@functools.partial(jax.jit, static_argnames=("rounding", "hadamard_signs", "config", "interpret"))
def _rowcol_jit(x, row_key, col_key, row_amax, col_amax, *, rounding, hadamard_signs, config,
                interpret):
    m, k = x.shape
    stochastic = rounding == "stochastic"
    res = []
    if row_amax is None or col_amax is None:
        res = [_run_amax(x, True, hadamard_signs, config, interpret)]  # one pass for both

    stored_r, gds_r, mult_r = _scales_from(
        row_amax, lambda: res[0][0], lambda: _finite_amax_xla(x, False, hadamard_signs, 0))
    stored_c, gds_c, mult_c = _scales_from(
        col_amax, lambda: res[0][1], lambda: _finite_amax_xla(x, True, hadamard_signs, 0))
    fp = jnp.stack([gds_r, mult_r, gds_c, mult_c])
    up = jnp.concatenate([_key_params(row_key), _key_params(col_key)])
    row = _Out(stochastic=stochastic, index_strides=(k, 1), poison=row_amax is not None)
    col = _Out(stochastic=stochastic, hadamard=True, signs=hadamard_signs, index_strides=(k, 1),
               poison=col_amax is not None)
    (rc, rs, cc, cs), flags = _run_quantize(x, row, col, fp, up, config, interpret)
    return (rc.reshape(m, k // 2), rs.reshape(m, k // 16), stored_r(flags[0]),
            _as_bytes(cc, m // 2, k), _as_bytes(cs, m // 16, k), stored_c(flags[1]))


def quantize_rowwise_columnwise(
    x: jax.typing.ArrayLike,
    *,
    rounding: Rounding = "nearest",
    row_key: jax.Array | None = None,
    col_key: jax.Array | None = None,
    hadamard_signs: Sequence[int] | None = None,
    row_amax: jax.typing.ArrayLike | None = None,
    col_amax: jax.typing.ArrayLike | None = None,
    config: QuantizeConfig | None = None,
    interpret: bool = False,
) -> tuple[NVFP4Array, NVFP4Array]:
    """Rowwise and columnwise-RHT NVFP4 copies of ``x`` from one read of ``x``.

    The amax pass (skipped when both amaxes are given) reads ``x`` once for
    ``max|x|`` and ``max|RHT_col(x)|`` together.

    Args:
      x: bfloat16/float16 ``(M, K)``, ``M % 64 == 0``, ``K % 128 == 0``.
      rounding: ``"nearest"`` (activations) or ``"stochastic"`` (gradients; needs
        ``row_key`` and ``col_key``).
      row_key, col_key: keys of the two copies' stochastic rounding.
      hadamard_signs: RHT sign vector of the columnwise copy.
      row_amax, col_amax: precomputed global amaxes (``col_amax`` after the RHT).
      config: tuning (`QuantizeConfig`); None uses `TWO_OUTPUT_CONFIG`.
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      ``(rowwise, columnwise)`` NVFP4Arrays.

    Mathematically equivalent to::

      (fp4jax.quantize(x, axis=1, rounding=rounding, key=row_key, amax=row_amax),
       fp4jax.quantize(x, axis=0, hadamard=True, rounding=rounding, key=col_key,
                       hadamard_signs=hadamard_signs, amax=col_amax))

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from pallas_kernels import quantize as qk
      >>> x = jax.random.normal(jax.random.key(2), (64, 128), jnp.bfloat16)
      >>> r, c = qk.quantize_rowwise_columnwise(x, interpret=True)
      >>> bool((c.data == fp4jax.quantize(x, axis=0, hadamard=True).data).all())
      True
    """
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(
            f"quantize_rowwise_columnwise takes a 2D (M, K) array, got shape {x.shape}")
    x, _ = _check_x(x, "quantize_rowwise_columnwise", 64)
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    if rounding == "stochastic" and (row_key is None or col_key is None):
        raise ValueError("rounding='stochastic' needs row_key and col_key")
    for key in (row_key, col_key):
        if key is not None:
            random_bits.key_words(key)
    signs = hadamard_lib.check_signs(hadamard_signs)
    config = TWO_OUTPUT_CONFIG if config is None else config
    rc, rs, ra, cc, cs, ca = _rowcol_jit(
        x, row_key, col_key, check_amax(row_amax), check_amax(col_amax),
        rounding=rounding, hadamard_signs=signs, config=config, interpret=bool(interpret))
    e4m3 = lambda s: lax.bitcast_convert_type(s, jnp.float8_e4m3fn)  # noqa: E731
    row = NVFP4Array(data=rc, scales=e4m3(rs), amax=ra, shape=tuple(x.shape), dtype=x.dtype,
                     axis=1)
    col = NVFP4Array(data=cc, scales=e4m3(cs), amax=ca, shape=tuple(x.shape), dtype=x.dtype,
                     axis=0, hadamard=True)
    return row, col


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
    """The pure-JAX reference: `fp4jax.quantize` (the spec the kernel matches bit for bit).

    Example:
      >>> import jax.numpy as jnp
      >>> from pallas_kernels import quantize as qk
      >>> qk.reference(jnp.ones((16, 16), jnp.bfloat16)).data.shape
      (16, 8)
    """
    return fp4jax.quantize(x, axis=axis, block_2d=block_2d, rounding=rounding, key=key,
                           hadamard=hadamard, hadamard_signs=hadamard_signs, amax=amax)


def reference_rowwise_columnwise(x, *, rounding="nearest", row_key=None, col_key=None,
                                 hadamard_signs=None, row_amax=None, col_amax=None):
    """Reference of `quantize_rowwise_columnwise`: two `fp4jax.quantize` calls."""
    return (
        fp4jax.quantize(x, axis=1, rounding=rounding, key=row_key, amax=row_amax),
        fp4jax.quantize(x, axis=0, hadamard=True, rounding=rounding, key=col_key,
                        hadamard_signs=hadamard_signs, amax=col_amax),
    )


# --------------------------------------------------------------------------------------
# Benchmark.
# --------------------------------------------------------------------------------------


def _time(fn, *args, reps: int = 15, inner: int = 20) -> float:
    """Median seconds per call: ``reps`` device-synchronized batches of ``inner`` calls."""
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / inner)
    return float(np.median(times))


def _nbytes(tree) -> int:
    return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(tree))


def _bits_equal(a: NVFP4Array, b: NVFP4Array) -> bool:
    def u(x):
        x = np.asarray(x)
        return x.view(np.uint8) if x.dtype.itemsize == 1 else x.view(np.uint32)
    return all(np.array_equal(u(x), u(y)) for x, y in
               ((a.data, b.data), (a.scales, b.scales), (a.amax, b.amax)))


def main(m: int = 8192, k: int = 8192, configs: Sequence[QuantizeConfig] | None = None,
         two_output_configs: Sequence[QuantizeConfig] | None = None, *, reps: int = 15,
         interpret: bool = False) -> list[dict]:
    """Benchmarks the kernels on the default device and prints a table.

    BF16 ``(m, k)`` -> NVFP4: 1D RNE (`quantize`) and the two-output RHT+SR variant
    (`quantize_rowwise_columnwise`), against the XLA path (``jax.jit(fp4jax.quantize)``)
    and the HBM copy bandwidth measured in the same run. Bytes counted: input read +
    codes/scales written (the amax pass's extra read is not counted, so "with amax pass"
    rows show the end-to-end cost against the same byte count). Each row is also checked
    bit for bit against the XLA reference on the same device.
    """
    dev = jax.devices()[0]
    x = (jax.random.normal(jax.random.key(0), (m, k), _F32)
         * jnp.exp2(jax.random.uniform(jax.random.key(1), (m, k), minval=-8, maxval=8))
         ).astype(jnp.bfloat16)
    rk, ck = jax.random.key(2), jax.random.key(3)
    in_bytes = m * k * 2
    rows: list[dict] = []

    def add(name, fn, out_bytes, check=None, *args):
        args = args or (x,)
        t = _time(fn, *args, reps=reps, inner=1 if interpret else 20)
        gbs = (in_bytes + out_bytes) / t / 1e9
        row = dict(name=name, us=t * 1e6, gbs=gbs)
        if check is not None:
            row["bit_exact"] = check()
        rows.append(row)
        print(f"{name:58s} {t * 1e6:9.1f} us {gbs:8.1f} GB/s"
              + (f"  bit-exact={row['bit_exact']}" if check is not None else ""), flush=True)
        return t

    copy = jax.jit(lambda a: a + jnp.bfloat16(1))  # read + write the same bytes
    t_copy = _time(copy, x, reps=reps)
    copy_gbs = 2 * in_bytes / t_copy / 1e9
    print(f"device: {dev.device_kind}  jax {jax.__version__}  shape {m}x{k} bf16")
    print(f"{'HBM copy (XLA x+1, read+write)':58s} {t_copy * 1e6:9.1f} us {copy_gbs:8.1f} GB/s")
    rows.append(dict(name="copy", us=t_copy * 1e6, gbs=copy_gbs))

    ref_1d = jax.jit(lambda a: fp4jax.quantize(a))
    r1 = ref_1d(x)
    out1 = _nbytes((r1.data, r1.scales))
    amax1 = r1.amax
    add("XLA jit(fp4jax.quantize) 1D RNE", ref_1d, out1)
    ref_2o = jax.jit(lambda a: reference_rowwise_columnwise(
        a, rounding="stochastic", row_key=rk, col_key=ck))
    r2 = ref_2o(x)
    out2 = _nbytes([(q.data, q.scales) for q in r2])
    add("XLA two-output (rowwise + columnwise RHT), SR", ref_2o, out2)

    for cfg in configs or (DEFAULT_CONFIG,):
        f = jax.jit(lambda a, cfg=cfg: quantize(a, config=cfg, interpret=interpret))
        add(f"kernel 1D RNE (amax pass) {_cfg_name(cfg)}", f, out1,
            lambda f=f: _bits_equal(f(x), r1))
        g = jax.jit(lambda a, s, cfg=cfg: quantize(a, amax=s, config=cfg, interpret=interpret))
        add(f"kernel 1D RNE (amax given) {_cfg_name(cfg)}", g, out1,
            lambda g=g: _bits_equal(g(x, amax1), r1), x, amax1)
    for cfg in two_output_configs or (TWO_OUTPUT_CONFIG,):
        f = jax.jit(lambda a, cfg=cfg: quantize_rowwise_columnwise(
            a, rounding="stochastic", row_key=rk, col_key=ck, config=cfg, interpret=interpret))
        add(f"kernel two-output RHT+SR (amax pass) {_cfg_name(cfg)}", f, out2,
            lambda f=f: all(_bits_equal(a, b) for a, b in zip(f(x), r2)))
        g = jax.jit(lambda a, s1, s2, cfg=cfg: quantize_rowwise_columnwise(
            a, rounding="stochastic", row_key=rk, col_key=ck, row_amax=s1, col_amax=s2,
            config=cfg, interpret=interpret))
        add(f"kernel two-output RHT+SR (amax given) {_cfg_name(cfg)}", g, out2,
            lambda g=g: all(_bits_equal(a, b) for a, b in zip(g(x, r2[0].amax, r2[1].amax), r2)),
            x, r2[0].amax, r2[1].amax)
        h = jax.jit(lambda a, cfg=cfg: quantize_rowwise_columnwise(
            a, row_amax=r1.amax, col_amax=r2[1].amax, config=cfg, interpret=interpret))
        add(f"kernel two-output RHT, RNE (amax given) {_cfg_name(cfg)}", h, out2)
    amax_pass = jax.jit(lambda a: _run_amax(a, True, hadamard_lib.DEFAULT_SIGNS, DEFAULT_CONFIG,
                                            interpret))
    add("amax pass alone (max|x| and max|RHT_col x|)", amax_pass, 0)
    for r in rows:
        r["frac_of_copy"] = r["gbs"] / copy_gbs
    print("\nfraction of copy bandwidth:")
    for r in rows:
        print(f"  {r['name']:58s} {r['frac_of_copy']:6.2f}")
    return rows


def _cfg_name(cfg: QuantizeConfig) -> str:
    return f"[{cfg.block_rows}x{cfg.block_cols} s{cfg.stages} c{cfg.ctas_per_sm}]"


if __name__ == "__main__":
    main()
