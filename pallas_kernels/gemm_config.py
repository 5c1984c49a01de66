"""Tuning of the Hopper NVFP4 GEMM (`pallas_kernels.gemm`): tile sizes and scheduling.

`TuningConfig` holds every static knob of the general kernel (`pallas_kernels.gemm_kernel`);
`SkinnyConfig` those of the skinny kernel (`pallas_kernels.gemm_skinny`, M <= 64, a
16×16-tiled weight: fprop and dgrad). `default_config` picks, for a problem size, the
skinny kernel where it fits, else the largest CTA tile that divides the problem
(`PIPELINED_CONFIG` for big GEMMs, then the serial mainloop's `LARGE_CONFIG` and smaller
tiles, `SKINNY_CONFIG` for other decode-like ``M <= 64``, where M is zero-padded to one
tile).

Example:
  >>> from pallas_kernels import gemm_config
  >>> gemm_config.default_config(8192, 8192, 8192) == gemm_config.PIPELINED_CONFIG
  True
  >>> gemm_config.default_config(8192, 8192, 8192 + 64) == gemm_config.LARGE_CONFIG
  True
  >>> cfg = gemm_config.default_config(16, 8192, 8192)
  >>> type(cfg).__name__, cfg.cta_tile_n, cfg.k_splits  # 32 column tiles x 4 K splits
  ('SkinnyConfig', 256, 4)
  >>> gemm_config.default_config(16, 8192, 8192, skinny=False) == gemm_config.SKINNY_CONFIG
  True
"""

from __future__ import annotations

import dataclasses
import enum


class MatmulDimension(enum.IntEnum):
    """An output dimension: M (rows) or N (columns)."""

    M = 0
    N = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuningConfig:
    """Tile sizes and scheduling of the NVFP4 GEMM kernel.

    Attributes:
      tile_m: output rows per consumer warpgroup (multiple of 64).
      tile_n: output columns per consumer warpgroup (multiple of 64).
      tile_k: contraction elements per pipeline step (multiple of 64).
      max_concurrent_steps: TMA pipeline depth (stages of packed tiles in SMEM).
      wg_dimension: how the two consumer warpgroups split the CTA tile; the CTA tile
        is ``(2·tile_m, tile_n)`` for M and ``(tile_m, 2·tile_n)`` for N.
      grid_minor_dim: the faster-moving output dimension of the persistent tile loop.
      grid_tile_width: width of the snake-ordered bands of output tiles (L2 reuse).
      epi_tile_m: rows of one epilogue store.
      epi_tile_n: columns of one epilogue store.
      k_splits: split the contraction across this many CTAs (for small M·N); the
        float32 partial sums are added outside the kernel.
      num_sms: CTAs of the persistent grid; ``None`` means one per SM of the device
        (132 on an H200).
      auto_barriers: let Pallas put a warpgroup barrier around every SMEM store
        (safe, slower); the default places the few barriers the kernel needs itself.
      decode: ``"subnormal"`` (default) builds ``e2m1 · 2**-126`` with two integer ops
        per element and relies on the BF16 multiply keeping subnormal inputs (PTX
        ``mul.bf16x2`` does); ``"normal"`` never forms a subnormal: it builds the
        normal BF16 numbers ``{.5, .75, 1, 1.5, 2, 3, 4, 6}`` and takes
        ``min(r, 2r - 1)`` (two more BF16x2 ops per two elements).
      mainloop: ``"serial"`` (default, `pallas_kernels.gemm_kernel`): each consumer
        warpgroup decodes the operand tiles it needs (the CTA's shared one twice), then
        multiplies and waits. ``"pipelined"`` (`pallas_kernels.gemm_pipelined`, needs
        `PIPELINED_CONFIG`'s tiles and ``decode="subnormal"``): each warpgroup decodes
        its lhs rows into registers and half of the rhs tile into a buffer both
        multiply with, and decodes a 64-wide substep while the tensor cores multiply
        the previous one.
      decoded_slots: the pipelined mainloop's decoded rhs buffers: 3 (default; a writer
        knows from the previous substep's barrier that the buffer's last readers are
        done) or 2 (32 KB less shared memory, and each substep's buffer is a constant:
        a release barrier per buffer instead of the slot arithmetic).
    """

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    max_concurrent_steps: int = 4
    wg_dimension: MatmulDimension = MatmulDimension.N
    grid_minor_dim: MatmulDimension = MatmulDimension.N
    grid_tile_width: int = 8
    epi_tile_m: int = 64
    epi_tile_n: int = 64
    k_splits: int = 1
    num_sms: int | None = None
    auto_barriers: bool = False
    decode: str = "subnormal"
    mainloop: str = "serial"
    decoded_slots: int = 3

    def __post_init__(self):
        if self.decode not in ("subnormal", "normal"):
            raise ValueError(f"decode must be 'subnormal' or 'normal', got {self.decode!r}")
        if self.mainloop not in ("serial", "pipelined"):
            raise ValueError(f"mainloop must be 'serial' or 'pipelined', got {self.mainloop!r}")
        if self.mainloop == "pipelined":
            tiles = (self.tile_m, self.tile_n, self.wg_dimension)
            if (tiles != (64, 256, MatmulDimension.M) or self.tile_k % 128
                    or self.decode != "subnormal"):
                raise ValueError(
                    "mainloop='pipelined' takes tile_m=64, tile_n=256, tile_k a multiple "
                    "of 128, wg_dimension=M and decode='subnormal', got "
                    f"{(self.tile_m, self.tile_n, self.tile_k)}, {self.wg_dimension.name}, "
                    f"{self.decode!r}")
        if self.decoded_slots not in (2, 3):
            raise ValueError(f"decoded_slots must be 2 or 3, got {self.decoded_slots}")
        if self.decoded_slots != 3 and self.mainloop != "pipelined":
            raise ValueError(f"decoded_slots={self.decoded_slots} applies to "
                             "mainloop='pipelined' only")
        for name in ("tile_m", "tile_n", "tile_k"):
            v = getattr(self, name)
            if v <= 0 or v % 64:
                raise ValueError(f"{name}={v} must be a positive multiple of 64")
        if self.max_concurrent_steps < 2:
            raise ValueError(f"max_concurrent_steps={self.max_concurrent_steps} must be >= 2")
        if self.tile_m % self.epi_tile_m or self.epi_tile_m % 64:
            raise ValueError(
                f"epi_tile_m={self.epi_tile_m} must be a multiple of 64 dividing "
                f"tile_m={self.tile_m}"
            )
        if self.tile_n % self.epi_tile_n or self.epi_tile_n % 16:
            raise ValueError(
                f"epi_tile_n={self.epi_tile_n} must be a multiple of 16 dividing "
                f"tile_n={self.tile_n}"
            )
        if self.k_splits < 1 or self.grid_tile_width < 1:
            raise ValueError("k_splits and grid_tile_width must be >= 1")
        if self.num_sms is not None and self.num_sms < 1:
            raise ValueError(f"num_sms={self.num_sms} must be >= 1")

    @property
    def cta_tile_m(self) -> int:
        """Output rows of one CTA tile."""
        return self.tile_m * (2 if self.wg_dimension == MatmulDimension.M else 1)

    @property
    def cta_tile_n(self) -> int:
        """Output columns of one CTA tile."""
        return self.tile_n * (2 if self.wg_dimension == MatmulDimension.N else 1)


LARGE_CONFIG = TuningConfig()
"""The serial mainloop's large tiles, CTA tile 128×256×64 (warpgroups split N), 4 stages:
the default where `PIPELINED_CONFIG` does not divide the problem."""

PIPELINED_CONFIG = TuningConfig(
    tile_m=64, tile_n=256, tile_k=128, max_concurrent_steps=3,
    wg_dimension=MatmulDimension.M, mainloop="pipelined", decoded_slots=2,
)
"""Default for large GEMMs whose M, N and K it divides: the pipelined mainloop
(`pallas_kernels.gemm_pipelined`), CTA tile 128×256, each consumer warpgroup 64×256, 3
stages of 128 packed K (two 64-wide substeps each), two decoded rhs buffers. On the H200
it ran 1.23–1.41× faster than `LARGE_CONFIG` at 4096³ and 8192³ in the three layouts, with
the same bits; two decoded buffers instead of three were 1.05× faster at 8192³ fprop
(docs/BENCHMARKS.md, ninth session)."""

SKINNY_CONFIG = TuningConfig(
    tile_m=64, tile_n=64, tile_k=128, max_concurrent_steps=6, k_splits=2,
)
"""Default for M ≤ 64 (decode-like): streams the 4.5-bit rhs once, K split in two."""

_FALLBACK_CONFIGS = (
    dataclasses.replace(LARGE_CONFIG, wg_dimension=MatmulDimension.M),  # 256×128
    dataclasses.replace(LARGE_CONFIG, tile_n=64),  # 128×128
    dataclasses.replace(LARGE_CONFIG, tile_m=64, wg_dimension=MatmulDimension.M),
    dataclasses.replace(LARGE_CONFIG, tile_m=64, tile_n=64),  # 64×128
    dataclasses.replace(
        LARGE_CONFIG, tile_m=64, tile_n=64, wg_dimension=MatmulDimension.M
    ),  # 128×64
)


MAX_PADDED_M = 64
"""An M up to this size that does not fill a CTA tile is zero-padded (skinny GEMMs)."""

SKINNY_CTA_N = 256
"""Weight columns per CTA of the skinny kernel (two warpgroups of 128)."""

PLANNED_SMS = 132
"""SMs the default split-K of the skinny kernel fills (an H200)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SkinnyConfig:
    """Tuning of the skinny kernel (`pallas_kernels.gemm_skinny`, M <= 64).

    Attributes:
      tile_k: contraction elements per pipeline step (multiple of 128: a stage's scale
        tile, ``tile_k/16 × 16`` bytes, must be a multiple of 128 bytes for TMA).
      max_concurrent_steps: TMA pipeline depth.
      k_splits: CTAs that split K (``N/256 · k_splits`` CTAs in all); the float32
        partial sums are added outside the kernel.
      num_sms: CTAs of the persistent grid; ``None``: one per SM.
      k_substeps: decode and multiply each step's tile in this many parts along K
        (``tile_k / k_substeps`` a multiple of 64), issuing each part's ``wgmma``
        before decoding the next, so the tensor cores overlap the decode.
    """

    tile_k: int = 128
    max_concurrent_steps: int = 6
    k_splits: int = 4
    num_sms: int | None = None
    k_substeps: int = 1

    def __post_init__(self):
        if self.tile_k <= 0 or self.tile_k % 128:
            raise ValueError(f"tile_k={self.tile_k} must be a positive multiple of 128")
        if self.max_concurrent_steps < 2:
            raise ValueError(f"max_concurrent_steps={self.max_concurrent_steps} must be >= 2")
        if self.k_splits < 1:
            raise ValueError(f"k_splits={self.k_splits} must be >= 1")
        if self.num_sms is not None and self.num_sms < 1:
            raise ValueError(f"num_sms={self.num_sms} must be >= 1")
        if self.k_substeps < 1 or self.tile_k % (64 * self.k_substeps):
            raise ValueError(f"tile_k={self.tile_k} must be a multiple of 64·k_substeps "
                             f"(k_substeps={self.k_substeps})")

    @property
    def cta_tile_m(self) -> int:
        """Rows of M one CTA covers (M is padded, at most this)."""
        return MAX_PADDED_M

    @property
    def cta_tile_n(self) -> int:
        """Output columns of one CTA."""
        return SKINNY_CTA_N


SKINNY_MIN_STEPS = 4
"""The default split-K leaves each CTA at least this many pipeline steps."""


def skinny_config(n: int, k: int, *, tile_k: int = 128) -> SkinnyConfig | None:
    """The default skinny tuning for N and K, or None when no K split divides K.

    ``k_splits`` is the largest power of two that keeps the grid within `PLANNED_SMS`
    CTAs and every CTA at least `SKINNY_MIN_STEPS` steps (or 1). (256-wide K steps in
    two substeps, 4 deep, timed the same as this at 16×8192×8192 on the H200 in an
    alternating A/B: docs/BENCHMARKS.md, ninth session.)
    """
    if n % SKINNY_CTA_N or k % tile_k:
        return None
    ks = 1
    while (n // SKINNY_CTA_N * 2 * ks <= PLANNED_SMS
           and k % (2 * ks * tile_k) == 0 and k // (2 * ks * tile_k) >= SKINNY_MIN_STEPS):
        ks *= 2
    return SkinnyConfig(tile_k=tile_k, k_splits=ks)


def _fits(cfg: TuningConfig, m: int, n: int, k: int) -> bool:
    m_ok = m % cfg.cta_tile_m == 0 or m <= MAX_PADDED_M
    return m_ok and n % cfg.cta_tile_n == 0 and k % (cfg.tile_k * cfg.k_splits) == 0


def default_config(m: int, n: int, k: int, *, skinny: bool = True
                   ) -> TuningConfig | SkinnyConfig:
    """The default config for an ``(m, k) @ (k, n)`` GEMM.

    For ``m <= 64`` the skinny kernel's `skinny_config` where it fits (``skinny``: the
    operands are in its layout, see `pallas_kernels.gemm`); otherwise the largest
    `TuningConfig` CTA tile that divides the problem (an M below one tile is padded).
    """
    if m <= MAX_PADDED_M and skinny and (cfg := skinny_config(n, k)) is not None:
        return cfg
    if m <= 64:
        for cfg in (SKINNY_CONFIG, dataclasses.replace(SKINNY_CONFIG, k_splits=1),
                    dataclasses.replace(SKINNY_CONFIG, tile_k=64, k_splits=1)):
            if _fits(cfg, m, n, k):
                return cfg
    for cfg in (PIPELINED_CONFIG, LARGE_CONFIG, *_FALLBACK_CONFIGS):
        if _fits(cfg, m, n, k):
            return cfg
    return LARGE_CONFIG  # matmul raises a ValueError naming the shapes

