"""Register-level E2M1 decode shared by the GEMM kernels that decode straight from the
packed codes into ``wgmma`` operands (`gemm_skinny_decode`, `gemm_pipelined_decode`).

The integer recipe (`decode_pair`): of a 32-bit word of four code bytes, ``u`` and ``v``
are the low and high nibble planes (``w & 0x0F0F0F0F``, ``(w >> 4) & 0x0F0F0F0F``,
`nibble_planes`); one ``prmt`` per output register gathers its two codes into the low
bytes of the two 16-bit halves (zero bytes elsewhere: selector nibble `ZERO_BYTE`, the
sign of a byte <= 15), then ``y · (2**6 + 2**12)`` puts each code's bits 0-2 at bits
6-8 and bit 3 at bit 15 of its half (no carries: ``y`` has bits 0-3 and 16-19 only), and
one mask keeps exactly those: the BF16 pattern of ``e2m1(c) · 2**-126`` (code 1 is the
subnormal 2**-127, which the BF16 multiply by the block factor ``s · 2**118`` keeps).
Three integer instructions per two elements, plus the word's planes.

Also here: the Mosaic GPU layout helpers both kernels use (`tiled_layout`,
`pallas_layout`) and `selector`, the ``prmt`` selector of one output register.

Example:
  >>> from pallas_kernels import wgmma_regs
  >>> hex(wgmma_regs.SPREAD_MUL), hex(wgmma_regs.BF16_MASK)
  ('0x1040', '0x81c081c0')
  >>> hex(wgmma_regs.selector(2, 6))  # byte 2 of u (low nibbles), byte 2 of v (high)
  '0x8682'
"""

from __future__ import annotations

import jax.experimental.pallas.mosaic_gpu as plgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.mosaic.gpu.fragmented_array import TiledLayout, Tiling
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith

from pallas_kernels import gemm_decode as dec

NIBBLES = 0x0F0F0F0F
SPREAD_MUL = (1 << 6) | (1 << 12)
BF16_MASK = dec.MAG_MASK | dec.SIGN_MASK
ZERO_BYTE = 0x8
"""A ``prmt`` selector nibble giving a zero byte: the sign of a byte <= 15 (nibbles)."""


def i32(x: int) -> ir.Value:
    """An i32 constant (``x`` taken modulo 2**32)."""
    t = ir.IntegerType.get_signless(32)
    return arith.constant(t, ir.IntegerAttr.get(t, x - 2**32 if x >= 2**31 else x))


def tiled_layout(tiles, warp_dims, lane_dims, vector_dim) -> TiledLayout:
    """A canonical Mosaic GPU `TiledLayout` from its tiles and partitioned dims."""
    return TiledLayout(Tiling(tiles), warp_dims=warp_dims, lane_dims=lane_dims,
                       vector_dim=vector_dim, _check_canonical=False).canonicalize()


def pallas_layout(layout: TiledLayout):
    """The Pallas (``plgpu.Layout.TILED``) spelling of a Mosaic `TiledLayout`."""
    return plgpu.Layout.TILED(layout.tiling, warp_dims=layout.warp_dims,
                              lane_dims=layout.lane_dims, vector_dim=layout.vector_dim)


def selector(p0: int, p1: int) -> int:
    """``prmt`` selector putting source byte ``p0`` (0-3: ``u``, 4-7: ``v``) in the low
    byte of the low half and ``p1`` in the low byte of the high half, zeros elsewhere."""
    return p0 | ZERO_BYTE << 4 | p1 << 8 | ZERO_BYTE << 12


def nibble_planes(word: ir.Value) -> tuple[ir.Value, ir.Value]:
    """i32 of four code bytes -> (low nibbles, high nibbles), one per byte."""
    u = arith.andi(word, i32(NIBBLES))
    v = arith.andi(arith.shrui(word, i32(4)), i32(NIBBLES))
    return u, v


def decode_pair(u: ir.Value, v: ir.Value, sel: int) -> ir.Value:
    """The two codes `selector` ``sel`` names in the planes ``u``, ``v`` -> bf16x2
    ``e2m1 · 2**-126`` (low half: the first)."""
    y = mgpu_utils.prmt(u, v, i32(sel))
    bits = arith.andi(arith.muli(y, i32(SPREAD_MUL)), i32(BF16_MASK))
    return mgpu_utils.bitcast(bits, ir.VectorType.get((2,), ir.BF16Type.get()))


def decode_word(word: ir.Value, selectors) -> list[ir.Value]:
    """i32 of four code bytes -> one bf16x2 ``e2m1 · 2**-126`` per ``prmt`` selector."""
    u, v = nibble_planes(word)
    return [decode_pair(u, v, sel) for sel in selectors]
