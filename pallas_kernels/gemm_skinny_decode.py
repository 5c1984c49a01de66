"""Register layouts and in-register decode of the skinny NVFP4 GEMM (`pallas_kernels.gemm_skinny`).

The skinny kernel computes ``Cᵀ = Wᵀ · Xᵀ``: the weight is ``wgmma``'s register A
operand, ``WG_ROWS`` = 128 of its N columns per consumer warpgroup (two ``m64``
groups). The fprop weight is stored ``(K/2, N)``, codes packed along K, N contiguous,
so one 32-bit shared-memory load holds one byte (two K elements) of four adjacent
columns. The rows of A are those columns **in a permuted order** (`row_to_n`): a
thread's four WGMMA rows are exactly the four columns of its 32-bit word, so every
loaded byte decodes (two codes -> one ``bf16x2``, four integer ops, `_decode_word`)
into one A register, with no shuffles. The accumulator rows carry the same permutation; the
epilogue (`store_tile`) writes each thread's four adjacent outputs of one output row
as one vector, which undoes it.

* `CODES_LAYOUT` loads the ``(tile_k/2, 128)`` code tile (a thread: 4 bytes along N
  per register, no bank conflicts under the 128-byte swizzle),
* `SCALES_LAYOUT` loads the ``(tile_k/16, 8)`` 16×16-tile E4M3 scales (every thread
  the column of its 16-column group),
* `OUT_LAYOUT` is the ``(M, 128)`` output slice (a thread: 4 adjacent columns).

The register renamings between these and Mosaic's WGMMA layout are derived from the
layouts' definitions (`thread_view`, the tiling semantics documented in
``mosaic/gpu/fragmented_array.py``) and checked for every thread by the tests. Interpret
mode (CPU) decodes with ``jnp`` in the natural row order instead.

Example:
  >>> from pallas_kernels import gemm_skinny_decode as sd
  >>> [sd.row_to_n(r) for r in (0, 1, 4, 8, 16, 64)]  # a thread owns rows r, r+8, r+64, r+72
  [0, 4, 64, 1, 16, 2]
"""

from __future__ import annotations

import functools

import jax
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.mosaic.gpu.fragmented_array import Replicated, TiledLayout, Tiling
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, vector

from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.nvfp4_array import e2m1_to_f32
from pallas_kernels import gemm_decode as dec

WG_ROWS = 128
"""Weight columns (output columns) per consumer warpgroup: two ``m64`` wgmma groups."""

WG_SCALE_COLS = WG_ROWS // BLOCK
LOG2_DECODE_SCALE = dec.LOG2_DECODE_SCALE  # decoded weights are e2m1 · s · 2**-8
ACC_UNSCALE = np.float32(2.0**LOG2_DECODE_SCALE)  # the activations are decoded unscaled


def row_to_n(rho: int) -> int:
    """Weight column (within a warpgroup's 128) held by row ``rho`` of the A operand.

    A WGMMA row is ``64·mi + 16·warp + 8·h + r``; lane ``4r + c`` owns rows ``(mi, h)``
    in {0, 1}², which become the adjacent columns ``n0 + 2·mi + h`` of its 32-bit word,
    ``n0 = 64·(r // 4) + 16·warp + 4·(r % 4)`` (a conflict-free bank pattern).
    """
    mi, w, h, r = rho // 64, (rho // 16) % 4, (rho // 8) % 2, rho % 8
    return 64 * (r // 4) + 16 * w + 4 * (r % 4) + 2 * mi + h


def n_to_row(n: int) -> int:
    """Inverse of `row_to_n`."""
    a, w, b, e = n // 64, (n // 16) % 4, (n // 4) % 4, n % 4
    return 64 * (e // 2) + 16 * w + 8 * (e % 2) + 4 * a + b


def _layout(tiles, warp_dims, lane_dims, vector_dim) -> TiledLayout:
    return TiledLayout(Tiling(tiles), warp_dims=warp_dims, lane_dims=lane_dims,
                       vector_dim=vector_dim, _check_canonical=False).canonicalize()


def _pallas(layout: TiledLayout):
    return plgpu.Layout.TILED(layout.tiling, warp_dims=layout.warp_dims,
                              lane_dims=layout.lane_dims, vector_dim=layout.vector_dim)


# (tile_k/2, 128) bytes: byte row j = 4q + c, column n = 64a + 16·warp + 4b + e, lane
# 16a + 4b + c, register q, vector position e.
_CODES = _layout(((4, 128), (4, 64), (4, 16), (4, 4)), (-5,), (-7, -3, -2), -1)
# (tile_k/16, 8) scale bytes: thread (warp, lane 16a + ...) holds column 4a + warp.
_SCALES = _layout(((1, 8), (1, 4), (1, 1)), (-3,), (-5, Replicated(4), Replicated(4)), -1)
# (M, 128) output: row m = 8t + 2c + v, column n as in _CODES, vector position e.
_OUT = _layout(((8, 128), (8, 64), (8, 16), (8, 4), (2, 4)), (-7,), (-9, -5, -4), -1)
CODES_LAYOUT, SCALES_LAYOUT, OUT_LAYOUT = map(_pallas, (_CODES, _SCALES, _OUT))
MGPU_LAYOUTS = {"codes": _CODES, "scales": _SCALES, "out": _OUT, "wgmma": mgpu.WGMMA_LAYOUT}


def _tile_index(idx: np.ndarray, tiling: Tiling) -> np.ndarray:
    for tile in tiling.tiles:
        lead, dims = idx.shape[:-len(tile)], idx.shape[-len(tile):]
        idx = idx.reshape(*lead, *[v for d, t in zip(dims, tile) for v in (d // t, t)])
        nl = len(lead)
        idx = idx.transpose(*range(nl), *range(nl, nl + 2 * len(tile), 2),
                            *range(nl + 1, nl + 2 * len(tile), 2))
    return idx


def thread_view(layout: TiledLayout, shape: tuple[int, ...], warp: int, lane: int
                ) -> dict[tuple[tuple[int, ...], int], tuple[int, ...]]:
    """``{(register index, vector position): logical index}`` of one thread of a
    warpgroup under a `TiledLayout` (tiling, then warp/lane/vector partitioning, as
    documented in ``mosaic/gpu/fragmented_array.py``; replicated dims own copies)."""
    tiled = _tile_index(np.arange(int(np.prod(shape))).reshape(shape), layout.tiling)
    nd = tiled.ndim
    fixed = {}
    for dims, value in ((layout.warp_dims, warp), (layout.lane_dims, lane)):
        for d in reversed(dims):
            size = d.times if isinstance(d, Replicated) else tiled.shape[d]
            if not isinstance(d, Replicated):
                fixed[d % nd] = value % size
            value //= size
    out = {}
    for reg in np.ndindex(layout.registers_shape(shape)):
        pos = list(reg)
        for d, v in fixed.items():
            pos[d] = v
        for v in range(layout.vector_length):
            pos[layout.vector_dim % nd] = v
            out[(reg, v)] = tuple(int(i) for i in np.unravel_index(tiled[tuple(pos)], shape))
    return out


def _inverse(view):
    return {idx: key for key, idx in view.items()}


def decode_plan(tile_k: int, warp: int = 0, lane: int = 0) -> dict:
    """``{A register: (code register, byte, scale register)}`` for one thread: the A
    element pair ``(rho, κ..κ+1)`` is byte ``(κ/2, row_to_n(rho))`` of the code tile,
    scaled by ``(κ/16, row_to_n(rho)/16)``. The kernel uses thread 0's plan (the
    renaming must be the same in every thread; the tests check all of them)."""
    a = thread_view(mgpu.WGMMA_LAYOUT, (WG_ROWS, tile_k), warp, lane)
    codes = _inverse(thread_view(_CODES, (tile_k // 2, WG_ROWS), warp, lane))
    scales = _inverse(thread_view(_SCALES, (tile_k // BLOCK, WG_SCALE_COLS), warp, lane))
    plan = {}
    for (reg, v), (rho, kappa) in a.items():
        if v == 0:
            n = row_to_n(rho)
            code_reg, byte = codes[(kappa // 2, n)]
            plan[reg] = (code_reg, byte, scales[(kappa // BLOCK, n // BLOCK)][0])
    return plan


def store_plan(m: int, warp: int = 0, lane: int = 0) -> dict:
    """``{output register: [(accumulator register, vector position)] * 4}`` for one
    thread: output ``(mm, n)`` is accumulator element ``(n_to_row(n), mm)``."""
    acc = _inverse(thread_view(mgpu.WGMMA_LAYOUT, (WG_ROWS, m), warp, lane))
    out = thread_view(_OUT, (m, WG_ROWS), warp, lane)
    plan: dict = {}
    for (reg, _pos), (mm, n) in sorted(out.items()):  # vector positions in order
        plan.setdefault(reg, []).append(acc[(n_to_row(n), mm)])
    return plan


_cached_decode_plan = functools.cache(decode_plan)
_cached_store_plan = functools.cache(store_plan)


def _i32(x: int) -> ir.Value:
    i32 = ir.IntegerType.get_signless(32)
    return arith.constant(i32, ir.IntegerAttr.get(i32, x - 2**32 if x >= 2**31 else x))


def _scale_factor(reg: ir.Value) -> ir.Value:
    """One E4M3 scale byte -> bf16x2 ``s · 2**118`` (exact).

    ``(b & 0x7F) << 7`` is the float16 pattern of ``s · 2**-8`` (subnormal scales
    included); widening to float32 and multiplying by ``2**126`` is exact.
    """
    i8, i16 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(16)
    f16, f32, bf16 = ir.F16Type.get(), ir.F32Type.get(), ir.BF16Type.get()
    b = arith.extui(i16, mgpu_utils.bitcast(reg, i8))
    bits = arith.shli(arith.andi(b, arith.constant(i16, 0x7F)), arith.constant(i16, 7))
    s = arith.extf(f32, arith.bitcast(f16, bits))
    s = arith.mulf(s, arith.constant(f32, ir.FloatAttr.get(f32, 2.0**126)))
    return vector.broadcast(ir.VectorType.get((2,), bf16), arith.truncf(bf16, s))


# Decode of one 32-bit word of four code bytes (four columns, two K elements each):
# u, v = its low and high nibbles (bytes <= 15); prmt gathers byte e's pair as
# y = lo | hi << 16 (selector nibble 8: a zero byte, the sign of a byte <= 15); then
# y · (2**6 + 2**12) puts each code's bits 0-2 at 6-8 and bit 3 at 15 of its half
# (no carries: y has bits 0-3 and 16-19 only), and one mask keeps exactly those: the
# BF16 pattern of e2m1(c) · 2**-126.
NIBBLES = 0x0F0F0F0F
PAIR_SELECTORS = tuple(e | 0x80 | (4 + e) << 8 | 0x8000 for e in range(4))
SPREAD_MUL = (1 << 6) | (1 << 12)
BF16_MASK = dec.MAG_MASK | dec.SIGN_MASK


def _decode_word(word: ir.Value) -> list[ir.Value]:
    """i32 of four code bytes -> four bf16x2 ``e2m1 · 2**-126`` (low, high code)."""
    u = arith.andi(word, _i32(NIBBLES))
    v = arith.andi(arith.shrui(word, _i32(4)), _i32(NIBBLES))
    bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
    out = []
    for sel in PAIR_SELECTORS:
        y = mgpu_utils.prmt(u, v, _i32(sel))
        bits = arith.andi(arith.muli(y, _i32(SPREAD_MUL)), _i32(BF16_MASK))
        out.append(mgpu_utils.bitcast(bits, bf16x2))
    return out


def _decode_mgpu(codes: mgpu.FragmentedArray, scales: mgpu.FragmentedArray,
                 tile_k: int) -> mgpu.FragmentedArray:
    i32 = ir.IntegerType.get_signless(32)
    pairs = {idx: _decode_word(mgpu_utils.bitcast(r, i32))
             for idx, r in np.ndenumerate(codes.registers)}
    factors = {idx: _scale_factor(r) for idx, r in np.ndenumerate(scales.registers)}
    layout = mgpu.WGMMA_LAYOUT
    regs = np.empty(layout.registers_shape((WG_ROWS, tile_k)), dtype=object)
    for dst, (src, byte, sreg) in _cached_decode_plan(tile_k).items():
        regs[dst] = arith.mulf(pairs[src][byte], factors[sreg])
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)


def _interpret_decode(tile_ref, scale_ref) -> jax.Array:
    """Interpret mode: the (128, tile_k) A tile in the natural row order, exact values."""
    b = tile_ref[...]
    vals = jnp.stack([e2m1_to_f32(b & 0xF), e2m1_to_f32(b >> 4)], axis=1)
    vals = vals.reshape(2 * b.shape[0], b.shape[1])  # (tile_k, 128)
    s = jax.lax.bitcast_convert_type(scale_ref[...], jnp.float8_e4m3fn).astype(jnp.float32)
    s = jnp.repeat(jnp.repeat(s, BLOCK, axis=0), BLOCK, axis=1)
    return (vals * s * dec.SCALE_FACTOR_EXACT).astype(jnp.bfloat16).T


def decode_tile(tile_ref, scale_ref, *, interpret: bool) -> jax.Array:
    """Decodes one warpgroup's weight tile into wgmma's register A operand.

    Args:
      tile_ref: (tile_k/2, 128) uint8 codes in SMEM (packed along K, 128-byte swizzle).
      scale_ref: (tile_k/16, 8) uint8 E4M3 scale bits of its 16×16 tiles, in SMEM.
      interpret: use the interpret-mode implementation (natural row order).

    Returns:
      (128, tile_k) bf16 ``e2m1 · s · 2**-8`` in the WGMMA layout, row ``rho`` holding
      weight column `row_to_n` (rho) (interpret mode: column ``rho``).
    """
    if interpret:
        return _interpret_decode(tile_ref, scale_ref)
    tile_k = 2 * tile_ref.shape[0]
    codes = plgpu.load(tile_ref, layout=CODES_LAYOUT)
    scales = plgpu.load(scale_ref, layout=SCALES_LAYOUT)
    return plgpu.inline_mgpu(
        arg_types=(CODES_LAYOUT, SCALES_LAYOUT),
        return_type=plgpu.ShapeDtypeStruct((WG_ROWS, tile_k), jnp.bfloat16,
                                           layout=plgpu.Layout.WGMMA),
    )(lambda ctx, c, s: _decode_mgpu(c, s, tile_k))(codes, scales)


def _store_mgpu(acc: mgpu.FragmentedArray, ref: ir.Value) -> None:
    m = acc.shape[1]
    el = ir.VectorType(acc.registers.flat[0].type).element_type
    vec4 = ir.VectorType.get((4,), el)
    regs = np.empty(_OUT.registers_shape((m, WG_ROWS)), dtype=object)
    for dst, srcs in _cached_store_plan(m).items():
        regs[dst] = vector.from_elements(
            vec4, [vector.extract(acc.registers[r], [], [v]) for r, v in srcs])
    out = mgpu.FragmentedArray(_registers=regs, _layout=_OUT, _is_signed=None)
    out.store_untiled(ref, optimized=False)


def store_tile(acc: jax.Array, out_ref, *, interpret: bool) -> None:
    """Stores a (128, M) accumulator tile (rows as `decode_tile` made them) to the
    (M, 128) output slice ``out_ref`` in global memory, transposed."""
    if interpret:
        out_ref[...] = acc.T
        return
    plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()))(
        lambda ctx, a, r: _store_mgpu(a, r))(acc, out_ref)
