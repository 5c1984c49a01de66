"""In-register decode and transposed store of the skinny NVFP4 GEMM (`pallas_kernels.gemm_skinny`).

`decode_tile` turns a warpgroup's tile of packed weight codes (as stored) and its
16×16-tile E4M3 scale bytes into ``wgmma``'s register A operand, ``e2m1 · s · 2**-8`` in
BF16 (exact), with the row and column permutations of its `gemm_skinny_layouts.Variant`;
`store_tile` writes the accumulator, un-permuting the rows, straight from registers to
the output in global memory. Both are written at the Mosaic GPU level
(``plgpu.inline_mgpu``); the register renamings are `gemm_skinny_layouts.decode_plan`
and `store_plan`. Interpret mode (CPU) decodes with ``jnp`` in the natural row order
(the column permutation is kept: the activations are permuted to match it).

Integer recipe (`pallas_kernels.wgmma_regs.decode_word`): of a 32-bit word of four code
bytes, ``u`` and ``v`` are the low and high nibbles (``w & 0x0F0F0F0F``,
``(w >> 4) & 0x0F0F0F0F``); one ``prmt`` per A register gathers its two codes into the
low bytes of the two halves (zero bytes elsewhere: selector nibble 8, the sign of a
byte <= 15), then ``y · (2**6 + 2**12)`` puts each code's bits 0-2 at bits 6-8 and bit 3
at bit 15 of its half (no carries: ``y`` has bits 0-3 and 16-19 only), and one mask
keeps exactly those: the BF16 pattern of ``e2m1(c) · 2**-126`` (code 1 a subnormal, kept
by the BF16 multiply), times the BF16 factor ``s · 2**118``.

Example:
  >>> from pallas_kernels import gemm_skinny_decode as sd
  >>> hex(sd.SPREAD_MUL), hex(sd.BF16_MASK)
  ('0x1040', '0x81c081c0')
"""

from __future__ import annotations

import jax
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, vector

from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.nvfp4_array import e2m1_to_f32
from pallas_kernels import gemm_decode as dec
from pallas_kernels import gemm_skinny_layouts as sl
from pallas_kernels.gemm_skinny_layouts import WG_ROWS, Variant
from pallas_kernels.wgmma_regs import BF16_MASK, NIBBLES, SPREAD_MUL  # noqa: F401 - tests
from pallas_kernels.wgmma_regs import decode_word as _decode_word
from pallas_kernels.wgmma_regs import i32 as _i32
from pallas_kernels.wgmma_regs import pallas_layout as _pallas

LOG2_DECODE_SCALE = dec.LOG2_DECODE_SCALE  # decoded weights are e2m1 · s · 2**-8
ACC_UNSCALE = np.float32(2.0**LOG2_DECODE_SCALE)  # the activations are decoded unscaled

SCALE_EXP_BIAS = 127 + 118 - 10  # f32 exponent field of 2**(e - 10 + 118)


def _scale_factor(reg: ir.Value, pos: int) -> ir.Value:
    """One E4M3 scale byte -> bf16x2 ``s · 2**118`` (exact for every byte: signs,
    subnormal scales, NaN).

    ``s = mant · 2**(e - 10)`` with ``mant = m + 8`` and ``e`` the exponent field for a
    normal scale, ``mant = m`` and ``e = 1`` for a subnormal one; ``mant`` converts to
    float32 exactly and the power of two is built from its bits, so no subnormal number
    is ever formed (the result is at least ``2**109``).
    """
    i32, f32, bf16 = ir.IntegerType.get_signless(32), ir.F32Type.get(), ir.BF16Type.get()
    b = arith.extui(i32, vector.extract(reg, [], [pos]))
    e = arith.andi(arith.shrui(b, _i32(3)), _i32(15))
    normal = arith.cmpi(arith.CmpIPredicate.ne, e, _i32(0))
    mant = arith.ori(arith.andi(b, _i32(7)), arith.select(normal, _i32(8), _i32(0)))
    pow2 = arith.shli(arith.addi(arith.select(normal, e, _i32(1)), _i32(SCALE_EXP_BIAS)),
                      _i32(23))
    s = arith.mulf(arith.uitofp(f32, mant), arith.bitcast(f32, pow2))
    bits = arith.ori(arith.bitcast(i32, s), arith.shli(arith.andi(b, _i32(0x80)), _i32(24)))
    nan = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(b, _i32(0x7F)), _i32(0x7F))
    bits = arith.select(nan, _i32(0x7FC00000), bits)
    s = arith.truncf(bf16, arith.bitcast(f32, bits))
    return vector.broadcast(ir.VectorType.get((2,), bf16), s)


def _decode_mgpu(variant: Variant, codes: mgpu.FragmentedArray,
                 scales: mgpu.FragmentedArray, tile_k: int) -> mgpu.FragmentedArray:
    i32 = ir.IntegerType.get_signless(32)
    plan = sl.cached_decode_plan(variant, tile_k)
    selectors: dict = {}
    for src, sel, _ in plan.values():
        selectors.setdefault(src, []).append(sel)
    pairs = {}
    for src, sels in selectors.items():
        sels = sorted(set(sels))
        word = mgpu_utils.bitcast(codes.registers[src], i32)
        pairs.update({(src, sel): r for sel, r in zip(sels, _decode_word(word, sels))})
    factors = {key: _scale_factor(scales.registers[key[0]], key[1])
               for key in {sreg for _, _, sreg in plan.values()}}
    layout = mgpu.WGMMA_LAYOUT
    regs = np.empty(layout.registers_shape((WG_ROWS, tile_k)), dtype=object)
    for dst, (src, sel, sreg) in plan.items():
        regs[dst] = arith.mulf(pairs[(src, sel)], factors[sreg])
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)


def column_permutation(variant: Variant, tile_k: int) -> np.ndarray:
    """A column κ holds contraction column ``perm[κ]`` (within a tile of ``tile_k``)."""
    k = np.arange(tile_k)
    return 16 * (k // 16) + np.array([variant.col(c) for c in range(16)])[k % 16]


def _interpret_decode(variant: Variant, tile_ref, scale_ref) -> jax.Array:
    """Interpret mode: the (128, tile_k) A tile, rows in the natural order, exact values."""
    b = tile_ref[...]
    lo, hi = e2m1_to_f32(b & 0xF), e2m1_to_f32(b >> 4)
    s = jax.lax.bitcast_convert_type(scale_ref[...], jnp.float8_e4m3fn).astype(jnp.float32)
    s = jnp.repeat(jnp.repeat(s, BLOCK, axis=0), BLOCK, axis=1)
    vals = jnp.stack([lo, hi], axis=1).reshape(2 * b.shape[0], b.shape[1]) * s
    if variant.name == "fprop":  # (tile_k, 128) -> (128, tile_k)
        vals = vals.T
    else:  # (128, tile_k), columns permuted: 8q + 2c + v holds 4c + 2q + v of a block
        vals = vals.reshape(WG_ROWS, -1, 4, 2, 2).transpose(0, 1, 3, 2, 4)
        vals = vals.reshape(WG_ROWS, -1)
    return (vals * dec.SCALE_FACTOR_EXACT).astype(jnp.bfloat16)


def decode_tile(variant: Variant, tile_ref, scale_ref, *, interpret: bool) -> jax.Array:
    """Decodes one warpgroup's weight tile into wgmma's register A operand.

    Args:
      variant: the operand layout (`gemm_skinny_layouts.FPROP` or ``DGRAD``).
      tile_ref: the warpgroup's code tile in SMEM, ``variant.codes_shape(tile_k)``
        (128-byte swizzle).
      scale_ref: its E4M3 scale bits in SMEM, ``variant.scales_shape(tile_k)``.
      interpret: use the interpret-mode implementation (natural row order).

    Returns:
      (128, tile_k) bf16 ``e2m1 · s · 2**-8`` in the WGMMA layout: row ``rho`` holds
      output column ``variant.row(rho)`` (interpret mode: ``rho``), column κ contraction
      column `column_permutation` [κ].
    """
    if interpret:
        return _interpret_decode(variant, tile_ref, scale_ref)
    tile_k = 2 * tile_ref.shape[0] if variant.name == "fprop" else tile_ref.shape[1]
    codes_layout, scales_layout = _pallas(variant.codes), _pallas(variant.scales)
    codes = plgpu.load(tile_ref, layout=codes_layout)
    scales = plgpu.load(scale_ref, layout=scales_layout)
    return plgpu.inline_mgpu(
        arg_types=(codes_layout, scales_layout),
        return_type=plgpu.ShapeDtypeStruct((WG_ROWS, tile_k), jnp.bfloat16,
                                           layout=plgpu.Layout.WGMMA),
    )(lambda ctx, c, s: _decode_mgpu(variant, c, s, tile_k))(codes, scales)


def _store_mgpu(variant: Variant, acc: mgpu.FragmentedArray, ref: ir.Value) -> None:
    m = acc.shape[1]
    el = ir.VectorType(acc.registers.flat[0].type).element_type
    regs = np.empty(variant.out.registers_shape((m, WG_ROWS)), dtype=object)
    for dst, srcs in sl.cached_store_plan(variant, m).items():
        regs[dst] = vector.from_elements(
            ir.VectorType.get((len(srcs),), el),
            [vector.extract(acc.registers[r], [], [v]) for r, v in srcs])
    out = mgpu.FragmentedArray(_registers=regs, _layout=variant.out, _is_signed=None)
    out.store_untiled(ref, optimized=False)


def store_tile(variant: Variant, acc: jax.Array, out_ref, *, interpret: bool) -> None:
    """Stores a (128, M) accumulator tile (rows as `decode_tile` made them) to the
    (M, 128) output slice ``out_ref`` in global memory, transposed."""
    if interpret:
        out_ref[...] = acc.T
        return
    plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()))(
        lambda ctx, a, r: _store_mgpu(variant, a, r))(acc, out_ref)
