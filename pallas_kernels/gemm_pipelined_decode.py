"""In-register decode of the pipelined NVFP4 GEMM (`pallas_kernels.gemm_pipelined`).

`decode_a` turns a warpgroup's lhs code and scale-factor tiles (a K step) into ``wgmma``'s
register A operand; `decode_b` turns its half of the rhs tiles into the decoded rows or
columns it stores to the shared SMEM buffer; `store_output` writes an epilogue slice,
undoing the A row permutation of an `A_COLS` lhs. All three follow the renamings of
`gemm_pipelined_layouts` and are written at the Mosaic GPU level (``plgpu.inline_mgpu``).
Every decoded pair costs the three integer instructions of
`pallas_kernels.wgmma_regs.decode_pair` (plus the word's nibble planes) and one bf16x2
multiply by its block factor (``s · 2**118``, prepared by XLA, `gemm_decode.scale_factors`):
``e2m1 · s · 2**-8``, exact.

Interpret mode (CPU) decodes with ``jnp`` to the same values in the same (permuted)
places, so the kernel's permutations are exercised there too; the CPU flushes
subnormals, so the interpret-mode factors are ``s · 2**-8`` times exact E2M1 values.

Example:
  >>> import jax.numpy as jnp, numpy as np
  >>> from pallas_kernels import gemm_pipelined_decode as pd, gemm_pipelined_layouts as pl_
  >>> codes = jnp.full((64, 32), 0x72, jnp.uint8)  # every byte: low code 2 (1.0), high 7 (6.0)
  >>> s = jnp.full((4, 64), 2.0**-8, jnp.bfloat16)  # s = 1
  >>> a = pd.decode_a(pl_.A_ROWS, codes, s, interpret=True)
  >>> (np.asarray(a[0, :4], np.float32) * 2**8).tolist()  # columns 0, 1 one byte, 2, 3 the next
  [1.0, 6.0, 1.0, 6.0]
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
from pallas_kernels import gemm_pipelined_layouts as pl_
from pallas_kernels.gemm_pipelined_layouts import TILE_K, WG_M, AOperand, BOperand
from pallas_kernels.wgmma_regs import (
    NIBBLES,
    decode_pair,
    i32,
    nibble_planes,
    pallas_layout,
    selector,
)


def _i32_type():
    return ir.IntegerType.get_signless(32)


def _bf16x2():
    return ir.VectorType.get((2,), ir.BF16Type.get())


def _words(reg: ir.Value) -> list[ir.Value]:
    """A code register (a vector of 2, 4, 8 or 16 bytes) -> its 32-bit words (a 16-bit
    register zero-extended)."""
    n = ir.VectorType(reg.type).shape[0]
    if n == 2:
        return [arith.extui(_i32_type(), mgpu_utils.bitcast(reg, ir.IntegerType.get_signless(16)))]
    words = vector.bitcast(ir.VectorType.get((n // 4,), _i32_type()), reg)
    return [vector.extract(words, [], [i]) for i in range(n // 4)]


def _factor(scales: mgpu.FragmentedArray, keys) -> ir.Value:
    """bf16x2 block factors of a pair: one scale broadcast, or two adjacent ones."""
    (r0, p0), (r1, p1) = keys
    if keys[0] == keys[1]:
        s = vector.extract(scales.registers[r0], [], [p0])
        return vector.broadcast(_bf16x2(), s)
    if r0 == r1 and p1 == p0 + 1:
        return vector.extract_strided_slice(_bf16x2(), scales.registers[r0], [p0], [2], [1])
    return vector.from_elements(_bf16x2(), [vector.extract(scales.registers[r], [], [p])
                                            for r, p in keys])


def _decode_a_mgpu(a: AOperand, codes: mgpu.FragmentedArray,
                   scales: mgpu.FragmentedArray) -> mgpu.FragmentedArray:
    plan = pl_.cached_a_plan(a)
    words = {src: _words(codes.registers[src]) for src in {e[0] for e in plan.values()}}
    planes, factors = {}, {}
    layout = mgpu.WGMMA_LAYOUT
    regs = np.empty(layout.registers_shape((WG_M, TILE_K)), dtype=object)
    for dst, (src, word, sel, skey) in plan.items():
        if (src, word) not in planes:
            planes[(src, word)] = nibble_planes(words[src][word])
        if skey not in factors:
            factors[skey] = _factor(scales, (skey, skey))
        regs[dst] = arith.mulf(decode_pair(*planes[(src, word)], sel), factors[skey])
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)


def _decode_b_mgpu(b: BOperand, codes: mgpu.FragmentedArray,
                   scales: mgpu.FragmentedArray) -> mgpu.FragmentedArray:
    plan = pl_.cached_b_plan(b)
    srcs = {e[0] for entries in plan.values() for e in entries}
    words = {src: _words(codes.registers[src]) for src in srcs}
    if b.thread_nibble:  # this thread's plane: the low nibbles on even lanes, else high
        lane = arith.remui(mgpu_utils.thread_idx(), i32(32))
        shift = arith.shli(arith.andi(lane, i32(1)), i32(2))
    planes, factors = {}, {}
    i32x4 = ir.VectorType.get((4,), _i32_type())
    bf16x8 = ir.VectorType.get((8,), ir.BF16Type.get())
    regs = np.empty(b.stored.registers_shape(b.stored_shape), dtype=object)
    for dst, entries in plan.items():
        pairs = []
        for src, word, (p0, p1), (n0, n1), keys in entries:
            if (src, word) not in planes:
                w = words[src][word]
                planes[(src, word)] = (
                    (arith.andi(arith.shrui(w, shift), i32(NIBBLES)),) * 2
                    if b.thread_nibble else nibble_planes(w))
            sel = selector(p0, p1) if b.thread_nibble else selector(p0 + 4 * n0, p1 + 4 * n1)
            if keys not in factors:
                factors[keys] = _factor(scales, keys)
            pair = arith.mulf(decode_pair(*planes[(src, word)], sel), factors[keys])
            pairs.append(mgpu_utils.bitcast(pair, _i32_type()))
        regs[dst] = vector.bitcast(bf16x8, vector.from_elements(i32x4, pairs))
    return mgpu.FragmentedArray(_registers=regs, _layout=b.stored, _is_signed=None)


def _values(codes: jax.Array, nibble_axis: int) -> jax.Array:
    """Interpret mode: exact float32 E2M1 values of packed bytes, the two nibbles of a
    byte adjacent along ``nibble_axis`` (low first)."""
    vals = jnp.stack([e2m1_to_f32(codes & 0xF), e2m1_to_f32(codes >> 4)], axis=nibble_axis + 1)
    shape = list(codes.shape)
    shape[nibble_axis] *= 2
    return vals.reshape(shape)


def _split_transpose(x: jax.Array, axis: int, sizes, order) -> jax.Array:
    """Splits ``axis`` into ``sizes`` (major first), permutes the parts and merges them:
    the kernel's permutations as static reshapes (interpret mode takes no gathers)."""
    x = jnp.moveaxis(x, axis, -1)
    lead = x.shape[:-1]
    x = x.reshape(*lead, *sizes)
    x = x.transpose(*range(len(lead)), *(len(lead) + o for o in order))
    return jnp.moveaxis(x.reshape(*lead, -1), -1, axis)


def take_k(x: jax.Array, col, axis: int) -> jax.Array:
    """``x`` (TILE_K along ``axis``, contraction order) in the order ``col``: position κ
    holds ``col(κ)`` (`gemm_pipelined_layouts.rows_col` or the identity)."""
    if col is pl_.rows_col:  # κ = (t, hf, c, v) holds contraction (c, t, hf, v)
        return _split_transpose(x, axis, (4, 4, 2, 2), (1, 2, 0, 3))
    return x


def take_rows(x: jax.Array, row, *, inverse: bool = False) -> jax.Array:
    """``x`` (WG_M rows) in the order ``row`` (row ρ holds ``row(ρ)``), or, with
    ``inverse``, the rows of an array in that order put back."""
    if row is pl_.cols_row:  # ρ = (w, h, r) holds lhs row (w, r, h)
        return _split_transpose(x, 0, (4, 2, 8) if inverse else (4, 8, 2), (0, 2, 1))
    return x


def _interpret_a(a: AOperand, codes: jax.Array, scales: jax.Array) -> jax.Array:
    s = jnp.repeat(scales.astype(jnp.float32), BLOCK, axis=0)  # (K, M)
    if a.name == "rows":  # (M, K/2) -> (M, K)
        nat = _values(codes, 1) * s.T
    else:  # (K/2, M) -> (K, M) -> (M, K)
        nat = (_values(codes, 0) * s).T
    return take_k(take_rows(nat, a.row), a.col, 1).astype(jnp.bfloat16)


def _interpret_b(b: BOperand, codes: jax.Array, scales: jax.Array) -> jax.Array:
    s = jnp.repeat(scales.astype(jnp.float32), BLOCK, axis=0)  # (K, N) or (K, N/16)
    if b.name == "rows":  # (K/2, N) -> (K, N)
        return take_k(_values(codes, 0) * s, b.col, 0).astype(jnp.bfloat16)
    # (N/2, K) -> (N, K), scales per 16×16 tile
    nat = _values(codes, 0) * jnp.repeat(s, BLOCK, axis=1).T
    return take_k(nat, b.col, 1).astype(jnp.bfloat16)


def decode_a(a: AOperand, codes_ref, scales_ref, *, interpret: bool) -> jax.Array:
    """Decodes a warpgroup's lhs tile of one K step into the register A operand.

    Args:
      a: the lhs operand (`gemm_pipelined_layouts.A_ROWS` or ``A_COLS``).
      codes_ref: its code tile in SMEM, ``a.codes_shape`` bytes.
      scales_ref: its bf16 block factors, ``(TILE_K/16, WG_M)``.
      interpret: use the interpret-mode implementation.

    Returns:
      (`WG_M`, `TILE_K`) bf16 ``e2m1 · s · 2**-8`` in the WGMMA layout: row ρ holds lhs
      row ``a.row(ρ)``, column κ contraction ``a.col(κ)``.
    """
    if interpret:
        return _interpret_a(a, codes_ref[...], scales_ref[...])
    codes = plgpu.load(codes_ref, layout=pallas_layout(a.codes))
    # `A_ROWS`: the 4 lanes of a row read its 4 blocks, 256 bytes apart (a 4-way bank
    # conflict, on 2 of the thread's ~90 instructions per step).
    scales = plgpu.load(scales_ref, layout=pallas_layout(a.scales), optimized=a.name != "rows")
    return plgpu.inline_mgpu(
        arg_types=(pallas_layout(a.codes), pallas_layout(a.scales)),
        return_type=plgpu.ShapeDtypeStruct((WG_M, TILE_K), jnp.bfloat16,
                                           layout=plgpu.Layout.WGMMA),
    )(lambda ctx, c, s: _decode_a_mgpu(a, c, s))(codes, scales)


def decode_b(b: BOperand, codes_ref, scales_ref, dst_ref, *, interpret: bool) -> None:
    """Decodes a warpgroup's half of the rhs tile of one K step into ``dst_ref``.

    Args:
      b: the rhs operand (`gemm_pipelined_layouts.b_operand`).
      codes_ref: its code tile in SMEM, ``b.codes_shape`` bytes.
      scales_ref: its bf16 block factors, ``b.scales_shape``.
      dst_ref: the decoded tile's half in SMEM, ``b.stored_shape`` bf16 (128-byte
        swizzle): row κ (``"rows"``) or column κ (``"cols"``) holds contraction
        ``b.col(κ)``.
      interpret: use the interpret-mode implementation.
    """
    if interpret:
        dst_ref[...] = _interpret_b(b, codes_ref[...], scales_ref[...])
        return
    codes = plgpu.load(codes_ref, layout=pallas_layout(b.codes))
    scales = plgpu.load(scales_ref, layout=pallas_layout(b.scales))
    dst_ref[...] = plgpu.inline_mgpu(
        arg_types=(pallas_layout(b.codes), pallas_layout(b.scales)),
        return_type=plgpu.ShapeDtypeStruct(b.stored_shape, jnp.bfloat16,
                                           layout=pallas_layout(b.stored)),
    )(lambda ctx, c, s: _decode_b_mgpu(b, c, s))(codes, scales)


def _rename_mgpu(a: AOperand, acc: mgpu.FragmentedArray) -> mgpu.FragmentedArray:
    en = acc.shape[1]
    layout = pl_.cols_out_layout()
    regs = np.empty(layout.registers_shape((WG_M, en)), dtype=object)
    for dst, src in pl_.cached_epilogue_plan(a, en).items():
        regs[dst] = acc.registers[src]
    return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=acc.is_signed)


def store_output(a: AOperand, acc: jax.Array, dst_ref, *, interpret: bool) -> None:
    """Stores a (`WG_M`, en) slice of the accumulator (WGMMA layout, A rows) to the
    output slice ``dst_ref`` (SMEM), rows in lhs order."""
    if a.name == "rows":
        dst_ref[...] = acc
    elif interpret:
        dst_ref[...] = take_rows(acc, a.row, inverse=True)
    else:
        layout = pallas_layout(pl_.cols_out_layout())
        dst_ref[...] = plgpu.inline_mgpu(
            arg_types=(plgpu.Layout.WGMMA,),
            return_type=plgpu.ShapeDtypeStruct(acc.shape, acc.dtype, layout=layout),
        )(lambda ctx, x: _rename_mgpu(a, x))(acc)
