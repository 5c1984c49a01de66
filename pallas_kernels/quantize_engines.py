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

import dataclasses
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


def _row_engine(tile, codes_ref, scales_ref, g0, b0, gds, mult, keys, out: tp.OutputSpec,
                spec: tp.KernelSpec, off, acc):
    """Rowwise (blocks along K) quantization of one tile; returns the poison accumulator."""
    bg, bnb = spec.bm // 16, spec.bk // 16
    shape = (bg, 16, bnb, 8)
    w = plgpu.load(tile, layout=tp.ROW_LAYOUT)
    xe, xo = bits.unpack_words(w, spec.dtype)
    if out.poison:
        acc = jnp.maximum(acc, jnp.maximum(jnp.abs(xe), jnp.abs(xo)))
    xe, xo = bits.finite_or_zero(xe), bits.finite_or_zero(xo)
    bamax = jnp.max(jnp.maximum(jnp.abs(xe), jnp.abs(xo)), axis=3)  # (bg, 16, bnb)
    if out.block_2d:
        tile_max = jnp.max(bamax, axis=1)  # (bg, bnb): one per 16x16 tile
        enc, code, _ = bits.e4m3_block_scale(tile_max, gds, mult)
        red = tp.ROW_LAYOUT.reduce(3)
        enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, shape[:3], (0, 2)), red)
        scales_ref.at[pl.ds(g0, bg), pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    else:
        enc, code, _ = bits.e4m3_block_scale(bamax, gds, mult)
        scales_ref.at[pl.ds(g0, bg), :, pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, shape, (0, 1, 2)), tp.ROW_LAYOUT)
    if out.stochastic:
        base = (g0 * 16 * out.index_strides[0] + b0 * 16 * out.index_strides[1]).astype(_U32)
        idx = off + base
        ne = bits.nibble_stochastic(xe, enc, bits.hash_u24(*keys, idx))
        no = bits.nibble_stochastic(
            xo, enc, bits.hash_u24(*keys, idx + _U32(out.index_strides[1])))
    else:
        ne = bits.nibble_nearest(xe, enc)
        no = bits.nibble_nearest(xo, enc)
    byte = ne | (no << 4)
    codes_ref.at[pl.ds(g0, bg), :, pl.ds(b0, bnb)][...] = byte.astype(jnp.uint8)
    return acc


def _col_engine(tile, codes_ref, scales_ref, g0, b0, gds, mult, keys, out: tp.OutputSpec,
                spec: tp.KernelSpec, off, acc):
    """Columnwise (blocks along M, optional RHT) quantization of one tile."""
    bg, bnb = spec.bm // 16, spec.bk // 16
    words = [plgpu.load(tile.at[:, j], layout=tp.COL_LAYOUT) for j in range(16)]
    halves = [bits.unpack_words(w, spec.dtype) for w in words]
    cols = [[h[0] for h in halves], [h[1] for h in halves]]  # even / odd column
    bamax = []
    for c in range(2):
        if out.hadamard:
            cols[c] = [bits.rne_to_16bit(v * 0.25, spec.dtype)
                       for v in bits.rht16_butterfly(cols[c], out.signs)]
        if out.poison:
            acc = functools.reduce(jnp.maximum, [jnp.abs(v) for v in cols[c]], acc)
        cols[c] = [bits.finite_or_zero(v) for v in cols[c]]
        bamax.append(functools.reduce(jnp.maximum, [jnp.abs(v) for v in cols[c]]))
    if out.block_2d:
        tile_max = jnp.max(jnp.maximum(bamax[0], bamax[1]), axis=2)  # (bg, bnb)
        enc, code, _ = bits.e4m3_block_scale(tile_max, gds, mult)
        enc = plgpu.layout_cast(lax.broadcast_in_dim(enc, (bg, bnb, 8), (0, 1)), tp.COL_LAYOUT)
        encs = (enc, enc)
        scales_ref.at[pl.ds(g0, bg), pl.ds(b0, bnb)][...] = code.astype(jnp.uint8)
    else:
        enc_e, code_e, _ = bits.e4m3_block_scale(bamax[0], gds, mult)
        enc_o, code_o, _ = bits.e4m3_block_scale(bamax[1], gds, mult)
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
                    nib = bits.nibble_stochastic(cols[c][j], encs[c], bits.hash_u24(*keys, idx))
                else:
                    nib = bits.nibble_nearest(cols[c][j], encs[c])
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


def _quantize_kernel(x_gmem, fparams, uparams, *refs, spec: tp.KernelSpec):
    outs = list(refs[:-2])
    x_smem, bar = refs[-2:]
    bg, bnb = spec.bm // 16, spec.bk // 16
    engines = []
    if spec.row is not None:
        codes, scales = outs.pop(0), outs.pop(0)
        off = None
        if spec.row.stochastic:
            off = _sr_offsets(tp.ROW_LAYOUT, (bg, 16, bnb, 8), spec.row.index_strides,
                              [(16, 0), (1, 0), (0, 16), (0, 2)])
        keys = tuple(uparams[i] for i in range(3))
        acc = plgpu.layout_cast(jnp.zeros((bg, 16, bnb, 8), _F32), tp.ROW_LAYOUT)
        engines.append((_row_engine, codes, scales, fparams[0], fparams[1], keys, spec.row, off,
                        acc))
    if spec.col is not None:
        codes, scales = outs.pop(0), outs.pop(0)
        off = None
        if spec.col.stochastic:
            off = _sr_offsets(tp.COL_LAYOUT, (bg, bnb, 8), spec.col.index_strides,
                              [(16, 0), (0, 16), (0, 2)])
        keys = tuple(uparams[i] for i in range(3, 6))
        acc = plgpu.layout_cast(jnp.zeros((bg, bnb, 8), _F32), tp.COL_LAYOUT)
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
      fparams: float32[4] ``(gds, mult)`` of the rowwise then the columnwise output.
      uparams: uint32[6] `bit_tricks.sr_key_words` of the rowwise then the columnwise key.
      config: a `pallas_kernels.quantize_single.QuantizeConfig` (tiling and grid).
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      ``(outputs, flags)``: for each present output its codes and scales in the kernel's
      layout, then for each of ``(row, col)`` its poison flag (None unless ``poison``).
    """
    m, k = x2.shape
    unit_m = 64 if (col is not None) else 16
    bm = tp.pick_block(m, config.block_rows, unit_m)
    bk = tp.pick_block(k, config.block_cols, 128)
    spec = tp.KernelSpec(m, k, x2.dtype, bm, bk, config.stages, 0, row, col)
    num_tiles, _ = tp.tile_counts(spec)
    spec = dataclasses.replace(spec, grid=tp.grid_size(
        num_tiles, num_ctas=config.num_ctas, ctas_per_sm=config.ctas_per_sm,
        interpret=interpret))
    stages = tp.pipeline_stages(spec)
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
