"""NVFP4 quantize / dequantize: the pure-JAX reference (docs/RECIPE.md §2–§5).

These functions are exact to the bit with Transformer Engine's reference quantizer
(global scales, E4M3 block-scale bits, E2M1 codes, dequantized values) on float32,
bfloat16 and float16 inputs, eagerly and under ``jit`` on CPU and GPU: every
rounding is written so that XLA cannot elide it (see `fp4jax.numerics.rounding`).
The Pallas kernels are tested against this module.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax.numerics import checks, layout, random_bits, scales
from fp4jax.numerics import hadamard as hadamard_lib
from fp4jax.numerics import rounding as rnd
from fp4jax.numerics.constants import BLOCK, E2M1_MAX
from fp4jax.numerics.nvfp4_array import (
    NVFP4Array,
    e2m1_to_bf16,
    e2m1_to_f32,
    e4m3_to_f32,
    pack_codes,
    unpack_codes,
)
from fp4jax.numerics.rounding import Rounding
from fp4jax.numerics.scales import ScaleRule

_F32 = jnp.float32


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
    scale_rule: ScaleRule = "six",
) -> NVFP4Array:
    """The pure-JAX reference of `fp4jax.quantize` (same arguments, without ``impl``).

    Every step is float32 in docs/RECIPE.md §2's order, each rounding elision-proof;
    the Pallas kernels must equal this bit for bit. See `fp4jax.quantize` for the
    arguments, padding and non-finite semantics.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from fp4jax.reference import quantization
      >>> q = quantization.quantize(jnp.linspace(-6.0, 6.0, 32).reshape(2, 16))
      >>> quantization.dequantize(q)[0, :3].tolist()
      [-6.0, -6.0, -6.0]
    """
    x, axis, hadamard_signs, amax = checks.check_quantize_arguments(
        x, axis=axis, block_2d=block_2d, rounding=rounding, key=key, hadamard=hadamard,
        hadamard_signs=hadamard_signs, amax=amax, scale_rule=scale_rule)
    return _quantize(
        x, key if rounding == "stochastic" else None, amax, axis=axis, block_2d=bool(block_2d),
        rounding=rounding, hadamard=bool(hadamard), signs=hadamard_signs, scale_rule=scale_rule,
    )


@functools.partial(
    jax.jit, static_argnames=("axis", "block_2d", "rounding", "hadamard", "signs", "scale_rule")
)
def _quantize(
    x, key, amax, *, axis, block_2d, rounding, hadamard, signs, scale_rule
) -> NVFP4Array:
    dtype = x.dtype
    tile_axis = layout.tile_axis_for(axis, x.ndim) if block_2d else None
    n = x.shape[axis]
    x = layout.whole_blocks_per_shard(x, (axis,) if tile_axis is None else (axis, tile_axis))
    # Re-round to the input dtype with integer ops: under jit on the GPU, XLA may have
    # deleted a float32 -> bfloat16 -> float32 round trip just before this call (excess
    # precision), handing us unrounded values. A no-op for values already in the dtype.
    xf = rnd.round_to_dtype(x.astype(_F32), dtype)
    if hadamard:
        xf = hadamard_lib.rht(xf, axis, signs, round_to=dtype)
    padded = layout.num_blocks(n) * BLOCK
    xf = layout.pad_axis(xf, axis, padded)

    # Non-finite inputs poison the stored amax (so every decoded value is NaN), while
    # codes and scales are computed from the finite values only: their bits never depend
    # on a backend's NaN semantics for min/max.
    finite = jnp.isfinite(xf)
    xf = jnp.where(finite, xf, np.float32(0.0))
    amax_x = jnp.max(jnp.abs(xf))
    poisoned = ~jnp.all(finite)
    if amax is not None:
        poisoned = poisoned | ~jnp.isfinite(amax)
        amax_x = jnp.where(jnp.isfinite(amax), amax, amax_x)
    ges = scales.global_encode_scale(amax_x)
    gds = rnd.div_rn(np.float32(1.0), ges)
    # One division per E4M3 code (128 per tensor), not one per block.
    enc_table = scales.block_encode_scale_table(gds)
    # The scalar scales and the table are computed once: without the barrier XLA
    # duplicates their integer long divisions into every fusion that reads them, which
    # multiplies the program size (compile time) and, in per-element fusions, the work.
    ges, enc_table = lax.optimization_barrier((ges, enc_table))
    amax = jnp.where(poisoned, np.float32(np.nan), amax_x).astype(_F32)

    perm = layout.canonical_perm(x.ndim, axis, tile_axis)
    inv = tuple(int(i) for i in np.argsort(perm))
    xc = jnp.transpose(xf, perm)  # (..., [T,] L) with L = padded, quantized axis last
    lead = xc.shape[:-1]
    nb = padded // BLOCK
    blocks = xc.reshape(*lead, nb, BLOCK)
    absb = jnp.abs(blocks)

    if block_2d:
        t = lead[-1]
        tb = layout.num_blocks(t)
        tiles = layout.pad_axis(absb, absb.ndim - 3, tb * BLOCK)
        tiles = tiles.reshape(*lead[:-1], tb, BLOCK, nb, BLOCK)
        bamax = jnp.max(tiles, axis=(-3, -1))  # (..., tb, nb): one per 16x16 tile
    else:
        bamax = jnp.max(absb, axis=-1)  # (..., nb)

    def per_row_block(t):  # a per-block (per-tile in 2D) array, one entry per 1x16 block
        return layout.repeat_each(t, BLOCK, -2)[..., : lead[-1], :] if block_2d else t

    s = scales.block_decode_scale(bamax, ges)  # float32 holding the exact E4M3 value
    s_el = per_row_block(s)
    enc = scales.lookup_encode_scales(enc_table, s_el)
    v = jnp.clip(blocks * enc[..., None], -E2M1_MAX, E2M1_MAX)
    a = jnp.abs(v)
    if rounding == "nearest":
        mag = rnd.e2m1_code_nearest(a)
    else:
        grid = tuple(nb if d == axis else n_d for d, n_d in enumerate(x.shape))
        u8 = random_bits.block_bytes(key, random_bits.block_index(grid, perm))
        mag = rnd.e2m1_code_stochastic(a, u8)
    codes = mag | jnp.where(v < 0, jnp.uint8(8), jnp.uint8(0))
    if scale_rule == "four_over_six":
        s, codes = _four_over_six(blocks, bamax, ges, enc_table, s, codes, block_2d,
                                  per_row_block)
    codes = codes.reshape(*lead, padded)

    data = jnp.transpose(pack_codes(codes, -1), inv)
    block_scales = jnp.transpose(s.astype(jnp.float8_e4m3fn), inv)
    return NVFP4Array(
        data=data,
        scales=block_scales,
        amax=amax,
        shape=tuple(x.shape),
        dtype=dtype,
        axis=axis,
        block_2d=block_2d,
        hadamard=hadamard,
    )


def _four_over_six(blocks, bamax, ges, enc_table, s6, codes6, block_2d, per_row_block):
    """Docs/RECIPE.md §2.8: per block (tile), the scale mapping its amax to 4 replaces the
    one mapping it to 6 (with its codes) iff its squared error is strictly lower."""
    s4 = scales.block_decode_scale_four(bamax, ges)
    s4_el = per_row_block(s4)
    v4 = jnp.clip(blocks * scales.lookup_encode_scales(enc_table, s4_el)[..., None],
                  -E2M1_MAX, E2M1_MAX)
    codes4 = rnd.e2m1_code_nearest(jnp.abs(v4)) | jnp.where(v4 < 0, jnp.uint8(8), jnp.uint8(0))
    errors = []
    for s_el, c in ((per_row_block(s6), codes6), (s4_el, codes4)):
        e = scales.block_squared_error(blocks, e2m1_to_f32(c), s_el, ges)  # (..., [T,] nb)
        if block_2d:  # rows padded to whole tiles (zero rows add zero error), then a tree
            t = e.shape[-2]
            tb = layout.num_blocks(t)
            e = layout.pad_axis(e, e.ndim - 2, tb * BLOCK)
            e = scales.tile_error(e.reshape(*e.shape[:-2], tb, BLOCK, e.shape[-1]), -2)
        errors.append(e)
    use4 = errors[1] < errors[0]  # ties keep the 6 candidate
    codes = jnp.where(per_row_block(use4)[..., None], codes4, codes6)
    return jnp.where(use4, s4, s6), codes


def dequantize(q: NVFP4Array, dtype: Any = jnp.float32) -> jax.Array:
    """The pure-JAX decode behind `fp4jax.dequantize` (docs/RECIPE.md §2.7); see there.

    Example:
      >>> import jax.numpy as jnp
      >>> from fp4jax.reference import quantization
      >>> x = jnp.array([[0.0, 1.0, -2.0, 6.0] * 4])
      >>> quantization.dequantize(quantization.quantize(x))[0, :4].tolist()
      [0.0, 1.0, -2.0, 6.0]
    """
    if not isinstance(q, NVFP4Array):
        raise TypeError(f"dequantize expects an NVFP4Array, got {type(q).__name__}")
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"dequantize needs a floating output dtype, got {dtype}")
    return _dequantize(q, dtype=dtype)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _dequantize(q: NVFP4Array, *, dtype) -> jax.Array:
    vals = e2m1_to_f32(unpack_codes(q.data, q.axis))
    factor = scales.element_decode_factor(e4m3_to_f32(q.scales), q.amax)
    x = lax.slice_in_dim(vals * q.per_element(factor), 0, q.shape[q.axis], axis=q.axis)
    return x.astype(dtype)


def scaled_codes_bf16(q: NVFP4Array, *, column_pairs: bool = False) -> jax.Array:
    """``code · s`` per element in bfloat16, without the global scale (exact).

    This is the operand an emulated NVFP4 GEMM feeds to a BF16 matrix unit
    (docs/RECIPE.md §9): E2M1 × E4M3 has at most 6 significant bits and fits BF16's range,
    so the product is exact. Padding is dropped.

    Codes packed along the last axis are decoded in place, two elements per uint32.
    Codes packed along the second-to-last axis are decoded through the ``.mT`` view
    (a transpose XLA fuses into the decode), or with ``column_pairs`` in their stored
    orientation as uint32 pairs of adjacent columns: no transpose, but XLA's SPMD
    partitioner does not carry a sharding through that formulation (it all-gathers
    the operand), so callers ask for it on single-device programs only.
    """
    if q.axis < q.ndim - 2:
        vals = e2m1_to_bf16(unpack_codes(q.data, q.axis))
        s = q.per_element(q.scales.astype(jnp.bfloat16))
        return lax.slice_in_dim(vals * s, 0, q.shape[q.axis], axis=q.axis)
    if q.axis == q.ndim - 2 and not (column_pairs and q.data.shape[-1] % 2 == 0):
        return jnp.swapaxes(scaled_codes_bf16(q.mT), -1, -2)
    s = layout.repeat_each(q.scales.astype(jnp.bfloat16), BLOCK // 2, q.axis)  # per byte
    if q.block_2d:
        t = q.tile_axis
        s = lax.slice_in_dim(layout.repeat_each(s, BLOCK, t), 0, q.shape[t], axis=t)
    if q.axis == q.ndim - 1:
        # The two nibbles' BF16 bit patterns are joined into one uint32 (the even element
        # in the low half), so the interleave is a bitcast.
        vals = _bf16_pairs(q.data & 0xF, q.data >> 4, s, s).reshape(
            *q.data.shape[:-1], 2 * q.data.shape[-1])
    else:
        # Byte row j gives output rows 2j and 2j+1: one elementwise map over a (rows/2,
        # 2, cols/2) uint32 output, two adjacent columns per uint32 (a stack of the two
        # rows would be an XLA concatenate, emitted at a fraction of the bandwidth).
        r2, c = q.data.shape[-2:]
        d2 = q.data.reshape(*q.data.shape[:-1], c // 2, 2)[..., None, :, :]  # (.., r2, 1, c/2, 2)
        shift = lax.broadcasted_iota(jnp.uint8, (2, 1, 1), 0) * jnp.uint8(4)  # row 2j + p
        codes = (d2 >> shift) & 0xF  # (..., r2, 2, c/2, 2)
        s2 = s.reshape(*s.shape[:-1], c // 2, 2)[..., None, :, :]
        vals = _bf16_pairs(codes[..., 0], codes[..., 1], s2[..., 0], s2[..., 1])
        # One merge per reshape: JAX infers the sharding of a merge of a (possibly
        # sharded) axis with an unsharded one, not of two at once.
        vals = vals.reshape(*vals.shape[:-2], c).reshape(*q.data.shape[:-2], 2 * r2, c)
    return lax.slice_in_dim(vals, 0, q.shape[q.axis], axis=q.axis)


def _bf16_pairs(even_codes, odd_codes, even_scales, odd_scales) -> jax.Array:
    """``code · s`` of two codes per position as adjacent BF16 values (shape ``(..., 2)``),
    joined as one uint32 of two bit patterns, the even element in the low half."""
    halves = [lax.bitcast_convert_type(e2m1_to_bf16(c) * s, jnp.uint16).astype(jnp.uint32)
              for c, s in ((even_codes, even_scales), (odd_codes, odd_scales))]
    return lax.bitcast_convert_type(halves[0] | (halves[1] << 16), jnp.bfloat16)
