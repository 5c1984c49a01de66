"""NVFP4 × NVFP4 GEMM for NVIDIA Hopper (sm_90) in Pallas Mosaic GPU.

Hopper has no FP4 tensor cores, so the kernel emulates the NVFP4 GEMM exactly
(RECIPE.md §9): every 16-element block of packed E2M1 codes is decoded *inside the
kernel* to ``code · s`` in BF16 (exact: E2M1 × E4M3 has at most 6 significant bits),
the BF16 tiles go through ``wgmma`` with FP32 accumulation, and the epilogue applies
``fl(gds_lhs · gds_rhs)`` and the output cast. No dequantized copy of either operand
is ever written to HBM: the kernel streams the packed 4-bit codes with TMA, plus one
BF16 scale factor per 16-block (``s · 2¹¹⁸``, prepared by XLA in the same pass that
puts the E4M3 scales in the kernel's layout: 5 bits per element in all).

Design (one CTA = 2 consumer warpgroups + 1 TMA producer warpgroup, persistent over
output tiles, ``plgpu.emit_pipeline_warp_specialized``):

* Operands are read in their *stored* layout. A tile whose 4-bit codes are packed
  along its minor (contiguous) axis — the activations ``X`` and ``dY`` of fprop and
  dgrad — is decoded straight into registers in the WGMMA layout and fed to
  ``wgmma`` as the register A operand. A tile packed along its major axis (the
  weight ``W`` in fprop and dgrad, both operands of wgrad) is decoded by the
  consumer warpgroup into swizzled shared memory and used as an SMEM operand,
  transposed where needed (``W`` serves fprop as ``(K, N)`` and dgrad as
  ``W.T``; ``x_res`` serves wgrad as ``x_res.T``) — the transposes are free views.
* Decoding is a few integer ops per element on 32-bit registers: two codes become
  one ``bf16x2`` word whose bits are ``(c & 7) << 6 | (c & 8) << 12`` per half, the
  BF16 pattern of ``e2m1(c) · 2⁻¹²⁶`` (code 1 lands on the subnormal 2⁻¹²⁷). One
  ``bf16x2`` multiply by the block's factor ``s · 2¹¹⁸`` makes each element
  ``e2m1 · s · 2⁻⁸`` exactly (a native BF16 multiply keeps subnormal inputs;
  ``TuningConfig.decode="normal"`` avoids subnormals at two more ops per pair); the
  epilogue multiplies by ``2¹⁶`` (exact) and then
  by ``fl(gds_lhs · gds_rhs)``, so the result equals ``fp4jax.matmul`` up to the
  order of the float32 sums.
* Every tile is decoded once per CTA and K-step; the two consumer warpgroups split
  the CTA tile along N (default) or M and alternate between decoding and issuing
  ``wgmma`` so the decode hides behind the other warpgroup's tensor-core work.
* Small M (decode-like shapes) pads M up to one tile (cheap: at most one tile of
  the 4.5-bit lhs) and may split K across CTAs (``k_splits``); the float32 partial
  sums are then added and scaled outside the kernel.

Layouts the three GEMMs of a linear layer need (see ``fp4jax/dot_general.py``):

========  ====================  ==============================  ===================
GEMM      lhs (stored as)       rhs (stored as)                 call
========  ====================  ==============================  ===================
fprop     X (M, K/2)            W 2D-tiled (K/2, N)             ``matmul(qx, qw)``
dgrad     dY (M, N/2)           W 2D-tiled (K/2, N), as ``W.T`` ``matmul(qg, qw.mT)``
wgrad     x_res (T/2, K)        dY (T/2, N)                     ``matmul(qx.mT, qg,
          as ``x_res.T``                                        lhs_from_mT=True)``
========  ====================  ==============================  ===================

``NVFP4Array.mT`` only transposes the arrays; the wrapper transposes them back to the
stored layout (XLA cancels the two transposes), so nothing is copied.

The register layouts and the decode itself live in `pallas_kernels.matmul_decode`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import statistics
import time
from typing import Any

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

import fp4jax
from fp4jax.formats import BLOCK, NVFP4Array
from fp4jax.matmul import check_operands, output_scale
from pallas_kernels import matmul_decode as dec

# --------------------------------------------------------------------------------------
# Tuning configuration.


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

  def __post_init__(self):
    if self.decode not in ("subnormal", "normal"):
      raise ValueError(f"decode must be 'subnormal' or 'normal', got {self.decode!r}")
    for name in ("tile_m", "tile_n", "tile_k"):
      v = getattr(self, name)
      if v <= 0 or v % 64:
        raise ValueError(f"{name}={v} must be a positive multiple of 64")
    if self.max_concurrent_steps < 2:
      raise ValueError(f"max_concurrent_steps={self.max_concurrent_steps} must be >= 2")
    if self.tile_m % self.epi_tile_m or self.epi_tile_m % 64:
      raise ValueError(
          f"epi_tile_m={self.epi_tile_m} must be a multiple of 64 dividing tile_m={self.tile_m}"
      )
    if self.tile_n % self.epi_tile_n or self.epi_tile_n % 16:
      raise ValueError(
          f"epi_tile_n={self.epi_tile_n} must be a multiple of 16 dividing tile_n={self.tile_n}"
      )
    if self.k_splits < 1 or self.grid_tile_width < 1:
      raise ValueError("k_splits and grid_tile_width must be >= 1")
    if self.num_sms is not None and self.num_sms < 1:
      raise ValueError(f"num_sms={self.num_sms} must be >= 1")

  @property
  def cta_tile_m(self) -> int:
    return self.tile_m * (2 if self.wg_dimension == MatmulDimension.M else 1)

  @property
  def cta_tile_n(self) -> int:
    return self.tile_n * (2 if self.wg_dimension == MatmulDimension.N else 1)


LARGE_CONFIG = TuningConfig()
"""Default for large GEMMs: CTA tile 128×256×64 (warpgroups split N), 4 stages."""

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


_MAX_PADDED_M = 64
"""An M up to this size that does not fill a CTA tile is zero-padded (skinny GEMMs)."""


def _fits(cfg: TuningConfig, m: int, n: int, k: int) -> bool:
  m_ok = m % cfg.cta_tile_m == 0 or m <= _MAX_PADDED_M
  return m_ok and n % cfg.cta_tile_n == 0 and k % (cfg.tile_k * cfg.k_splits) == 0


def default_config(m: int, n: int, k: int) -> TuningConfig:
  """The default `TuningConfig` for an ``(m, k) @ (k, n)`` GEMM.

  The largest CTA tile that divides the problem (an M below one tile is padded).
  """
  if m <= 64:
    for cfg in (SKINNY_CONFIG, dataclasses.replace(SKINNY_CONFIG, k_splits=1),
                dataclasses.replace(SKINNY_CONFIG, tile_k=64, k_splits=1)):
      if _fits(cfg, m, n, k):
        return cfg
  for cfg in (LARGE_CONFIG, *_FALLBACK_CONFIGS):
    if _fits(cfg, m, n, k):
      return cfg
  return LARGE_CONFIG  # matmul raises a ValueError naming the shapes


# --------------------------------------------------------------------------------------
# The kernel.


def _swizzled(minor_bytes: int, bits: int, what: str) -> tuple[Any, ...]:
  swizzle = plgpu.find_swizzle(minor_bytes * 8, what)
  return (
      plgpu.TilingTransform((8, swizzle * 8 // bits)),
      plgpu.SwizzleTransform(swizzle),
  )


@dataclasses.dataclass(frozen=True)
class _Problem:
  batch: int
  m: int  # rows of the output (padded to the tile)
  n: int
  k: int  # contraction (multiple of 16)
  lhs_cols: bool  # lhs stored (K/2, M) (packed along its major axis) instead of (M, K/2)
  rhs_cols: bool  # rhs stored (N/2, K) (the dgrad W layout) instead of (K/2, N)
  out_dtype: Any


def _kernel(
    lhs_gmem, lhs_scales_gmem, rhs_gmem, rhs_scales_gmem, out_scale_gmem,
    out_gmem, out_smem, a_dec_smem, b_dec_smem,
    *, p: _Problem, cfg: TuningConfig, interpret: bool,
):
  """One persistent CTA: loops over output tiles, pipelines packed K-tiles.

  Refs (batch-major; GMEM):
    lhs_gmem: (B, M, K/2) or, with ``p.lhs_cols``, (B, K/2, M) uint8 codes.
    lhs_scales_gmem: (B, K/16, M) bf16 block-scale factors (`dec.scale_factors`).
    rhs_gmem: (B, K/2, N) or, with ``p.rhs_cols``, (B, N/2, K) uint8 codes.
    rhs_scales_gmem: (B, K/16, N) or, with ``p.rhs_cols``, (B, N/16, K) bf16.
    out_scale_gmem: (1,) float32 ``fl(gds_lhs · gds_rhs)``.
    out_gmem: (B, M, N) out dtype, or (k_splits, B, M, N) float32 partial sums.
  """
  tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
  cta_tm, cta_tn = cfg.cta_tile_m, cfg.cta_tile_n
  m_iters, n_iters = p.m // cta_tm, p.n // cta_tn
  k_per_split = p.k // cfg.k_splits
  k_iters = k_per_split // tk
  split_out = cfg.k_splits > 1
  wg_on_m = cfg.wg_dimension == MatmulDimension.M

  # Swizzle widths follow the per-warpgroup slices, so the slices stay tile-aligned.
  lhs_tf = _swizzled(tm, 8, "lhs") if p.lhs_cols else _swizzled(tk // 2, 8, "lhs")
  rhs_tf = _swizzled(tk, 8, "rhs") if p.rhs_cols else _swizzled(tn, 8, "rhs")
  in_specs = [
      plgpu.BlockSpec(
          (tk // 2, cta_tm) if p.lhs_cols else (cta_tm, tk // 2),
          (lambda k: (k, 0)) if p.lhs_cols else (lambda k: (0, k)),
          transforms=lhs_tf,
      ),
      plgpu.BlockSpec((tk // BLOCK, cta_tm), lambda k: (k, 0)),
      plgpu.BlockSpec(
          (cta_tn // 2, tk) if p.rhs_cols else (tk // 2, cta_tn),
          (lambda k: (0, k)) if p.rhs_cols else (lambda k: (k, 0)),
          transforms=rhs_tf,
      ),
      plgpu.BlockSpec(
          (cta_tn // BLOCK, tk) if p.rhs_cols else (tk // BLOCK, cta_tn),
          (lambda k: (0, k)) if p.rhs_cols else (lambda k: (k, 0)),
      ),
  ]

  def get_pipeline(body, compute_context):
    return plgpu.emit_pipeline_warp_specialized(
        body,
        grid=(k_iters,),
        memory_registers=40,
        in_specs=in_specs,
        wg_axis="wg",
        num_compute_wgs=2,
        max_concurrent_steps=cfg.max_concurrent_steps,
        compute_context=compute_context,
    )

  ignore = lambda *_, **__: None  # noqa: E731

  @functools.partial(
      pl.run_scoped,
      allocs=get_pipeline(ignore, ignore).get_allocations(
          lhs_gmem.at[0], lhs_scales_gmem.at[0], rhs_gmem.at[0], rhs_scales_gmem.at[0]
      ),
      collective_axes="wg",
  )
  def _scope(allocs):
    wg = lax.axis_index("wg")

    @plgpu.nd_loop(
        (p.batch * cfg.k_splits * m_iters * n_iters,), collective_axes="sm"
    )
    def _tile_loop(info: plgpu.NDLoopInfo):
      (lin,) = info.index
      bk, mn = lin // (m_iters * n_iters), lin % (m_iters * n_iters)
      b, ks = bk // cfg.k_splits, bk % cfg.k_splits
      m_idx, n_idx = plgpu.planar_snake(
          mn, (m_iters, n_iters), cfg.grid_minor_dim, cfg.grid_tile_width
      )
      m_sl = pl.ds(m_idx * cta_tm, cta_tm)
      n_sl = pl.ds(n_idx * cta_tn, cta_tn)
      k_sl = pl.ds(ks * k_per_split, k_per_split)
      kp_sl = pl.ds(ks * (k_per_split // 2), k_per_split // 2)
      ks_sl = pl.ds(ks * (k_per_split // BLOCK), k_per_split // BLOCK)
      wg_m = pl.ds(wg * tm, tm) if wg_on_m else pl.ds(0, tm)
      wg_n = pl.ds(0, tn) if wg_on_m else pl.ds(wg * tn, tn)

      def compute_context(eval_pipeline):
        @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tm, tn), jnp.float32))
        def _acc_scope(acc_ref):
          eval_pipeline(acc_ref)
          acc = acc_ref[...] * dec.ACC_UNSCALE  # exact: undoes the 2**-8 per operand
          if split_out:
            out_tile = out_gmem.at[ks, b]
          else:
            acc = (acc * out_scale_gmem[0]).astype(p.out_dtype)
            out_tile = out_gmem.at[b]
          out_tile = out_tile.at[m_sl, n_sl].at[wg_m, wg_n]
          _store_epilogue(acc, out_smem.at[wg], out_tile, cfg)

      def mma_body(_, lhs_smem, lhs_s_smem, rhs_smem, rhs_s_smem, acc_ref):
        if p.lhs_cols:
          dec.decode_cols_tile(
              lhs_smem.at[:, wg_m], lhs_s_smem.at[:, wg_m], a_dec_smem.at[wg],
              interpret=interpret, decode=cfg.decode,
          )
          a_op = a_dec_smem.at[wg].T
        else:
          a = dec.decode_rows_tile(
              lhs_smem.at[wg_m], lhs_s_smem.at[:, wg_m], interpret=interpret,
              decode=cfg.decode,
          )
          if interpret:  # interpret-mode wgmma takes SMEM operands only
            a_dec_smem.at[wg][...] = a
            a_op = a_dec_smem.at[wg]
          else:
            a_op = a
        if p.rhs_cols:
          rows = pl.ds(0, tn // 2) if wg_on_m else pl.ds(wg * (tn // 2), tn // 2)
          srows = pl.ds(0, tn // BLOCK) if wg_on_m else pl.ds(wg * (tn // BLOCK), tn // BLOCK)
          dec.decode_cols_tile(
              rhs_smem.at[rows], rhs_s_smem.at[srows], b_dec_smem.at[wg],
              interpret=interpret, decode=cfg.decode,
          )
          b_op = b_dec_smem.at[wg].T
        else:
          dec.decode_cols_tile(
              rhs_smem.at[:, wg_n], rhs_s_smem.at[:, wg_n], b_dec_smem.at[wg],
              interpret=interpret, decode=cfg.decode,
          )
          b_op = b_dec_smem.at[wg]
        plgpu.commit_smem()
        plgpu.wgmma(acc_ref, a_op, b_op)
        plgpu.wgmma_wait(0)
        return acc_ref

      lhs_tile = lhs_gmem.at[b]
      lhs_tile = lhs_tile.at[kp_sl, m_sl] if p.lhs_cols else lhs_tile.at[m_sl, kp_sl]
      rhs_tile = rhs_gmem.at[b]
      rhs_tile = (
          rhs_tile.at[pl.ds(n_idx * (cta_tn // 2), cta_tn // 2), k_sl]
          if p.rhs_cols else rhs_tile.at[kp_sl, n_sl]
      )
      rhs_s_tile = rhs_scales_gmem.at[b]
      rhs_s_tile = (
          rhs_s_tile.at[pl.ds(n_idx * (cta_tn // BLOCK), cta_tn // BLOCK), k_sl]
          if p.rhs_cols else rhs_s_tile.at[ks_sl, n_sl]
      )
      get_pipeline(mma_body, compute_context)(
          lhs_tile,
          lhs_scales_gmem.at[b].at[ks_sl, m_sl],
          rhs_tile,
          rhs_s_tile,
          allocations=allocs,
      )

  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _store_epilogue(acc: jax.Array, out_smem, out_tile, cfg: TuningConfig) -> None:
  """Stores a (tile_m, tile_n) accumulator through SMEM with TMA, in slices."""
  em, en = cfg.epi_tile_m, cfg.epi_tile_n
  n_epi = cfg.tile_n // en
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous tile's stores
  for i in range(cfg.tile_m // em):
    for j in range(n_epi):
      slot = (i * n_epi + j) % out_smem.shape[0]
      # The TMA store that last read this slot must be done before we overwrite it
      # (the wait is per thread; the barrier publishes it to the warpgroup).
      plgpu.wait_smem_to_gmem(out_smem.shape[0] - 1, wait_read_only=True)
      if not cfg.auto_barriers:
        plgpu.commit_smem()
      out_smem.at[slot][...] = acc[i * em:(i + 1) * em, j * en:(j + 1) * en]
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(
          out_smem.at[slot], out_tile.at[pl.ds(i * em, em), pl.ds(j * en, en)]
      )


def _num_sms(cfg: TuningConfig) -> int:
  if cfg.num_sms is not None:
    return cfg.num_sms
  dev = jax.devices()[0]
  if dev.platform == "gpu":
    return dev.core_count
  return 132  # H200


def _call_kernel(lhs_d, lhs_s, rhs_d, rhs_s, out_scale, p: _Problem,
                 cfg: TuningConfig, interpret: bool) -> jax.Array:
  tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
  out_dtype = jnp.float32 if cfg.k_splits > 1 else p.out_dtype
  out_shape = (p.batch, p.m, p.n)
  if cfg.k_splits > 1:
    out_shape = (cfg.k_splits,) + out_shape
  bits = jnp.dtype(out_dtype).itemsize * 8
  num_out_slots = min(2, (tm * tn) // (cfg.epi_tile_m * cfg.epi_tile_n))
  bf16_tf = _swizzled(128, 16, "decoded")  # (8, 64) tiles, 128B swizzle
  if p.lhs_cols:
    a_dec = plgpu.SMEM((2, tk, tm), jnp.bfloat16, transforms=bf16_tf)
  elif interpret:
    a_dec = plgpu.SMEM((2, tm, tk), jnp.bfloat16, transforms=bf16_tf)
  else:
    a_dec = plgpu.SMEM((1, 8, 64), jnp.bfloat16, transforms=bf16_tf)  # unused
  b_dec_shape = (2, tn, tk) if p.rhs_cols else (2, tk, tn)
  scratch = dict(
      out_smem=plgpu.SMEM(
          (2, num_out_slots, cfg.epi_tile_m, cfg.epi_tile_n), out_dtype,
          transforms=_swizzled(cfg.epi_tile_n * bits // 8, bits, "out"),
      ),
      a_dec_smem=a_dec,
      b_dec_smem=plgpu.SMEM(b_dec_shape, jnp.bfloat16, transforms=bf16_tf),
  )
  num_tiles = p.batch * cfg.k_splits * (p.m // cfg.cta_tile_m) * (p.n // cfg.cta_tile_n)
  grid = min(_num_sms(cfg), num_tiles)
  kernel = plgpu.kernel(
      functools.partial(_kernel, p=p, cfg=cfg, interpret=interpret),
      out_type=jax.ShapeDtypeStruct(out_shape, out_dtype),
      grid=(grid,),
      grid_names=("sm",),
      num_threads=3,
      thread_name="wg",
      scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Lane,
          # Safe without Pallas' automatic barriers: the decoded tiles are only
          # read by wgmma (after commit_smem), the pipeline's release of each
          # stage is preceded by a warpgroup barrier (which also orders the next
          # step's decode after this step's wgmma_wait), and the epilogue places
          # its own barrier before reusing an output slot.
          unsafe_no_auto_barriers=not cfg.auto_barriers,
      ),
      interpret=plgpu.InterpretGPUParams() if interpret else None,
  )
  return kernel(lhs_d, lhs_s, rhs_d, rhs_s, out_scale)


# --------------------------------------------------------------------------------------
# Public API.


def _expand_tiles(scales: jax.Array, axis: int, length: int) -> jax.Array:
  """Repeats 2D-tile scales 16× along ``axis`` and trims to ``length``."""
  s = jnp.repeat(scales, BLOCK, axis=axis)
  return lax.slice_in_dim(s, 0, length, axis=axis)


@functools.partial(
    jax.jit,
    static_argnames=("preferred_element_type", "config", "interpret", "lhs_from_mT"),
)
def matmul(
    lhs: NVFP4Array,
    rhs: NVFP4Array,
    *,
    preferred_element_type: Any = jnp.float32,
    config: TuningConfig | None = None,
    interpret: bool = False,
    lhs_from_mT: bool = False,  # noqa: N803 - mirrors NVFP4Array.mT
) -> jax.Array:
  """NVFP4 GEMM on Hopper: ``lhs (..., M, K) @ rhs (..., K, N)`` with in-kernel decode.

  Same contract and result as `fp4jax.matmul` (up to the order of float32 sums):
  the operands are decoded to ``code · s`` (exact in BF16), multiplied with FP32
  accumulation, and the accumulator is scaled by ``fl(gds_lhs · gds_rhs)`` and cast.

  Supported operand layouts (others raise `ValueError`):

  * ``lhs`` blocked along K (1D, or 2D tiles). Its codes are read as stored in
    ``lhs.data`` — ``(M, K/2)`` — unless ``lhs_from_mT`` says ``lhs`` is ``q.mT`` of
    a tensor ``q`` stored ``(K/2, M)`` (the wgrad operand ``x_res.mT``); then the
    kernel reads ``q``'s layout directly. Either flag value gives the same result;
    the wrong one only costs XLA a 4-bit transpose.
  * ``rhs`` blocked along K (``(K/2, N)``, fprop/wgrad), or 2D-tiled and blocked
    along N, i.e. ``W.mT`` of a 2D-tiled weight stored ``(K/2, N)`` (dgrad).
  * M, N multiples of the CTA tile, K a multiple of ``tile_k · k_splits``; an M of
    at most 64 is zero-padded to one tile (decode-like shapes).

  Args:
    lhs: ``(..., M, K)`` `NVFP4Array`.
    rhs: ``(..., K, N)`` `NVFP4Array` with the same batch dims.
    preferred_element_type: output dtype (float32, bfloat16 or float16).
    config: a `TuningConfig`; default `default_config(M, N, K)`.
    interpret: run in Mosaic GPU interpret mode (CPU; for tests).
    lhs_from_mT: ``lhs`` is ``q.mT`` of a tensor stored with the codes packed along
      its rows (see above).

  Returns:
    ``(..., M, N)`` array of ``preferred_element_type``.

  Mathematically equivalent to::

    fp4jax.dequantize(lhs) @ fp4jax.dequantize(rhs)   # up to float32 rounding

  Example:
    >>> import jax, jax.numpy as jnp, fp4jax
    >>> from pallas_kernels import matmul as mm
    >>> x = jax.random.normal(jax.random.key(0), (256, 512))
    >>> w = jax.random.normal(jax.random.key(1), (512, 256))
    >>> qx, qw = fp4jax.quantize(x), fp4jax.quantize(w, axis=0, block_2d=True)
    >>> jax.eval_shape(mm.matmul, qx, qw).shape  # traces the kernel, runs nothing
    (256, 256)
    >>> qg = fp4jax.quantize(jax.random.normal(jax.random.key(2), (256, 256)))
    >>> jax.eval_shape(mm.matmul, qg, qw.mT).shape  # the dgrad layout: dY @ W.T
    (256, 512)
    >>> y = mm.matmul(qx, qw)  # doctest: +SKIP
  """
  check_operands(lhs, rhs)
  out_dtype = jnp.dtype(preferred_element_type)
  if out_dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(
        f"preferred_element_type must be float32, bfloat16 or float16, got {out_dtype}"
    )
  nd = lhs.ndim
  shapes = f"lhs {lhs.shape} @ rhs {rhs.shape}"
  if lhs.axis != nd - 1:
    raise ValueError(
        f"{shapes}: lhs is blocked along M (axis {lhs.axis}); the Pallas kernel needs "
        "the lhs blocked along K — use fp4jax.matmul"
    )
  batch_shape = lhs.shape[:-2]
  b = math.prod(batch_shape)
  m, k = lhs.shape[-2:]
  n = rhs.shape[-1]
  if min(m, n, k) == 0:
    raise ValueError(f"{shapes}: empty dimensions are not supported")
  rhs_cols = rhs.axis == nd - 1  # 2D-tiled, codes packed along N (W.mT in dgrad)
  k_pad = lhs.padded_length
  cfg = config if config is not None else default_config(m, n, k_pad)
  cta_tm, cta_tn = cfg.cta_tile_m, cfg.cta_tile_n
  if k_pad % (cfg.tile_k * cfg.k_splits):
    raise ValueError(
        f"{shapes}: K={k} must be a multiple of tile_k·k_splits = "
        f"{cfg.tile_k}·{cfg.k_splits} = {cfg.tile_k * cfg.k_splits}"
    )
  if n % cta_tn:
    raise ValueError(f"{shapes}: N={n} must be a multiple of the CTA tile width {cta_tn}")
  m_pad = m
  if m % cta_tm:
    if m <= _MAX_PADDED_M and not lhs_from_mT:
      m_pad = cta_tm
    else:
      raise ValueError(
          f"{shapes}: M={m} must be a multiple of the CTA tile height {cta_tm} "
          f"(or at most {_MAX_PADDED_M}, with lhs_from_mT=False, to be zero-padded)"
      )

  # lhs: codes (B, M, K/2) or (B, K/2, M); scales (B, K/16, M).
  lhs_s = lhs.scales
  if lhs.block_2d:
    lhs_s = _expand_tiles(lhs_s, nd - 2, m)
  lhs_s = jnp.swapaxes(lhs_s.reshape(b, m, k_pad // BLOCK), 1, 2)
  lhs_d = lhs.data.reshape(b, m, k_pad // 2)
  if lhs_from_mT:
    lhs_d = jnp.swapaxes(lhs_d, 1, 2)
  elif m_pad != m:
    lhs_d = jnp.pad(lhs_d, ((0, 0), (0, m_pad - m), (0, 0)))
    lhs_s = jnp.pad(lhs_s, ((0, 0), (0, 0), (0, m_pad - m)))

  # rhs: codes (B, K/2, N) with scales (B, K/16, N), or (B, N/2, K) with (B, N/16, K).
  if rhs_cols:
    if k % BLOCK:
      raise ValueError(f"{shapes}: K={k} must be a multiple of 16")
    rhs_d = jnp.swapaxes(rhs.data.reshape(b, k, n // 2), 1, 2)
    rhs_s = jnp.swapaxes(rhs.scales.reshape(b, -1, n // BLOCK), 1, 2)
    rhs_s = _expand_tiles(rhs_s, 2, k)
  else:
    rhs_d = rhs.data.reshape(b, k_pad // 2, n)
    rhs_s = rhs.scales
    if rhs.block_2d:
      rhs_s = _expand_tiles(rhs_s, nd - 1, n)
    rhs_s = rhs_s.reshape(b, k_pad // BLOCK, n)

  # Interpret mode decodes to exact e2m1 values (the CPU flushes subnormals).
  subnormal = cfg.decode == "subnormal" and not interpret
  lhs_s = dec.scale_factors(lhs_s, subnormal=subnormal)
  rhs_s = dec.scale_factors(rhs_s, subnormal=subnormal)
  out_scale = output_scale(lhs, rhs).astype(jnp.float32).reshape(1)
  p = _Problem(b, m_pad, n, k_pad, lhs_from_mT, rhs_cols, out_dtype)
  out = _call_kernel(lhs_d, lhs_s, rhs_d, rhs_s, out_scale, p, cfg, interpret)
  if cfg.k_splits > 1:
    out = (jnp.sum(out, axis=0) * out_scale[0]).astype(out_dtype)
  if m_pad != m:
    out = out[:, :m]
  return out.reshape(*batch_shape, m, n)


def reference(
    lhs: NVFP4Array, rhs: NVFP4Array, *, preferred_element_type: Any = jnp.float32
) -> jax.Array:
  """The pure-XLA NVFP4 GEMM the kernel must match: `fp4jax.matmul`."""
  return fp4jax.matmul(lhs, rhs, preferred_element_type=preferred_element_type)


# --------------------------------------------------------------------------------------
# Benchmark.


def _bench(f, *args_list, batches: int = 15, reps: int = 10) -> float:
  """Median seconds per call of ``f``, over batches of ``reps`` device-synchronized
  calls that cycle through ``args_list`` (distinct inputs defeat the 60 MB L2)."""
  for args in args_list:
    jax.block_until_ready(f(*args))  # compile and warm up
  times = []
  for _ in range(batches):
    t0 = time.perf_counter()
    out = [f(*args_list[i % len(args_list)]) for i in range(reps)]
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) / reps)
  return statistics.median(times)


def _random_bf16(shape, seed):
  return jax.random.normal(jax.random.key(seed), shape, jnp.bfloat16)


def _layout_args(layout: str, m: int, n: int, k: int, seed: int):
  """Quantized operands of an (m, k) @ (k, n) GEMM in the given training layout."""
  if layout == "fprop":
    return (fp4jax.quantize(_random_bf16((m, k), seed)),
            fp4jax.quantize(_random_bf16((k, n), seed + 1), axis=0, block_2d=True)), {}
  if layout == "dgrad":
    return (fp4jax.quantize(_random_bf16((m, k), seed)),
            fp4jax.quantize(_random_bf16((n, k), seed + 1), axis=0, block_2d=True).mT), {}
  if layout == "wgrad":
    return (fp4jax.quantize(_random_bf16((k, m), seed), axis=0).mT,
            fp4jax.quantize(_random_bf16((k, n), seed + 1), axis=0)), {"lhs_from_mT": True}
  raise ValueError(layout)


def _tflops(m, n, k, seconds):
  return 2 * m * n * k / seconds / 1e12


def main(argv: list[str] | None = None) -> None:
  """Benchmarks the kernel vs XLA dequantize+dot vs BF16 ``jnp.dot`` (TFLOP/s).

  ``--layouts`` adds the dgrad and wgrad layouts at 8192³; ``--sweep`` times a few
  tuning configs at 8192³ and for the skinny shape.
  """
  import sys  # noqa: PLC0415

  argv = sys.argv[1:] if argv is None else argv
  dev = jax.devices()[0]
  print(f"{dev.device_kind}, jax {jax.__version__}", flush=True)
  xla_ref = jax.jit(reference)
  bf16_dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.bfloat16))
  print(f"{'layout':>6} {'M,N,K':>16} {'pallas':>8} {'xla-deq':>8} {'bf16':>8} "
        f"{'vs bf16':>8} {'vs xla':>7} {'rel.err':>8}  (TFLOP/s)", flush=True)
  rows = [("fprop", 4096, 4096, 4096), ("fprop", 8192, 8192, 8192), ("fprop", 16, 8192, 8192)]
  if "--layouts" in argv:
    rows += [("dgrad", 8192, 8192, 8192), ("wgrad", 8192, 8192, 8192)]
  for layout, m, n, k in rows:
    copies = 1 if m * k >= 4096 * 4096 else 4  # rotate inputs that fit in L2
    qargs = [_layout_args(layout, m, n, k, seed=10 * i) for i in range(copies)]
    kw = qargs[0][1]
    ops = [a for a, _ in qargs]
    ours = _bench(functools.partial(matmul, **kw), *ops)
    xla = _bench(xla_ref, *ops)
    dense = [(_random_bf16((m, k), 10 * i), _random_bf16((k, n), 10 * i + 1))
             for i in range(copies)]
    bf16 = _bench(bf16_dot, *dense)
    got, want = matmul(*ops[0], **kw), xla_ref(*ops[0])
    err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    print(f"{layout:>6} {f'{m},{n},{k}':>16} {_tflops(m, n, k, ours):8.1f} "
          f"{_tflops(m, n, k, xla):8.1f} {_tflops(m, n, k, bf16):8.1f} "
          f"{bf16 / ours:8.2f} {xla / ours:7.2f} {err:8.1e}", flush=True)
  if "--sweep" in argv:
    _sweep()


def _sweep() -> None:
  """Times a few tuning configs (for choosing the defaults)."""
  big = [
      LARGE_CONFIG,
      dataclasses.replace(LARGE_CONFIG, max_concurrent_steps=6),
      dataclasses.replace(LARGE_CONFIG, wg_dimension=MatmulDimension.M),
      dataclasses.replace(LARGE_CONFIG, grid_tile_width=16),
      dataclasses.replace(LARGE_CONFIG, auto_barriers=True),
      dataclasses.replace(LARGE_CONFIG, tile_k=128, epi_tile_n=32, max_concurrent_steps=3),
  ]
  skinny = [
      SKINNY_CONFIG,
      dataclasses.replace(SKINNY_CONFIG, k_splits=1),
      dataclasses.replace(SKINNY_CONFIG, k_splits=4),
      dataclasses.replace(SKINNY_CONFIG, tile_k=64, max_concurrent_steps=8),
  ]
  for (m, n, k), cfgs in (((8192, 8192, 8192), big), ((16, 8192, 8192), skinny)):
    copies = 1 if m > 64 else 4
    ops = [_layout_args("fprop", m, n, k, seed=10 * i)[0] for i in range(copies)]
    for cfg in cfgs:
      try:
        t = _bench(functools.partial(matmul, config=cfg), *ops, batches=7)
        print(f"sweep {m},{n},{k}: {_tflops(m, n, k, t):7.1f} TFLOP/s  {cfg}", flush=True)
      except Exception as e:  # noqa: BLE001 - report and go on (e.g. SMEM overflow)
        print(f"sweep {m},{n},{k}: failed {type(e).__name__}: {str(e)[:200]}  {cfg}",
              flush=True)


if __name__ == "__main__":
  main()
