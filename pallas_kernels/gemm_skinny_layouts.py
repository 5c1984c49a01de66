"""Register layouts and renamings of the skinny NVFP4 GEMM (`pallas_kernels.gemm_skinny`).

The skinny kernel computes ``Cᵀ = W' · Xᵀ`` with the weight ``W'`` as ``wgmma``'s
register A operand, `WG_ROWS` = 128 of its rows (output columns) per consumer
warpgroup. A thread of the WGMMA layout owns four A rows (``r, r+8, r+64, r+72`` of its
warp's 16) and, per 16 contraction columns, the pairs ``2c, 2c+1`` and ``2c+8, 2c+9``.
The kernel reads the weight's codes *as stored* with 32-bit shared-memory loads and
makes every loaded word feed whole A registers, with no shuffles, by permuting A's rows
(the output columns, undone by the store) and, for dgrad, A's columns (the contraction,
applied to the activations too, before the kernel):

* ``fprop`` (``X @ W``, W stored ``(K/2, N)``, codes packed along K): a word holds one
  byte (two K elements) of four adjacent output columns; the thread's four rows *are*
  those columns (`fprop_row`). One A register = one byte.
* ``dgrad`` (``dY @ Wᵀ``, the same stored W, now ``(N'/2, K')`` with the output N'
  packed): a word holds four adjacent contraction columns of two output rows (a
  byte's two nibbles); the thread's rows ``r, r+8`` are those two (`dgrad_row`) and its
  column pairs ``2c, 2c+1`` and ``2c+8, 2c+9`` are the word's bytes 0-1 and 2-3
  (`dgrad_col`). One A register = one nibble of two bytes.

`Variant` holds, per layout, the Mosaic layouts of the code, scale and output tiles
and the logical maps; `decode_plan` and `store_plan` derive the register renamings from
the layouts' definitions (`thread_view`: the tiling semantics documented in
``mosaic/gpu/fragmented_array.py``); the tests check them for every thread.

Example:
  >>> from pallas_kernels import gemm_skinny_layouts as sl
  >>> [sl.fprop_row(r) for r in (0, 1, 4, 8, 16, 64)]  # a thread owns rows r, r+8, r+64, r+72
  [0, 4, 64, 1, 16, 2]
  >>> [sl.dgrad_col(c) for c in range(16)]  # lane c: columns 2c, 2c+1, 2c+8, 2c+9
  [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu.fragmented_array import Replicated, TiledLayout, Tiling

from fp4jax.numerics.constants import BLOCK
from pallas_kernels.wgmma_regs import ZERO_BYTE
from pallas_kernels.wgmma_regs import tiled_layout as _layout

WG_ROWS = 128
"""A rows (output columns) per consumer warpgroup: two ``m64`` wgmma groups."""


def fprop_row(rho: int) -> int:
    """fprop: the output column (within a warpgroup's 128) of A row ``rho``.

    Row ``64·mi + 16·warp + 8·h + r`` (lane ``4r + c``) is column ``n0 + 2·mi + h`` of its
    thread's word, ``n0 = 64·(r // 4) + 16·warp + 4·(r % 4)`` (conflict-free banks).
    """
    mi, w, h, r = rho // 64, (rho // 16) % 4, (rho // 8) % 2, rho % 8
    return 64 * (r // 4) + 16 * w + 4 * (r % 4) + 2 * mi + h


def dgrad_row(rho: int) -> int:
    """dgrad: the output row of A row ``rho``: ``2j + h``, packed byte row ``j = 32·mi +
    8·warp + r`` (its low nibble for ``h = 0``, high for ``h = 1``)."""
    mi, w, h, r = rho // 64, (rho // 16) % 4, (rho // 8) % 2, rho % 8
    return 2 * (32 * mi + 8 * w + r) + h


def dgrad_col(kappa: int) -> int:
    """dgrad: the contraction column of A column ``kappa`` (a permutation within each
    16-block): lane ``c``'s pairs ``2c, 2c+1`` and ``2c+8, 2c+9`` are its word's bytes."""
    q, c, v = kappa // 8, (kappa // 2) % 4, kappa % 2
    return 16 * (q // 2) + 4 * c + 2 * (q % 2) + v


@dataclasses.dataclass(frozen=True)
class Variant:
    """One operand layout of the skinny kernel.

    Attributes:
      name: ``"fprop"`` or ``"dgrad"``.
      codes: layout of a warpgroup's code tile, shape `codes_shape` (tile_k).
      scales: layout of its scale tile, shape `scales_shape` (tile_k).
      out: layout of the (M, 128) output slice.
      row: A row -> output column (within the warpgroup's 128).
      col: A column -> contraction column (within a 16-block).
      byte: (output column, contraction column) -> (code tile index, nibble).
      scale: (output column, contraction column) -> scale tile index.
    """

    name: str
    codes: TiledLayout
    scales: TiledLayout
    out: TiledLayout
    row: Callable[[int], int]
    col: Callable[[int], int]
    byte: Callable[[int, int], tuple[tuple[int, int], int]]
    scale: Callable[[int, int], tuple[int, int]]

    def codes_shape(self, tile_k: int) -> tuple[int, int]:
        """Shape of a warpgroup's code tile (bytes)."""
        return (tile_k // 2, WG_ROWS) if self.name == "fprop" else (WG_ROWS // 2, tile_k)

    def scales_shape(self, tile_k: int) -> tuple[int, int]:
        """Shape of a warpgroup's scale tile (E4M3 bytes, one per 16×16 tile)."""
        if self.name == "fprop":
            return tile_k // BLOCK, WG_ROWS // BLOCK
        return WG_ROWS // BLOCK, tile_k // BLOCK


FPROP = Variant(
    name="fprop",
    # (tile_k/2, 128): byte row j = 4q + c, column 64a + 16·warp + 4b + e; lane 16a + 4b
    # + c, register q, vector position e (4 bytes).
    codes=_layout(((4, 128), (4, 64), (4, 16), (4, 4)), (-5,), (-7, -3, -2), -1),
    # (tile_k/16, 8): a thread holds the column 4a + warp of its rows' 16-column group.
    scales=_layout(((1, 8), (1, 4), (1, 1)), (-3,), (-5, Replicated(4), Replicated(4)), -1),
    # (M, 128): row 8t + 2c + v, columns as in `codes` (vector of 4).
    out=_layout(((8, 128), (8, 64), (8, 16), (8, 4), (2, 4)), (-7,), (-9, -5, -4), -1),
    row=fprop_row,
    col=lambda kappa: kappa,
    byte=lambda n, k: ((k // 2, n), k % 2),
    scale=lambda n, k: (k // BLOCK, n // BLOCK),
)

DGRAD = Variant(
    name="dgrad",
    # (64, tile_k): byte row j = 32·mi + 8·warp + r, column 16Q + 4c + e; lane 4r + c,
    # registers (mi, Q), vector position e (4 bytes).
    codes=_layout(((64, 16), (32, 16), (8, 16), (1, 4)), (-6,), (-4, -3), -1),
    # (8, tile_k/16): a thread holds the rows 4·mi + warp (all lanes the same).
    scales=_layout(((8, 8), (4, 8), (1, 8)), (-4,), (Replicated(32),), -1),
    # (M, 128): row 8t + 2c + v, column 64·mi + 16·warp + 2r + h (vector of 2).
    out=_layout(((8, 128), (8, 64), (8, 16), (8, 2), (2, 2)), (-7,), (-5, -4), -1),
    row=dgrad_row,
    col=dgrad_col,
    byte=lambda n, k: ((n // 2, k), n % 2),
    scale=lambda n, k: (n // BLOCK, k // BLOCK),
)

VARIANTS = {"fprop": FPROP, "dgrad": DGRAD}


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


def registers_of(layout: TiledLayout, shape: tuple[int, ...], warp: int, lane: int
                 ) -> dict[tuple[int, ...], tuple[tuple[int, ...], int]]:
    """``{logical index: (register index, vector position)}`` of one thread: `thread_view`
    inverted."""
    return {idx: key for key, idx in thread_view(layout, shape, warp, lane).items()}


def decode_plan(variant: Variant, tile_k: int, warp: int = 0, lane: int = 0) -> dict:
    """``{A register: (code register, prmt selector, (scale register, vector position))}``
    for one thread.

    A register ``(rho, κ), (rho, κ+1)`` holds the codes of output column ``row(rho)``
    at contraction columns ``col(κ)``, ``col(κ+1)``; both must be nibbles of one
    loaded word: byte ``p`` of the word is ``u``'s byte ``p`` (low nibble) or ``v``'s,
    selector ``4 + p`` (high nibble), gathered to the halves' low bytes. The kernel
    uses thread 0's plan; the renaming must be the same in every thread (tested).
    """
    a = thread_view(mgpu.WGMMA_LAYOUT, (WG_ROWS, tile_k), warp, lane)
    codes = registers_of(variant.codes, variant.codes_shape(tile_k), warp, lane)
    scales = registers_of(variant.scales, variant.scales_shape(tile_k), warp, lane)
    plan = {}
    for (reg, v), (rho, kappa) in a.items():
        if v:
            continue
        n = variant.row(rho)
        srcs, sel = set(), []
        for kk in (kappa, kappa + 1):
            k = 16 * (kk // 16) + variant.col(kk % 16)
            idx, nibble = variant.byte(n, k)
            src, p = codes[idx]
            srcs.add(src)
            sel.append(p + 4 * nibble)
        assert len(srcs) == 1, (reg, srcs)
        selector = sel[0] | ZERO_BYTE << 4 | sel[1] << 8 | ZERO_BYTE << 12
        scale_keys = {scales[variant.scale(n, 16 * (kk // 16) + variant.col(kk % 16))]
                      for kk in (kappa, kappa + 1)}
        assert len(scale_keys) == 1
        plan[reg] = (srcs.pop(), selector, scale_keys.pop())
    return plan


def store_plan(variant: Variant, m: int, warp: int = 0, lane: int = 0) -> dict:
    """``{output register: [(accumulator register, vector position)] per element}`` for
    one thread: output ``(mm, n)`` is accumulator element ``(row⁻¹(n), mm)``."""
    inv_row = {variant.row(r): r for r in range(WG_ROWS)}
    acc = registers_of(mgpu.WGMMA_LAYOUT, (WG_ROWS, m), warp, lane)
    out = thread_view(variant.out, (m, WG_ROWS), warp, lane)
    plan: dict = {}
    for (reg, _pos), (mm, n) in sorted(out.items()):  # vector positions in order
        plan.setdefault(reg, []).append(acc[(inv_row[n], mm)])
    return plan


cached_decode_plan = functools.cache(decode_plan)
cached_store_plan = functools.cache(store_plan)
