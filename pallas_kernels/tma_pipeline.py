"""Shared Mosaic GPU plumbing of the Hopper kernels: layouts, TMA pipeline, grid.

How the quantize kernels read their input (all Mosaic GPU, ``plgpu.kernel``, Lane
semantics):

* ``x`` is viewed (free, in XLA) as uint32 words holding two adjacent 16-bit elements,
  shaped ``(M/16, 16, K/16, 8)``: 16-row groups × rows × 16-column blocks × words
  (`as_words`). Even elements sit in the low half, so packing two E2M1 codes per byte
  is a per-word operation, never a cross-element shuffle.
* A persistent grid of CTAs walks the tiles; each CTA keeps ``stages`` TMA loads in
  flight (`pipelined_loop`, a manual mbarrier pipeline) and writes codes/scales straight
  from registers to global memory (no SMEM staging, so every GMEM stride is allowed).
* Rowwise engine (`ROW_LAYOUT`): one register layout holds a whole 16-element block in
  one thread (2 × 16-byte vectors), so the block amax is an in-thread reduction.
* Columnwise engine (`COL_LAYOUT`): the 16 rows of a 16-row group are 16 separate
  register arrays (16 strided SMEM loads, lanes along K, conflict-free).
* Tiles of 64 × 64 use `NARROW_ROW_LAYOUT` and `NARROW_COL_LAYOUT` instead
  (`engine_layouts`): the same structure with 32 elements per thread instead of 64, so
  the kernels need fewer registers and more CTAs fit an SM.

`num_sms` is the one SM count of every kernel here, the GEMM's included.

Example:
  >>> from pallas_kernels import tma_pipeline
  >>> tma_pipeline.pick_block(192, 128, 64)  # largest multiple of 64 <= 128 dividing 192
  64
  >>> tma_pipeline.num_sms(interpret=True)
  2
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4jax.numerics.hadamard import DEFAULT_SIGNS

_U32 = jnp.uint32

# Register layouts. Words are uint32 pairs of 16-bit inputs.
# Rowwise: (groups, 16 rows, blocks, 8 words); warps over 4-row quads, lanes over
# 4 rows x 8 blocks, each thread holds one block as two 4-word vectors.
ROW_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((1, 16, 8, 8), (4, 8, 8), (4,))),
    warp_dims=(-7,),
    lane_dims=(-4, -3),
    vector_dim=-1,
)
# Columnwise: (groups, blocks, 8 words) for one row of each 16-row group; warps over
# 4 groups, lanes over 8 blocks x 4 word pairs, 2-word vectors.
COL_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((4, 8, 8), (2,))),
    warp_dims=(-4,),
    lane_dims=(-3, -2),
    vector_dim=-1,
)

# Narrow tiles (64 × 64, `QuantizeConfig.block_cols` = 64): half the elements per thread
# (32), so a thread keeps fewer values live and more warps fit an SM.
# Rowwise: 4 groups × 16 rows × 4 blocks × 8 words; a warp per group, lanes over 8 rows ×
# 4 blocks, each thread two rows (8 apart) of one block as 4-word vectors.
NARROW_ROW_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((4, 16, 4, 8), (8, 4, 8), (4,))),
    warp_dims=(-8,),
    lane_dims=(-4, -3),
    vector_dim=-1,
)
# Columnwise: a warp per group, lanes over 4 blocks × 8 words, one word per register.
NARROW_COL_LAYOUT = plgpu.Layout.TILED(
    plgpu.Tiling(((4, 4, 8), (1,))),
    warp_dims=(-4,),
    lane_dims=(-3, -2),
    vector_dim=-1,
)

NARROW_COLS = 64
"""Tile width of the narrow layouts (`engine_layouts`)."""


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """Static description of one quantized output of a kernel.

    ``block_strides = (s_m, s_k)`` number the 16-blocks for stochastic rounding
    (docs/RECIPE.md §5): the block at M-unit ``i`` and K-unit ``j`` of the kernel's
    ``(M, K)`` input is ``b = i * s_m + j * s_k``. The units are the engine's: for the
    rowwise engine a row and a 16-column block, for the columnwise engine a 16-row group
    and a column. The caller picks the strides that make ``b`` the reference's row-major
    block number in the tensor's own layout (e.g. ``(K/16, 1)`` rowwise, ``(K, 1)``
    columnwise, ``(1, K/16)`` for the columnwise engine run on ``x.T``).
    """

    stochastic: bool
    block_2d: bool = False
    hadamard: bool = False
    signs: tuple[int, ...] = DEFAULT_SIGNS
    block_strides: tuple[int, int] | None = None  # SR block numbering (per M-unit, per K-unit)
    poison: bool = False  # also report whether a (rotated) value was non-finite
    values: bool = False  # write the dequantized BF16 values (1D blocks), not codes and scales


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Static shape, tiling and outputs of one quantize-kernel launch."""

    m: int
    k: int
    dtype: Any
    bm: int
    bk: int
    stages: int
    grid: int
    row: OutputSpec | None
    col: OutputSpec | None
    hardware_casts: bool = False
    """Round the RHT output with the GPU's float conversion (`bit_tricks.round_to_16bit`);
    False in interpret mode, where XLA would remove the cast round trip."""


def engine_layouts(spec: KernelSpec) -> tuple[Any, Any]:
    """The (rowwise, columnwise) engines' register layouts for ``spec``'s tiles: the
    narrow ones for 64-column tiles (then ``bm % 64 == 0``), else `ROW_LAYOUT` and
    `COL_LAYOUT` (tiles of a multiple of 128 columns)."""
    if spec.bk == NARROW_COLS:
        return NARROW_ROW_LAYOUT, NARROW_COL_LAYOUT
    return ROW_LAYOUT, COL_LAYOUT


def kernel_name(spec: KernelSpec) -> str:
    """A name for profiles and traces saying which outputs a quantize launch writes.

    >>> kernel_name(KernelSpec(64, 128, None, 64, 128, 2, 1, OutputSpec(False),
    ...             OutputSpec(True, hadamard=True)))
    'fp4jax_quantize_row_rne_col_rht_sr'
    """
    parts = ["fp4jax_quantize"]
    for label, out in (("row", spec.row), ("col", spec.col)):
        if out is not None:
            parts += [label] + ["2d"] * out.block_2d + ["rht"] * out.hadamard
            parts.append("sr" if out.stochastic else "rne")
    return "_".join(parts)


def tile_counts(spec: KernelSpec) -> tuple[int, int]:
    """(number of tiles, tiles along K) of ``spec``."""
    tk = spec.k // spec.bk
    return (spec.m // spec.bm) * tk, tk


def pipelined_loop(spec: KernelSpec, x_gmem, x_smem, bar, body):
    """Persistent loop over this CTA's tiles with ``stages`` TMA loads in flight.

    Returns ``(step, n_local)``: run ``lax.fori_loop(0, n_local, step, init)``; ``body(
    tile_smem, g0, b0, carry) -> carry`` sees each tile once, at group ``g0``, block ``b0``.
    """
    bg, bnb = spec.bm // 16, spec.bk // 16
    num_tiles, tk = tile_counts(spec)
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
        def _prologue(s=s):
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


def interpret_params(interpret: bool):
    """The ``interpret=`` argument of ``plgpu.kernel``: CPU interpretation or None."""
    return plgpu.InterpretGPUParams() if interpret else None


def num_sms(interpret: bool) -> int:
    """SMs of the device (132 on an H200, and when lowering on a host without a GPU);
    2 in interpret mode, where every CTA is a host thread."""
    if interpret:
        return 2
    dev = jax.devices()[0]
    return int(getattr(dev, "core_count", 0) or 132)


def grid_size(num_tiles: int, *, num_ctas: int | None, ctas_per_sm: int,
              interpret: bool) -> int:
    """CTAs of a persistent grid: ``num_ctas``, else ``ctas_per_sm`` per SM; <= tiles."""
    g = num_ctas if num_ctas is not None else ctas_per_sm * num_sms(interpret)
    return max(1, min(g, num_tiles))


SMEM_BUDGET = 200 * 1024
"""Bytes of input stages per CTA (the H200 has 227 KiB of SMEM per block)."""


def pipeline_stages(spec: KernelSpec) -> int:
    """Pipeline depth: the configured one, capped by SMEM and by this CTA's tile count."""
    num_tiles, _ = tile_counts(spec)
    tile_bytes = spec.bm * spec.bk * 2
    return max(1, min(spec.stages, SMEM_BUDGET // tile_bytes, -(-num_tiles // spec.grid)))


def launch_spec(spec: KernelSpec, *, num_ctas: int | None, ctas_per_sm: int,
                interpret: bool) -> KernelSpec:
    """``spec`` with its persistent grid size and its pipeline depth filled in."""
    num_tiles, _ = tile_counts(spec)
    spec = dataclasses.replace(spec, grid=grid_size(
        num_tiles, num_ctas=num_ctas, ctas_per_sm=ctas_per_sm, interpret=interpret),
        hardware_casts=not interpret)
    return dataclasses.replace(spec, stages=pipeline_stages(spec))


def pick_block(extent: int, want: int, unit: int) -> int:
    """Largest multiple of ``unit`` that is <= ``want`` and divides ``extent``."""
    b = max(unit, want - want % unit)
    while b > unit and extent % b:
        b -= unit
    return b


def as_words(x: jax.Array) -> jax.Array:
    """(M, K) 16-bit -> (M/16, 16, K/16, 8) uint32 words (a bitcast)."""
    m, k = x.shape
    w = lax.bitcast_convert_type(x.reshape(m, k // 2, 2), _U32)
    return w.reshape(m // 16, 16, k // 16, 8)


def as_bytes(u16: jax.Array, rows: int, cols: int) -> jax.Array:
    """uint16 array holding byte pairs (low byte first) -> (rows, cols) uint8."""
    return lax.bitcast_convert_type(u16.reshape(rows, cols // 2), jnp.uint8).reshape(rows, cols)


def lane_params(**kw) -> plgpu.CompilerParams:
    """Mosaic GPU compiler params with Lane semantics (and any extra ``kw``)."""
    return plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane, **kw)


def from_words(words: jax.Array, m: int, k: int, dtype) -> jax.Array:
    """The inverse of `as_words`: (M/16, 16, K/16, 8) uint32 words -> (M, K) ``dtype``."""
    return lax.bitcast_convert_type(words.reshape(m, k // 2), dtype).reshape(m, k)
