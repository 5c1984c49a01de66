"""In-kernel NVFP4 decode for the Hopper GEMM (`pallas_kernels.gemm_kernel`).

Register layouts of the packed and decoded tiles, the integer recipes that turn two
E2M1 codes into one ``bf16x2`` word, the register renamings between them (written at
the Mosaic GPU level with ``plgpu.inline_mgpu``), and the Pallas-level helpers the
kernel calls. Interpret mode (CPU) runs the same helpers with ``jnp`` stand-ins for the
inline Mosaic GPU code; `tests/kernels/test_gemm_decode.py` checks the bit recipes
and the renamings against Mosaic's layout definitions on the CPU.

Example:
  >>> import jax.numpy as jnp
  >>> from pallas_kernels import gemm_decode
  >>> s = jnp.array([1.0, 448.0], jnp.float8_e4m3fn)  # E4M3 block scales
  >>> gemm_decode.scale_factors(s, subnormal=False).tolist()  # s * 2**-8, exact in BF16
  [0.00390625, 1.75]
"""

from __future__ import annotations

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, vector

from fp4jax.numerics.constants import BLOCK

# Register layouts (see jax.experimental.mosaic.gpu.fragmented_array.TiledLayout).

# Packed bytes of a tile packed along its minor axis, (rows, bytes): every thread
# holds single bytes placed so that byte j's two codes are exactly the elements
# (2j, 2j+1) a thread holds in the WGMMA layout of the decoded (rows, 2·bytes) tile.
ROWS_BYTES_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((64, 4), (16, 4), (8, 4), (1,))),
    warp_dims=(-7,),
    lane_dims=(-3, -2),
    vector_dim=-1,
)
# Packed bytes of a tile packed along its major axis, (rows/2, cols): each warp
# covers 4 packed rows × 16 columns, two adjacent bytes (one 16-bit load) per lane.
COLS_BYTES_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((8, 64), (4, 16), (2,))),
    warp_dims=(-4,),
    lane_dims=(-3, -2),
    vector_dim=-1,
)
# The decoded (rows, cols) tile: rows 2j and 2j+1 (the low and high codes of
# packed row j) live in the same thread, so a store of one register by a warp
# touches 8 rows × 16 columns without bank conflicts in a 128B-swizzled tile.
COLS_DECODED_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((16, 64), (8, 16), (2, 16), (2,))),
    warp_dims=(-6,),
    lane_dims=(-5, -2),
    vector_dim=-1,
)
_ROW_VECTOR_LAYOUT = plgpu.Layout.WGMMA.reduce(1)  # one value per row of a WGMMA tile
_COL_SCALE_LAYOUT = COLS_BYTES_LAYOUT.reduce(0)  # one value per column, _COLS_BYTES

LOG2_DECODE_SCALE = 8  # decoded elements are e2m1 · s · 2**-8
SCALE_FACTOR_SUBNORMAL = np.float32(2.0 ** (126 - LOG2_DECODE_SCALE))  # × e2m1·2**-126
SCALE_FACTOR_EXACT = np.float32(2.0 ** -LOG2_DECODE_SCALE)  # × e2m1 (interpret, "normal")
ACC_UNSCALE = np.float32(2.0 ** (2 * LOG2_DECODE_SCALE))

# Bit recipes of the GPU decode (mirrored in numpy by the tests).
MAG_MASK = 0x01C001C0  # bits 6..8 of both bf16 halves: (c & 7) << 6
SIGN_MASK = 0x80008000  # bit 15 of both halves: (c & 8) << 12
ROWS_MAG_MUL = (1 << 6) | (1 << 18)  # byte b: low code -> bits 6..8, high -> 22..24
ROWS_SIGN_MUL = (1 << 12) | (1 << 24)  # byte b: bit 3 -> 15, bit 7 -> 31
COLS_SPREAD = 0x4140  # prmt selector: bytes [b0, 0, b1, 0]
COLS_SHIFTS = {"even": (6, 12), "odd": (2, 8)}  # (magnitude, sign) left shifts
NORMAL_BIAS = 0x3F003F00  # decode="normal": (c & 7) << 6 + 0x3F00 = bf16 of .5 ... 6


def _i32(x: int) -> ir.Value:
    i32 = ir.IntegerType.get_signless(32)
    if x >= 2**31:
        x -= 2**32
    return arith.constant(i32, ir.IntegerAttr.get(i32, x))


def _bf16x2_from_parts(mag: ir.Value, sign: ir.Value, decode: str) -> ir.Value:
    """Two codes' magnitude bits ``(c & 7) << 6`` and sign bits (one i32) -> bf16x2.

    ``"subnormal"``: the BF16 patterns of ``e2m1(c) · 2**-126``. ``"normal"``: the exact
    ``e2m1(c)``, via ``r = bf16((c & 7) << 6 + 0x3F00)`` ∈ {.5, .75, 1, 1.5, 2, 3, 4, 6}
    and ``min(r, 2r - 1)`` (which is 0 and .5 for the first two, r otherwise).
    """
    bf16 = ir.BF16Type.get()
    bf16x2 = ir.VectorType.get((2,), bf16)
    if decode == "subnormal":
        return mgpu_utils.bitcast(arith.ori(mag, sign), bf16x2)
    r = mgpu_utils.bitcast(arith.addi(mag, _i32(NORMAL_BIAS)), bf16x2)
    two = vector.broadcast(bf16x2, arith.constant(bf16, ir.FloatAttr.get(bf16, 2.0)))
    one = vector.broadcast(bf16x2, arith.constant(bf16, ir.FloatAttr.get(bf16, 1.0)))
    v = arith.minimumf(r, arith.subf(arith.mulf(r, two), one))  # all exact in BF16
    v_bits = mgpu_utils.bitcast(v, ir.IntegerType.get_signless(32))
    return mgpu_utils.bitcast(arith.ori(v_bits, sign), bf16x2)


def _codes_to_bf16x2(word: ir.Value, *, lo_shift: int, sign_shift: int, decode: str) -> ir.Value:
    """``word`` holds two codes in bits [0, 4) and [16, 20): decodes both (see above)."""
    mag = arith.andi(arith.shli(word, _i32(lo_shift)), _i32(MAG_MASK))
    sign = arith.andi(arith.shli(word, _i32(sign_shift)), _i32(SIGN_MASK))
    return _bf16x2_from_parts(mag, sign, decode)


def _decode_rows_mgpu(x: mgpu.FragmentedArray, decode: str) -> mgpu.FragmentedArray:
    """(R, C) uint8 in ROWS_BYTES_LAYOUT -> (R, 2C) bf16 in the WGMMA layout (raw)."""
    i32 = ir.IntegerType.get_signless(32)
    regs = np.empty(x.registers.shape, dtype=object)
    for idx, reg in np.ndenumerate(x.registers):
        byte = mgpu_utils.bitcast(reg, ir.IntegerType.get_signless(8))
        b = arith.extui(i32, byte)
        # The two shifted copies of b in each product do not overlap (b < 256).
        mag = arith.andi(arith.muli(b, _i32(ROWS_MAG_MUL)), _i32(MAG_MASK))
        sign = arith.andi(arith.muli(b, _i32(ROWS_SIGN_MUL)), _i32(SIGN_MASK))
        regs[idx] = _bf16x2_from_parts(mag, sign, decode)
    layout = mgpu.WGMMA_LAYOUT
    shape = (x.shape[0], 2 * x.shape[1])
    assert regs.shape == layout.registers_shape(shape), (regs.shape, shape)
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)


def _decode_cols_mgpu(
    x: mgpu.FragmentedArray, decode: str
) -> tuple[mgpu.FragmentedArray, mgpu.FragmentedArray]:
    """(R/2, C) uint8 in COLS_BYTES_LAYOUT -> (even rows, odd rows) bf16 (raw)."""
    i32 = ir.IntegerType.get_signless(32)
    even = np.empty(x.registers.shape, dtype=object)
    odd = np.empty(x.registers.shape, dtype=object)
    zero = _i32(0)
    spread = _i32(COLS_SPREAD)
    (e_mag, e_sign), (o_mag, o_sign) = COLS_SHIFTS["even"], COLS_SHIFTS["odd"]
    for idx, reg in np.ndenumerate(x.registers):
        half = mgpu_utils.bitcast(reg, ir.IntegerType.get_signless(16))  # b0 | b1 << 8
        y = mgpu_utils.prmt(arith.extui(i32, half), zero, spread)
        even[idx] = _codes_to_bf16x2(y, lo_shift=e_mag, sign_shift=e_sign, decode=decode)
        odd[idx] = _codes_to_bf16x2(y, lo_shift=o_mag, sign_shift=o_sign, decode=decode)
    layout = x.layout
    return (
        mgpu.FragmentedArray(_registers=even, _layout=layout, _is_signed=None),
        mgpu.FragmentedArray(_registers=odd, _layout=layout, _is_signed=None),
    )


def zipped_register(idx: tuple[int, ...], parity: int) -> tuple[int, ...]:
    """Register of COLS_DECODED_LAYOUT that holds decoded row 2j+parity of the
    packed row j held by register ``idx`` of COLS_BYTES_LAYOUT (same thread)."""
    row_tile, col_tile, half = idx[:3]
    return (row_tile, col_tile, half, 0, 0, 0, parity, 0, 0)


def _zip_rows_mgpu(
    even: mgpu.FragmentedArray, odd: mgpu.FragmentedArray
) -> mgpu.FragmentedArray:
    """Interleaves rows: out[2j] = even[j], out[2j+1] = odd[j] (register renaming)."""
    layout = COLS_DECODED_LAYOUT.to_mgpu()
    shape = (2 * even.shape[0], even.shape[1])
    regs = np.empty(layout.registers_shape(shape), dtype=object)
    for idx, reg in np.ndenumerate(even.registers):
        regs[zipped_register(idx, 0)] = reg
        regs[zipped_register(idx, 1)] = odd.registers[idx]
    assert all(r is not None for r in regs.flat)
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)


def _e2m1_values(codes: jax.Array) -> jax.Array:
    """Interpret mode: exact E2M1 values (float32) of uint codes.

    (The CPU flushes subnormals, so interpret mode cannot use the GPU's 2**-126
    trick; it decodes arithmetically and uses the matching scale factor.)
    """
    e = (codes >> 1) & 3
    mant = (codes & 1).astype(jnp.float32) * 0.5
    pow2 = jnp.where(e == 1, 1.0, jnp.where(e == 2, 2.0, 4.0))
    mag = jnp.where(e == 0, mant, (1.0 + mant) * pow2)
    return jnp.where((codes & 8) != 0, -mag, mag)


def _decode_rows(tile_ref, *, interpret: bool, decode: str) -> jax.Array:
    """Packed (R, C) bytes (codes along C) -> raw (R, 2C) bf16 in the WGMMA layout."""
    rows, cols = tile_ref.shape
    if interpret:
        b = tile_ref[...].astype(jnp.uint32)
        vals = jnp.stack([_e2m1_values(b & 0xF), _e2m1_values(b >> 4)], axis=-1)
        return vals.reshape(rows, 2 * cols).astype(jnp.bfloat16)
    b = plgpu.load(tile_ref, layout=ROWS_BYTES_LAYOUT)
    return plgpu.inline_mgpu(
        arg_types=(ROWS_BYTES_LAYOUT,),
        return_type=plgpu.ShapeDtypeStruct(
            (rows, 2 * cols), jnp.bfloat16, layout=plgpu.Layout.WGMMA
        ),
    )(lambda ctx, x: _decode_rows_mgpu(x, decode))(b)


def _decode_cols_halves(
    tile_ref, *, interpret: bool, decode: str
) -> tuple[jax.Array, jax.Array]:
    """Packed (R/2, C) bytes (codes along R) -> raw (even rows, odd rows) bf16."""
    if interpret:
        b = tile_ref[...].astype(jnp.uint32)
        return (
            _e2m1_values(b & 0xF).astype(jnp.bfloat16),
            _e2m1_values(b >> 4).astype(jnp.bfloat16),
        )
    b = plgpu.load(tile_ref, layout=COLS_BYTES_LAYOUT)
    ty = plgpu.ShapeDtypeStruct(tile_ref.shape, jnp.bfloat16, layout=COLS_BYTES_LAYOUT)
    return plgpu.inline_mgpu(arg_types=(COLS_BYTES_LAYOUT,), return_type=(ty, ty))(
        lambda ctx, x: _decode_cols_mgpu(x, decode)
    )(b)


def _zip_rows(even: jax.Array, odd: jax.Array, *, interpret: bool) -> jax.Array:
    rows, cols = even.shape
    if interpret:
        return jnp.stack([even, odd], axis=1).reshape(2 * rows, cols)
    return plgpu.inline_mgpu(
        arg_types=(COLS_BYTES_LAYOUT, COLS_BYTES_LAYOUT),
        return_type=plgpu.ShapeDtypeStruct(
            (2 * rows, cols), jnp.bfloat16, layout=COLS_DECODED_LAYOUT
        ),
    )(lambda ctx, e, o: _zip_rows_mgpu(e, o))(even, odd)


def _load_scales(scale_ref, layout, *, interpret: bool) -> jax.Array:
    """Loads precomputed bf16 block-scale factors (see `scale_factors`)."""
    return scale_ref[...] if interpret else plgpu.load(scale_ref, layout=layout)


def scale_factors(scales: jax.Array, *, subnormal: bool) -> jax.Array:
    """E4M3 block scales -> bf16 factors ``s · 2**118`` (subnormal decode) or ``s · 2**-8``.

    Computed by XLA in the wrapper, fused with the layout change the kernel needs
    anyway; exact (an E4M3 value times a power of two is a normal BF16 number).
    """
    factor = SCALE_FACTOR_SUBNORMAL if subnormal else SCALE_FACTOR_EXACT
    return (scales.astype(jnp.float32) * factor).astype(jnp.bfloat16)


def decode_rows_tile(tile_ref, scale_ref, *, interpret: bool, decode: str) -> jax.Array:
    """Decodes a tile packed along its minor axis into registers.

    Args:
      tile_ref: (R, C) uint8 packed codes in SMEM (codes along C).
      scale_ref: (2C/16, R) bf16 block-scale factors (transposed: block-major).
      interpret: use the interpret-mode implementation.
      decode: `pallas_kernels.gemm_config.TuningConfig.decode`.

    Returns:
      (R, 2C) bf16 ``e2m1 · s · 2**-8`` in the WGMMA layout.
    """
    rows, cols = tile_ref.shape
    raw = _decode_rows(tile_ref, interpret=interpret, decode=decode)
    parts = []
    for blk in range(2 * cols // BLOCK):
        s = _load_scales(scale_ref.at[blk], _ROW_VECTOR_LAYOUT, interpret=interpret)
        s = lax.broadcast_in_dim(s, (rows, BLOCK), (0,))
        if not interpret:
            s = plgpu.layout_cast(s, plgpu.Layout.WGMMA)
        parts.append(raw[:, blk * BLOCK:(blk + 1) * BLOCK] * s)
    return jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def decode_cols_tile(
    tile_ref, scale_ref, dst_ref, *, interpret: bool, decode: str
) -> None:
    """Decodes a tile packed along its major axis into swizzled SMEM.

    Works one 16-row block at a time (8 packed rows) to keep few registers live.

    Args:
      tile_ref: (R/2, C) uint8 packed codes in SMEM (codes along R).
      scale_ref: (R/16, C) bf16 block-scale factors.
      dst_ref: (R, C) bf16 destination (tiled and swizzled for wgmma).
      interpret: use the interpret-mode implementation.
      decode: `pallas_kernels.gemm_config.TuningConfig.decode`.
    """
    half_rows, cols = tile_ref.shape
    half_block = BLOCK // 2  # packed rows per 16-row block
    for blk in range(half_rows // half_block):
        even, odd = _decode_cols_halves(
            tile_ref.at[pl.ds(blk * half_block, half_block)], interpret=interpret,
            decode=decode,
        )
        s = _load_scales(scale_ref.at[blk], _COL_SCALE_LAYOUT, interpret=interpret)
        s = lax.broadcast_in_dim(s, (half_block, cols), (1,))
        if not interpret:
            s = plgpu.layout_cast(s, COLS_BYTES_LAYOUT)
        dst_ref[pl.ds(blk * BLOCK, BLOCK)] = _zip_rows(even * s, odd * s, interpret=interpret)
