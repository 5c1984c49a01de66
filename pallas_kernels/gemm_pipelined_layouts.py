"""Register layouts and renamings of the pipelined NVFP4 GEMM (`pallas_kernels.gemm_pipelined`).

A consumer warpgroup owns 64 output rows × 256 columns. Per 64-wide K step it decodes
its 64 lhs rows into ``wgmma``'s register A operand (`WG_M` × `TILE_K`) and one half of
the step's rhs tile (64 × `HALF_N` of 64 × `CTA_N`) into a shared SMEM buffer that both
warpgroups multiply with. Every load of packed codes is 16 to 128 bits wide and every
decoded word feeds whole registers without shuffles, because the kernel may permute the
contraction within a K step (`AOperand.col`, applied to both operands) and, for an lhs
stored ``(K/2, M)``, the A rows (`AOperand.row`, undone by the epilogue's renaming).

A thread of the WGMMA layout owns A rows ``r, r+8`` of its warp's 16 (lane ``4r + c``)
and, per 16 columns, the pairs ``2c, 2c+1`` and ``2c+8, 2c+9``: 8 pairs per row and K step.

* `A_ROWS` (lhs ``(M, K/2)``, codes packed along K: fprop, dgrad): each A row's 8 pairs are
  the 8 adjacent bytes ``[8c, 8c+8)`` of the row (one 64-bit load): A column κ holds
  contraction ``16c + 2p + v`` with ``p = 2·(κ // 16) + (κ % 16) // 8``, ``v = κ % 2``
  (`rows_col`), so each thread's pairs share one 16-block scale per row.
* `A_COLS` (lhs ``(K/2, M)``, the wgrad ``x_res.mT``): a byte is one A register (two K
  elements of one row); a thread's rows are two adjacent lhs rows (`cols_row`: one 16-bit
  load per packed K row), the contraction order is the natural one.
* `B_ROWS` (rhs ``(K/2, N)``: fprop's W, wgrad's dY): a thread loads 8 adjacent bytes of 4
  packed rows and stores 8 rows of 8 columns (16-byte stores) of the N-major decoded tile.
* `B_COLS` (rhs ``(N/2, K)``: dgrad's ``W.mT``): a thread loads one packed row (64 bytes)
  and stores one decoded row of the K-major tile (its low or high nibbles: the thread's
  lane parity picks the plane).

`a_plan`, `b_plan` and `epilogue_plan` derive the register renamings from the layouts'
definitions (`gemm_skinny_layouts.thread_view`); the tests check them for every thread.

Example:
  >>> from pallas_kernels import gemm_pipelined_layouts as pl_
  >>> [pl_.rows_col(k) for k in (0, 1, 2, 8, 16, 63)]  # A column -> contraction
  [0, 1, 16, 2, 4, 63]
  >>> [pl_.cols_row(r) for r in (0, 1, 8, 16)]  # A row -> lhs row (A_COLS)
  [0, 2, 1, 16]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu.fragmented_array import Replicated, TiledLayout

from fp4jax.numerics.constants import BLOCK
from pallas_kernels.gemm_skinny_layouts import registers_of, thread_view
from pallas_kernels.wgmma_regs import tiled_layout

WG_M = 64
"""Output rows (A rows) per consumer warpgroup: one ``m64`` wgmma group."""
TILE_K = 64
"""Contraction elements per pipeline step."""
CTA_N = 256
"""Output columns of a CTA tile (the ``n`` of every wgmma)."""
HALF_N = CTA_N // 2
"""Columns of the rhs tile each consumer warpgroup decodes."""


def rows_col(kappa: int) -> int:
    """`A_ROWS`: the contraction index (within a K step) of A column ``kappa``."""
    t, hf, c, v = kappa // 16, (kappa % 16) // 8, (kappa % 8) // 2, kappa % 2
    return 16 * c + 2 * (2 * t + hf) + v


def cols_row(rho: int) -> int:
    """`A_COLS`: the lhs row (within a warpgroup's 64) of A row ``rho``: ``16w + 2r + h``
    for ``rho = 16w + 8h + r``."""
    w, h, r = rho // 16, (rho % 16) // 8, rho % 8
    return 16 * w + 2 * r + h


def _identity(i: int) -> int:
    return i


@dataclasses.dataclass(frozen=True)
class AOperand:
    """The lhs of one layout: its code and scale tiles (a warpgroup's share of a K step)
    and how they map onto the register A operand.

    Attributes:
      name: ``"rows"`` (stored ``(M, K/2)``) or ``"cols"`` (stored ``(K/2, M)``).
      codes: layout of the code tile, shape `codes_shape`.
      scales: layout of the bf16 scale-factor tile ``(TILE_K/16, WG_M)``.
      codes_shape: ``(WG_M, TILE_K/2)`` or ``(TILE_K/2, WG_M)`` bytes.
      row: A row -> lhs row (within the warpgroup's `WG_M`).
      col: A column -> contraction index (within the step); the rhs uses the same.
      byte: (lhs row, contraction) -> (code tile index, nibble).
    """

    name: str
    codes: TiledLayout
    scales: TiledLayout
    codes_shape: tuple[int, int]
    row: Callable[[int], int]
    col: Callable[[int], int]
    byte: Callable[[int, int], tuple[tuple[int, int], int]]

    scales_shape = (TILE_K // BLOCK, WG_M)

    @staticmethod
    def scale(m: int, k: int) -> tuple[int, int]:
        """(lhs row, contraction) -> scale tile index."""
        return k // BLOCK, m


A_ROWS = AOperand(
    name="rows",
    # (64, 32): rows 16·warp + r + 8h (lane 4r + c, register h), bytes [8c, 8c + 8).
    codes=tiled_layout(((64, 32), (16, 32), (8, 8)), (-6,), (-2, -3), -1),
    # (4, 64): block c of rows 16·warp + r + 8h (register h).
    scales=tiled_layout(((4, 64), (4, 16), (1, 8), (1, 1)), (-7,), (-3, -6), -1),
    codes_shape=(WG_M, TILE_K // 2),
    row=_identity,
    col=rows_col,
    byte=lambda m, k: ((m, k // 2), k % 2),
)

A_COLS = AOperand(
    name="cols",
    # (32, 64): packed rows 8t + 4hf + c (registers t, hf), bytes 16·warp + 2r + {0, 1}.
    codes=tiled_layout(((32, 64), (32, 16), (8, 16), (4, 16), (1, 2)), (-9,), (-3, -4), -1),
    # (4, 64): blocks t (registers), rows 16·warp + 2r + {0, 1}; the 4 lanes c share them.
    scales=tiled_layout(((4, 64), (4, 16), (1, 2)), (-5,), (-3, Replicated(4)), -1),
    codes_shape=(TILE_K // 2, WG_M),
    row=cols_row,
    col=_identity,
    byte=lambda m, k: ((k // 2, m), k % 2),
)

A_OPERANDS = {"rows": A_ROWS, "cols": A_COLS}


@dataclasses.dataclass(frozen=True)
class BOperand:
    """The rhs of one layout: a warpgroup's half of a K step's code and scale tiles and
    the decoded tile it stores, as the contraction order of its lhs (`col`) wants it.

    Attributes:
      name: ``"rows"`` (stored ``(K/2, N)``: an N-major decoded tile ``(TILE_K, HALF_N)``)
        or ``"cols"`` (stored ``(N/2, K)``: a K-major decoded tile ``(HALF_N, TILE_K)``).
      col: decoded-tile K index -> contraction index (the lhs's `AOperand.col`).
      codes, scales, stored: layouts of the code, scale-factor and decoded tiles.
      codes_shape, scales_shape, stored_shape: their shapes.
      thread_nibble: each thread decodes one nibble plane, its lane's parity (``"cols"``).
    """

    name: str
    col: Callable[[int], int]
    codes: TiledLayout
    scales: TiledLayout
    stored: TiledLayout
    codes_shape: tuple[int, int]
    scales_shape: tuple[int, int]
    stored_shape: tuple[int, int]
    thread_nibble: bool

    def element(self, idx: tuple[int, int]) -> tuple[int, int]:
        """Decoded-tile index -> (contraction, column within the half)."""
        if self.name == "rows":
            return self.col(idx[0]), idx[1]
        return self.col(idx[1]), idx[0]

    def byte(self, k: int, n: int) -> tuple[tuple[int, int], int]:
        """(contraction, column) -> (code tile index, nibble)."""
        if self.name == "rows":
            return (k // 2, n), k % 2
        return (n // 2, k), n % 2

    def scale(self, k: int, n: int) -> tuple[int, int]:
        """(contraction, column) -> scale tile index: ``(K/16, N)`` factors for ``"rows"``,
        ``(K/16, N/16)`` (16×16 tiles, the only ``(N/2, K)`` operand) for ``"cols"``."""
        return (k // BLOCK, n) if self.name == "rows" else (k // BLOCK, n // BLOCK)


# A thread of "rows" decodes packed rows [4a, 4a + 4) (contraction [8a, 8a + 8)), bytes
# [8g, 8g + 8): a = 2·warp + lane // 16, g = lane % 16.
_ROWS_CODES = tiled_layout(((32, 128), (8, 128), (4, 128), (1, 8)), (-8,), (-6, -3), -1)
_ROWS_SCALES = tiled_layout(((4, 128), (1, 128), (1, 8)), (-6,), (Replicated(2), -3), -1)
# Decoded rows of contraction [8a, 8a + 8): 32q + 8i + 2c + v under `rows_col`
# (c = warp, q = lane // 16), 8a + 2i + v in the natural order.
_ROWS_STORED_PERMUTED = tiled_layout(
    ((64, 128), (32, 128), (8, 128), (2, 128), (2, 8), (1, 8)), (-8,), (-12, -5), -1)
_ROWS_STORED_NATURAL = tiled_layout(
    ((64, 128), (16, 128), (8, 128), (8, 8), (1, 8)), (-10,), (-8, -5), -1)
# "cols": thread (warp, lane) stores decoded row n = 32·warp + lane; it loads packed row
# n // 2 (two lanes the same) and the 4 scale blocks of its 16-row group.
_COLS_CODES = tiled_layout(((64, 64), (16, 64), (1, 16)), (-6,), (-4, Replicated(2)), -1)
_COLS_SCALES = tiled_layout(((4, 8), (4, 2), (1, 1)), (-5,), (-3, Replicated(16)), -1)
_COLS_STORED = tiled_layout(((128, 64), (32, 64), (1, 8)), (-6,), (-4,), -1)


def b_operand(name: str, col: Callable[[int], int]) -> BOperand:
    """The rhs operand ``name`` (``"rows"`` or ``"cols"``) in the contraction order
    ``col`` (`rows_col` or the identity)."""
    if col not in (rows_col, _identity):
        raise ValueError("col must be rows_col or the identity")
    if name == "rows":
        stored = _ROWS_STORED_PERMUTED if col is rows_col else _ROWS_STORED_NATURAL
        return BOperand(name, col, _ROWS_CODES, _ROWS_SCALES, stored,
                        (TILE_K // 2, HALF_N), (TILE_K // BLOCK, HALF_N),
                        (TILE_K, HALF_N), thread_nibble=False)
    if name == "cols":
        return BOperand(name, col, _COLS_CODES, _COLS_SCALES, _COLS_STORED,
                        (HALF_N // 2, TILE_K), (TILE_K // BLOCK, HALF_N // BLOCK),
                        (HALF_N, TILE_K), thread_nibble=True)
    raise ValueError(f"unknown rhs operand {name!r}")


def operands(lhs_cols: bool, rhs_cols: bool) -> tuple[AOperand, BOperand]:
    """The (lhs, rhs) operands of a GEMM whose lhs / rhs are stored packed along their
    major axis (`pallas_kernels.gemm_kernel.Problem`)."""
    a = A_COLS if lhs_cols else A_ROWS
    return a, b_operand("cols" if rhs_cols else "rows", a.col)


# Output of an `A_COLS` GEMM (rows permuted): an epilogue tile (64, en) where thread
# (warp, 4r + c) holds lhs rows 16·warp + 2r + h (register h) and columns 8t + 2c + {0, 1}.
def cols_out_layout() -> TiledLayout:
    """The epilogue tile layout of an `A_COLS` GEMM (`epilogue_plan`)."""
    return tiled_layout(((64, 8), (16, 8), (2, 8), (1, 2)), (-8,), (-6, -3), -1)


def a_plan(a: AOperand, warp: int = 0, lane: int = 0) -> dict:
    """``{A register: (code register, word, prmt selector, (scale register, position))}``
    for one thread: the A register holds the codes of lhs row ``a.row(rho)`` at
    contraction ``a.col(κ)``, ``a.col(κ + 1)``, both nibbles of one 32-bit word of one
    loaded register, times one scale. The kernel uses thread 0's plan for every thread
    (the tests check that they agree)."""
    view = thread_view(mgpu.WGMMA_LAYOUT, (WG_M, TILE_K), warp, lane)
    codes = registers_of(a.codes, a.codes_shape, warp, lane)
    scales = registers_of(a.scales, a.scales_shape, warp, lane)
    plan = {}
    for (reg, v), (rho, kappa) in view.items():
        if v:
            continue
        m = a.row(rho)
        words, sel, skeys = set(), [], set()
        for kk in (kappa, kappa + 1):
            k = a.col(kk)
            idx, nibble = a.byte(m, k)
            src, p = codes[idx]
            words.add((src, p // 4))
            sel.append(p % 4 + 4 * nibble)
            skeys.add(scales[a.scale(m, k)])
        assert len(words) == 1 and len(skeys) == 1, (reg, words, skeys)
        src, word = words.pop()
        plan[reg] = (src, word, sel[0] | 8 << 4 | sel[1] << 8 | 8 << 12, skeys.pop())
    return plan


def b_plan(b: BOperand, warp: int = 0, lane: int = 0) -> dict:
    """``{decoded register: ((code register, word, (byte, byte), (nibble, nibble),
    (scale key, scale key)), ...)}`` for one thread, one entry per bf16x2 pair of the
    register's vector: the pair's two elements come from bytes of one 32-bit word of one
    loaded register. With ``b.thread_nibble`` both nibbles are the lane's parity and the
    kernel takes the bytes from that plane."""
    stored = thread_view(b.stored, b.stored_shape, warp, lane)
    codes = registers_of(b.codes, b.codes_shape, warp, lane)
    scales = registers_of(b.scales, b.scales_shape, warp, lane)
    plan: dict = {}
    for reg, pos in sorted(stored):
        if pos % 2:
            continue
        srcs, ps, nibs, skeys = set(), [], [], []
        for p in (pos, pos + 1):
            k, n = b.element(stored[(reg, p)])
            cidx, nibble = b.byte(k, n)
            src, byte = codes[cidx]
            srcs.add((src, byte // 4))
            ps.append(byte % 4)
            nibs.append(nibble)
            skeys.append(scales[b.scale(k, n)])
        assert len(srcs) == 1, (reg, pos, srcs)
        plan.setdefault(reg, []).append((*srcs.pop(), tuple(ps), tuple(nibs), tuple(skeys)))
    return {reg: tuple(entries) for reg, entries in plan.items()}


def epilogue_plan(a: AOperand, en: int, warp: int = 0, lane: int = 0) -> dict:
    """``{epilogue register: accumulator register}`` of an (`WG_M`, ``en``) output slice
    of an `A_COLS` GEMM: output row ``m`` is accumulator row ``row⁻¹(m)`` (a renaming
    within each thread; both vector positions come from the same register)."""
    inv_row = {a.row(r): r for r in range(WG_M)}
    acc = registers_of(mgpu.WGMMA_LAYOUT, (WG_M, en), warp, lane)
    out = thread_view(cols_out_layout(), (WG_M, en), warp, lane)
    plan: dict = {}
    for (reg, pos), (m, n) in out.items():
        src, src_pos = acc[(inv_row[m], n)]
        assert src_pos == pos, (reg, pos, src_pos)
        assert plan.setdefault(reg, src) == src, (reg, src)
    return plan


cached_a_plan = functools.cache(a_plan)
cached_b_plan = functools.cache(b_plan)
cached_epilogue_plan = functools.cache(epilogue_plan)
