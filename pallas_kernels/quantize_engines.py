"""The quantize kernel body: rowwise and columnwise engines over one read of ``x``.

One kernel launch (`run_quantize`) walks ``x`` tile by tile (`tma_pipeline`) and feeds
each tile to one or both engines:

* Rowwise engine (blocks along K): one thread holds a whole 16-element block, so the
  block amax is an in-thread reduction; 1D (1×16) or 2D (16×16) blocks.
* Columnwise engine (blocks along M): the 16 rows of a 16-row group are 16 register
  arrays, so block amax, the optional 16-point Hadamard butterfly and code packing along
  M are elementwise between them.

Both write packed E2M1 codes and E4M3 scales straight to global memory, with exactly
the reference's numerics (`bit_tricks`). With ``poison`` an engine also reports
whether a (rotated) value was non-finite, for a caller-given amax.

Stochastic rounding draws the reference's bits (docs/RECIPE.md §5): block ``b`` (numbered
by `tma_pipeline.OutputSpec.block_strides`) takes the four 32-bit words
``hash(4b + j)`` and its element ``4j + i`` byte ``i`` of word ``j``. Each engine computes
each word once: the rowwise engine in the block-reduced layout (one thread, one block,
four hashes), broadcast to the block's 8 uint32 input words; the columnwise engine per
column and word ``j``, feeding the 4 row arrays ``4j .. 4j+3``. The per-tile counters are
a loop-invariant in-tile offset plus the tile origin's, in uint32 (`sr_reason` bounds the
block count so nothing wraps).

`input_reason` says which inputs the kernel takes (shared by the two public wrappers).

Example:
  >>> import jax.numpy as jnp
  >>> from pallas_kernels import quantize_engines
  >>> quantize_engines.input_reason((64, 128), jnp.bfloat16, "quantize", 16) is None
  True
  >>> "a multiple of 128" in quantize_engines.input_reason((64, 100), jnp.bfloat16, "q", 16)
  True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4jax.numerics import random_bits
from pallas_kernels import bit_tricks as bits
from pallas_kernels import tma_pipeline as tp

_U32 = jnp.uint32
_F32 = jnp.float32


def dtype_reason(shape: Sequence[int], dtype: Any, what: str) -> str | None:
    """Why the kernel cannot take an input of this rank/dtype, or None."""
    shape = tuple(shape)
    if len(shape) < 2:
        return f"{what}: the Pallas quantize kernel needs a rank >= 2 array, got shape {shape}"
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return (
            f"{what}: the Pallas quantize kernel takes bfloat16 or float16 inputs, got "
            f"{dtype} with shape {shape}; use fp4jax.quantize for other dtypes"
        )
    return None


def input_reason(shape: Sequence[int], dtype: Any, what: str, need_rows: int) -> str | None:
    """Why the kernel cannot take ``x`` viewed as ``(rows, K)`` words, or None.

    ``K`` (the last axis) must be a multiple of 128, the second-to-last axis of 16 and
    the flattened row count of ``need_rows`` (16 rowwise, 64 when a columnwise output
    is produced).
    """
    shape = tuple(shape)
    reason = dtype_reason(shape, dtype, what)
    if reason is not None:
        return reason
    lead, (m, k) = shape[:-2], shape[-2:]
    rows = math.prod(lead) * m
    if k % 128 or m % 16 or rows % need_rows or rows == 0:
        return (
            f"{what}: the Pallas quantize kernel needs the last axis to be a multiple of 128, "
            f"the second-to-last a multiple of 16 and the flattened row count a multiple of "
            f"{need_rows}; got shape {shape}. Use fp4jax.quantize for this shape"
        )
    return None


def _row_engine(tile, codes_ref, scales_ref, g0, b0, sp, keys, out: tp.OutputSpec,
                spec: tp.KernelSpec, sr, acc):
    """Rowwise (blocks along K) quantization of one tile; returns the poison accumulator.

    ``sp``: the output's scale parameters ``(gds, mult, recips)`` (`scale_params`);
    ``sr``: `_row_sr_state` for stochastic rounding (else None).
    """
    bg, bnb = spec.bm // 16, spec.bk // 16
    shape = (bg, 16, bnb, 8)
    layout = tp.engine_layouts(spec)[0]
    w = plgpu.load(tile, layout=layout)
    xe, xo = bits.unpack_words(w, spec.dtype)
    if out.poison:
        acc = jnp.maximum(acc, jnp.maximum(jnp.abs(xe), jnp.abs(xo)))
    xe, xo = bits.finite_or_zero(xe), bits.finite_or_zero(xo)
    bamax = jnp.max(jnp.maximum(jnp.abs(xe), jnp.abs(xo)), axis=3)  # (bg, 16, bnb)
    if out.block_2d:
        tile_max = jnp.max(bamax, axis=1)  # (bg, bnb): one per 16x16 tile
        enc, code, _ = bits.e4m3_block_scale(tile_max, *sp)
        red = layout.reduce(3)
        enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, shape[:3], (0, 2)), red)
        scales_ref.at[pl.ds(g0, bg), pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    else:
        enc, code, dec = bits.e4m3_block_scale(bamax, *sp)
        if out.values:
            dec = plgpu.layout_cast(lax.broadcast_in_dim(dec, shape, (0, 1, 2)), layout)
        else:
            scales_ref.at[pl.ds(g0, bg), :, pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, shape, (0, 1, 2)), layout)
    # With ``values`` the signed E2M1 values, else the codes (as in `_col_engine`).
    if out.stochastic:
        ue, uo = _row_sr_bytes(sr, keys, g0, b0, out, shape, layout)
        rnd = bits.value_stochastic if out.values else bits.nibble_stochastic
        ne, no = rnd(xe, enc, ue), rnd(xo, enc, uo)
    else:
        rnd = bits.value_nearest if out.values else bits.nibble_nearest
        ne, no = rnd(xe, enc), rnd(xo, enc)
    if out.values:  # the input's word layout: (groups, rows, blocks, 8) uint32 pairs
        codes_ref.at[pl.ds(g0, bg), :, pl.ds(b0, bnb)][...] = bits.values_pair(ne, no, dec)
        return acc
    byte = ne | (no << 4)
    codes_ref.at[pl.ds(g0, bg), :, pl.ds(b0, bnb)][...] = byte.astype(jnp.uint8)
    return acc


def _col_engine(tile, codes_ref, scales_ref, g0, b0, sp, keys, out: tp.OutputSpec,
                spec: tp.KernelSpec, sr, acc):
    """Columnwise (blocks along M, optional RHT) quantization of one tile.

    ``sp``: as for `_row_engine`; ``sr``: `_col_sr_state` for stochastic rounding (else None).
    """
    bg, bnb = spec.bm // 16, spec.bk // 16
    layout = tp.engine_layouts(spec)[1]
    words = [plgpu.load(tile.at[:, j], layout=layout) for j in range(16)]
    halves = [bits.unpack_words(w, spec.dtype) for w in words]
    cols = [[h[0] for h in halves], [h[1] for h in halves]]  # even / odd column
    bamax = []
    for c in range(2):
        if out.hadamard:
            cols[c] = [bits.round_to_16bit(v * 0.25, spec.dtype, hardware=spec.hardware_casts)
                       for v in bits.rht16_butterfly(cols[c], out.signs)]
        if out.poison:
            acc = functools.reduce(jnp.maximum, [jnp.abs(v) for v in cols[c]], acc)
        cols[c] = [bits.finite_or_zero(v) for v in cols[c]]
        bamax.append(functools.reduce(jnp.maximum, [jnp.abs(v) for v in cols[c]]))
    if out.block_2d:
        tile_max = jnp.max(jnp.maximum(bamax[0], bamax[1]), axis=2)  # (bg, bnb)
        enc, code, _ = bits.e4m3_block_scale(tile_max, *sp)
        enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, (bg, bnb, 8), (0, 1)), layout)
        encs = (enc, enc)
        scales_ref.at[pl.ds(g0, bg), pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    else:
        enc_e, code_e, dec_e = bits.e4m3_block_scale(bamax[0], *sp)
        enc_o, code_o, dec_o = bits.e4m3_block_scale(bamax[1], *sp)
        encs = (enc_e, enc_o)
        if not out.values:
            pair = (code_e | (code_o << 8)).astype(jnp.uint16)
            scales_ref.at[pl.ds(g0, bg), pl.ds(b0, bnb)][...] = pair
    if out.stochastic:
        # 4·b of the even and the odd column's block of each word; a block's 16 rows are
        # 16 arrays, so each hash below (word j of a block) feeds the 4 rows 4j..4j+3.
        even = sr + _tile_origin4(g0, b0, out, 1, 16)
        counter = (even, even + _U32((4 * out.block_strides[1]) & 0xFFFFFFFF))
    for p in range(8):
        if out.stochastic and p % 2 == 0:  # rows 2p .. 2p + 3 share hash word p // 2
            hashes = [bits.hash32(*keys, counter[c] | _U32(p // 2) if p else counter[c])
                      for c in range(2)]
        nibs = {}
        for c in range(2):
            for half in range(2):
                r = 2 * p + half  # the row in the 16-row group: byte r % 4 of word r // 4
                # With ``values`` the signed E2M1 value, else the code.
                if out.stochastic:
                    u8 = bits.sr_byte(hashes[c], r % 4)
                    rnd = bits.value_stochastic if out.values else bits.nibble_stochastic
                    nibs[c, half] = rnd(cols[c][r], encs[c], u8)
                else:
                    rnd = bits.value_nearest if out.values else bits.nibble_nearest
                    nibs[c, half] = rnd(cols[c][r], encs[c])
        if out.values:  # row r's even and odd column, in the input's word layout
            for half in range(2):
                codes_ref.at[pl.ds(g0, bg), 2 * p + half, pl.ds(b0, bnb)][...] = (
                    bits.values_pair(nibs[0, half], nibs[1, half], dec_e, dec_o))
            continue
        word = None
        for (c, half), nib in nibs.items():
            shift = 8 * c + 4 * half
            nib = nib << shift if shift else nib
            word = nib if word is None else word | nib
        codes_ref.at[pl.ds(g0, bg), p, pl.ds(b0, bnb)][...] = word.astype(jnp.uint16)
    return acc


def _iota_sum(layout, shape, weights):
    """``sum_d iota_d * weights[d]`` as uint32 in ``layout`` (weights are Python ints)."""
    total = None
    for axis, weight in enumerate(weights):
        if weight == 0:
            continue
        term = plgpu.broadcasted_iota(_U32, shape, axis, layout=layout) * _U32(weight & 0xFFFFFFFF)
        total = term if total is None else total + term
    return total


def _tile_origin4(g0, b0, out: tp.OutputSpec, m_per_group: int, k_per_block: int):
    """``4 * b`` of the block at the tile origin (16-row group ``g0``, 16-column block ``b0``).

    ``m_per_group`` / ``k_per_block``: the engine's M-units per 16-row group and K-units
    per 16-column block (rowwise 16 and 1, columnwise 1 and 16). uint32 arithmetic: with
    at most `random_bits.MAX_BLOCKS` blocks (`sr_reason`) nothing wraps.
    """
    s_m, s_k = out.block_strides
    return (g0.astype(_U32) * _U32((4 * m_per_group * s_m) & 0xFFFFFFFF)
            + b0.astype(_U32) * _U32((4 * k_per_block * s_k) & 0xFFFFFFFF))


def _row_sr_state(spec: tp.KernelSpec, out: tp.OutputSpec):
    """Loop-invariant SR state of the rowwise engine.

    Returns ``(off4, hi, mid, shift)``: ``4 * b`` of each block of a tile relative to the
    tile's origin, one per thread and block (the block-reduced layout: 4 hashes per
    block, no more); and for each word ``w`` of a block (elements ``2w``, ``2w + 1``,
    i.e. bytes ``2(w % 2)``, ``2(w % 2) + 1`` of hash ``w // 2``) the selectors of its
    hash (``w >= 4``, ``w % 4 >= 2``) and the shift of its two bytes (``16 * (w % 2)``).
    """
    bg, bnb = spec.bm // 16, spec.bk // 16
    s_m, s_k = out.block_strides
    layout = tp.engine_layouts(spec)[0]
    off4 = _iota_sum(layout.reduce(3), (bg, 16, bnb), (64 * s_m, 4 * s_m, 4 * s_k))
    w = plgpu.broadcasted_iota(_U32, (bg, 16, bnb, 8), 3, layout=layout)
    return off4, w >= _U32(4), (w & _U32(2)) != _U32(0), (w & _U32(1)) << 4


def _row_sr_bytes(sr, keys, g0, b0, out: tp.OutputSpec, shape, layout):
    """The random bytes of the rowwise engine's even and odd elements (uint32, word layout).

    The 4 hashes of each block are computed once, in the block-reduced layout (one
    thread holds a whole block), then broadcast to the block's 8 words; each word picks
    its hash with two loop-invariant selectors and its two bytes with one shift.
    """
    off4, hi, mid, shift = sr
    c = off4 + _tile_origin4(g0, b0, out, 16, 1)
    h = [plgpu.layout_cast(lax.broadcast_in_dim(
            bits.hash32(*keys, c | _U32(j) if j else c), shape, (0, 1, 2)), layout)
         for j in range(4)]
    word = jnp.where(hi, jnp.where(mid, h[3], h[2]), jnp.where(mid, h[1], h[0])) >> shift
    return word & _U32(0xFF), (word >> 8) & _U32(0xFF)


def _col_sr_state(spec: tp.KernelSpec, out: tp.OutputSpec):
    """Loop-invariant SR state of the columnwise engine: ``4 * b`` of the even column's
    block of each word of a tile relative to the tile's origin (the odd column's is
    ``4 * s_k`` more)."""
    bg, bnb = spec.bm // 16, spec.bk // 16
    s_m, s_k = out.block_strides
    return _iota_sum(tp.engine_layouts(spec)[1], (bg, bnb, 8), (4 * s_m, 64 * s_k, 8 * s_k))


def sr_reason(shape: Sequence[int]) -> str | None:
    """Why stochastic rounding cannot number the blocks of ``(..., M, K)``, or None.

    The block counter ``4 * b + j`` is a uint32 (docs/RECIPE.md §5): at most
    `random_bits.MAX_BLOCKS` 16-blocks, as the reference.
    """
    n = math.prod(shape) // 16
    if n > random_bits.MAX_BLOCKS:
        return (f"stochastic rounding numbers blocks with a uint32 counter: a tensor of shape "
                f"{tuple(shape)} has {n} 16-blocks, more than the {random_bits.MAX_BLOCKS} "
                "supported")
    return None


SCALE_PARAMS = 10
"""float32 kernel parameters per output: ``gds``, ``mult``, `bit_tricks.mantissa_recips`."""


def scale_params(gds: jax.Array, mult: jax.Array) -> jax.Array:
    """The ``SCALE_PARAMS`` float32 kernel parameters of each output (see `run_quantize`).

    ``gds`` and ``mult`` hold one value per output (float32[n]); the result is the ``n``
    outputs' parameters one after the other (float32[n * SCALE_PARAMS]), the reciprocals
    of all outputs from one vectorized division.
    """
    recips = bits.mantissa_recips(gds[:, None])  # (n, 8)
    return jnp.concatenate([jnp.stack([gds, mult], axis=1).astype(_F32), recips],
                           axis=1).reshape(-1)


def _read_scale_params(fparams, n: int):
    """``(gds, mult, recips)`` of output ``n`` (0 rowwise, 1 columnwise) from the kernel's
    parameters."""
    base = n * SCALE_PARAMS
    return fparams[base], fparams[base + 1], tuple(fparams[base + 2 + i] for i in range(8))


def _quantize_kernel(x_gmem, fparams, uparams, *refs, spec: tp.KernelSpec):
    outs = list(refs[:-2])
    x_smem, bar = refs[-2:]
    bg, bnb = spec.bm // 16, spec.bk // 16
    engines = []
    if spec.row is not None:
        codes = outs.pop(0)  # the values instead of codes and scales with ``values``
        scales = None if spec.row.values else outs.pop(0)
        sr = _row_sr_state(spec, spec.row) if spec.row.stochastic else None
        keys = tuple(uparams[i] for i in range(3))
        acc = plgpu.layout_cast(jnp.zeros((bg, 16, bnb, 8), _F32), tp.engine_layouts(spec)[0])
        engines.append((_row_engine, codes, scales, _read_scale_params(fparams, 0), keys,
                        spec.row, sr, acc))
    if spec.col is not None:
        codes = outs.pop(0)
        scales = None if spec.col.values else outs.pop(0)
        sr = _col_sr_state(spec, spec.col) if spec.col.stochastic else None
        keys = tuple(uparams[i] for i in range(3, 6))
        acc = plgpu.layout_cast(jnp.zeros((bg, bnb, 8), _F32), tp.engine_layouts(spec)[1])
        engines.append((_col_engine, codes, scales, _read_scale_params(fparams, 1), keys,
                        spec.col, sr, acc))
    poison_ref = outs.pop(0) if outs else None
    poison = [e[5].poison for e in engines]

    def body(tile, g0, b0, carry):
        carry = list(carry)
        for n, (engine, codes, scales, sp, keys, out, sr, _) in enumerate(engines):
            carry[n] = engine(tile, codes, scales, g0, b0, sp, keys, out, spec, sr, carry[n])
        return tuple(carry)

    step, n_local = tp.pipelined_loop(spec, x_gmem, x_smem, bar, body)
    init = tuple(e[-1] if p else None for e, p in zip(engines, poison))
    final = lax.fori_loop(0, n_local, step, init)
    if poison_ref is not None:
        cta = lax.axis_index("cta")
        for n, (acc, p) in enumerate(zip(final, poison)):
            if not p:
                continue
            # NaN-safe reduction.
            acc = jnp.where(acc != acc, np.float32(np.inf), acc)  # noqa: PLR0124 - a NaN test
            red = jnp.max(jnp.max(acc, axis=3), axis=1) if acc.ndim == 4 else jnp.max(acc, axis=2)
            poison_ref.at[cta, n][...] = red


def run_quantize(x2: jax.Array, row: tp.OutputSpec | None, col: tp.OutputSpec | None,
                 fparams: jax.Array, uparams: jax.Array, config: Any, interpret: bool):
    """Runs the quantize kernel; returns its outputs and per-output poison flags.

    Args:
      x2: bfloat16/float16 ``(M, K)`` accepted by `input_reason`.
      row, col: the rowwise and columnwise outputs (either may be None).
      fparams: float32[20], `scale_params` of the rowwise then the columnwise output.
      uparams: uint32[6] `bit_tricks.sr_key_words` of the rowwise then the columnwise key.
      config: a `pallas_kernels.quantize_single.QuantizeConfig` (tiling and grid).
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      ``(outputs, flags)``: for each present output its codes and scales in the kernel's
      layout (with ``values``: its dequantized values as uint32 pairs of 16-bit words in
      the input's word layout, `tma_pipeline.as_words`), then for each of ``(row, col)``
      its poison flag (None unless ``poison``).
    """
    m, k = x2.shape
    narrow = config.block_cols == tp.NARROW_COLS and m % 64 == 0
    unit_m = 64 if (col is not None or narrow) else 16
    bm = tp.pick_block(m, config.block_rows, unit_m)
    bk = tp.NARROW_COLS if narrow else tp.pick_block(k, config.block_cols, 128)
    spec = tp.launch_spec(
        tp.KernelSpec(m, k, x2.dtype, bm, bk, config.stages, 0, row, col),
        num_ctas=config.num_ctas, ctas_per_sm=config.ctas_per_sm, interpret=interpret)
    stages = spec.stages
    out_types = []
    words = jax.ShapeDtypeStruct((m // 16, 16, k // 16, 8), _U32)  # `values` outputs
    for o in (row, col):
        if o is not None and o.values and o.block_2d:
            raise ValueError("the quantize kernel writes dequantized values for 1D blocks only")
    if row is not None and row.values:
        out_types.append(words)
    elif row is not None:
        out_types.append(jax.ShapeDtypeStruct((m // 16, 16, k // 16, 8), jnp.uint8))
        if row.block_2d:
            out_types.append(jax.ShapeDtypeStruct((m // 16, k // 16), jnp.uint8))
        else:
            out_types.append(jax.ShapeDtypeStruct((m // 16, 16, k // 16), jnp.uint8))
    if col is not None and col.values:
        out_types.append(words)
    elif col is not None:
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
        kernel_name=tp.kernel_name(spec),
        scratch_types=[
            plgpu.SMEM((stages, bm // 16, 16, bk // 16, 8), _U32),
            plgpu.Barrier(num_barriers=stages),
        ],
        compiler_params=tp.lane_params(
            reduction_scratch_bytes=max(2048, (bm // 16) * (bk // 16) * 16 * 4)),
        interpret=tp.interpret_params(interpret),
    )
    res = list(kern(tp.as_words(x2), fparams, uparams))
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
