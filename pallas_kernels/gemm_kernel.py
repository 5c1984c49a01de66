"""The Hopper NVFP4 × NVFP4 GEMM kernel body (Pallas Mosaic GPU, sm_90).

One CTA = 2 consumer warpgroups + 1 TMA producer warpgroup, persistent over output
tiles (``plgpu.emit_pipeline_warp_specialized``):

* Operands are read in their *stored* layout. A tile whose 4-bit codes are packed
  along its minor (contiguous) axis is decoded straight into registers in the WGMMA
  layout and fed to ``wgmma`` as the register A operand; a tile packed along its major
  axis is decoded by the consumer warpgroup into swizzled shared memory and used as an
  SMEM operand, transposed where needed (the transposes are free views). The decode
  is `pallas_kernels.gemm_decode`.
* Every tile is decoded once per CTA and K-step; the two consumer warpgroups split
  the CTA tile along N (default) or M and alternate between decoding and issuing
  ``wgmma`` so the decode hides behind the other warpgroup's tensor-core work.
* The epilogue multiplies the float32 accumulator by ``2**16`` (exact: undoes the
  ``2**-8`` per decoded operand) and by ``fl(gds_lhs · gds_rhs)``, casts, and stores
  through SMEM with TMA. With ``k_splits > 1`` it stores float32 partial sums instead.

`call_kernel` takes the operands already in the kernel's layout (`pallas_kernels.gemm`
prepares them). The grid is `pallas_kernels.tma_pipeline.num_sms` CTAs (or
``TuningConfig.num_sms``), at most one per output tile.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from pallas_kernels import gemm_config, gemm_kernel
  >>> p = gemm_kernel.Problem(1, 128, 256, 512, False, False, jnp.float32)
  >>> args = [jax.ShapeDtypeStruct(s, d) for s, d in (((1, 128, 256), jnp.uint8),
  ...         ((1, 32, 128), jnp.bfloat16), ((1, 256, 256), jnp.uint8),
  ...         ((1, 32, 256), jnp.bfloat16), ((1,), jnp.float32))]
  >>> f = lambda *a: gemm_kernel.call_kernel(*a, p, gemm_config.LARGE_CONFIG, False)
  >>> jax.eval_shape(f, *args).shape  # traces the kernel, runs nothing
  (1, 128, 256)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from fp4jax.numerics.constants import BLOCK
from pallas_kernels import gemm_decode as dec
from pallas_kernels import tma_pipeline as tp
from pallas_kernels.gemm_config import MatmulDimension, TuningConfig


def swizzled(minor_bytes: int, bits: int, what: str) -> tuple[Any, ...]:
    """SMEM transforms of a tile with ``minor_bytes`` per row: (8, swizzle) tiles, swizzled."""
    swizzle = plgpu.find_swizzle(minor_bytes * 8, what)
    return (
        plgpu.TilingTransform((8, swizzle * 8 // bits)),
        plgpu.SwizzleTransform(swizzle),
    )


@dataclasses.dataclass(frozen=True)
class Problem:
    """Static shape and layout of one GEMM launch (batch-major operands)."""

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
    *, p: Problem, cfg: TuningConfig, interpret: bool,
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
    lhs_tf = swizzled(tm, 8, "lhs") if p.lhs_cols else swizzled(tk // 2, 8, "lhs")
    rhs_tf = swizzled(tk, 8, "rhs") if p.rhs_cols else swizzled(tn, 8, "rhs")
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

    def ignore(*_, **__):
        return None

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
                    store_epilogue(acc, out_smem.at[wg], out_tile, cfg)

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
                    srows = (pl.ds(0, tn // BLOCK) if wg_on_m
                             else pl.ds(wg * (tn // BLOCK), tn // BLOCK))
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


def store_epilogue(acc: jax.Array, out_smem, out_tile, cfg: TuningConfig,
                   store: Any = None) -> None:
    """Stores a (tile_m, tile_n) accumulator through SMEM with TMA, in slices;
    ``store(slice, smem_ref)`` writes one slice (default: ``smem_ref[...] = slice``)."""
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
            part = acc[i * em:(i + 1) * em, j * en:(j + 1) * en]
            if store is None:
                out_smem.at[slot][...] = part
            else:
                store(part, out_smem.at[slot])
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                out_smem.at[slot], out_tile.at[pl.ds(i * em, em), pl.ds(j * en, en)]
            )


def call_kernel(lhs_d, lhs_s, rhs_d, rhs_s, out_scale, p: Problem,
                cfg: TuningConfig, interpret: bool) -> jax.Array:
    """Launches the kernel on operands already in its layout.

    Args:
      lhs_d: (B, M, K/2) uint8 codes, or (B, K/2, M) with ``p.lhs_cols``.
      lhs_s: (B, K/16, M) bf16 block-scale factors (`gemm_decode.scale_factors`).
      rhs_d: (B, K/2, N) uint8 codes, or (B, N/2, K) with ``p.rhs_cols``.
      rhs_s: (B, K/16, N) bf16 factors, or (B, N/16, K) with ``p.rhs_cols``.
      out_scale: (1,) float32 ``fl(gds_lhs · gds_rhs)``.
      p: the problem (M padded to the CTA tile).
      cfg: the tuning.
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      (B, M, N) of ``p.out_dtype``, or with ``k_splits > 1`` (k_splits, B, M, N) float32
      partial sums before the output scale.
    """
    tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
    out_dtype = jnp.float32 if cfg.k_splits > 1 else p.out_dtype
    out_shape = (p.batch, p.m, p.n)
    if cfg.k_splits > 1:
        out_shape = (cfg.k_splits,) + out_shape
    bits = jnp.dtype(out_dtype).itemsize * 8
    num_out_slots = min(2, (tm * tn) // (cfg.epi_tile_m * cfg.epi_tile_n))
    bf16_tf = swizzled(128, 16, "decoded")  # (8, 64) tiles, 128B swizzle
    if p.lhs_cols:
        a_dec = plgpu.SMEM((2, tk, tm), jnp.bfloat16, transforms=bf16_tf)
    elif interpret:
        a_dec = plgpu.SMEM((2, tm, tk), jnp.bfloat16, transforms=bf16_tf)
    else:
        a_dec = plgpu.SMEM((1, 8, 64), jnp.bfloat16, transforms=bf16_tf)  # unused
    b_dec_shape = (2, tn, tk) if p.rhs_cols else (2, tk, tn)
    scratch = {
        "out_smem": plgpu.SMEM(
            (2, num_out_slots, cfg.epi_tile_m, cfg.epi_tile_n), out_dtype,
            transforms=swizzled(cfg.epi_tile_n * bits // 8, bits, "out"),
        ),
        "a_dec_smem": a_dec,
        "b_dec_smem": plgpu.SMEM(b_dec_shape, jnp.bfloat16, transforms=bf16_tf),
    }
    num_tiles = p.batch * cfg.k_splits * (p.m // cfg.cta_tile_m) * (p.n // cfg.cta_tile_n)
    grid = tp.grid_size(num_tiles, num_ctas=cfg.num_sms, ctas_per_sm=1, interpret=interpret)
    kernel = plgpu.kernel(
        functools.partial(_kernel, p=p, cfg=cfg, interpret=interpret),
        out_type=jax.ShapeDtypeStruct(out_shape, out_dtype),
        grid=(grid,),
        grid_names=("sm",),
        kernel_name="fp4jax_gemm",
        num_threads=3,
        thread_name="wg",
        scratch_types=scratch,
        compiler_params=tp.lane_params(
            # Safe without Pallas' automatic barriers: the decoded tiles are only
            # read by wgmma (after commit_smem), the pipeline's release of each
            # stage is preceded by a warpgroup barrier (which also orders the next
            # step's decode after this step's wgmma_wait), and the epilogue places
            # its own barrier before reusing an output slot.
            unsafe_no_auto_barriers=not cfg.auto_barriers,
        ),
        interpret=tp.interpret_params(interpret),
    )
    return kernel(lhs_d, lhs_s, rhs_d, rhs_s, out_scale)
