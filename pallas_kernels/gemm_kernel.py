"""The Hopper NVFP4 × NVFP4 GEMM kernel with the serial mainloop (Pallas Mosaic GPU, sm_90).

One CTA = 2 consumer warpgroups + 1 TMA producer warpgroup, persistent over output
tiles: the skeleton (TMA pipeline, tile loop, epilogue, launch) is
`pallas_kernels.gemm_skeleton`, shared with the pipelined mainloop (`gemm_pipelined`);
this module is the serial mainloop (``TuningConfig.mainloop = "serial"``):

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
prepares them; `Problem` is `gemm_skeleton.Problem`). The grid is
`pallas_kernels.tma_pipeline.num_sms` CTAs (or ``TuningConfig.num_sms``), at most one
per output tile.

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

import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from fp4jax.numerics.constants import BLOCK
from pallas_kernels import gemm_decode as dec
from pallas_kernels import gemm_skeleton as sk
from pallas_kernels.gemm_config import MatmulDimension, TuningConfig
from pallas_kernels.gemm_skeleton import Problem, swizzled


def _kernel(*gmem, out_smem, a_dec_smem, b_dec_smem, p: Problem, cfg: TuningConfig,
            interpret: bool):
    """The serial mainloop in `gemm_skeleton.persistent_gemm` (``gmem``: its refs)."""
    tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
    wg_on_m = cfg.wg_dimension == MatmulDimension.M

    def mainloop(wg):
        def tile(_):
            wg_m = pl.ds(wg * tm, tm) if wg_on_m else pl.ds(0, tm)
            wg_n = pl.ds(0, tn) if wg_on_m else pl.ds(wg * tn, tn)

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

            return sk.TileMainloop(mma_body, (wg_m, wg_n))
        return tile

    # Swizzle widths follow the per-warpgroup slices, so the slices stay tile-aligned.
    sk.persistent_gemm(
        gmem, out_smem, p, cfg,
        lhs_transforms=swizzled(tm, 8, "lhs") if p.lhs_cols else swizzled(tk // 2, 8, "lhs"),
        rhs_transforms=swizzled(tk, 8, "rhs") if p.rhs_cols else swizzled(tn, 8, "rhs"),
        rhs_scale_tiles=False, mainloop=mainloop)


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
    bf16_tf = swizzled(128, 16, "decoded")  # (8, 64) tiles, 128B swizzle
    if p.lhs_cols:
        a_dec = plgpu.SMEM((2, tk, tm), jnp.bfloat16, transforms=bf16_tf)
    elif interpret:
        a_dec = plgpu.SMEM((2, tm, tk), jnp.bfloat16, transforms=bf16_tf)
    else:
        a_dec = plgpu.SMEM((1, 8, 64), jnp.bfloat16, transforms=bf16_tf)  # unused
    b_dec_shape = (2, tn, tk) if p.rhs_cols else (2, tk, tn)
    scratch = {
        "a_dec_smem": a_dec,
        "b_dec_smem": plgpu.SMEM(b_dec_shape, jnp.bfloat16, transforms=bf16_tf),
    }
    # Safe without Pallas' automatic barriers (unless cfg.auto_barriers): the decoded
    # tiles are only read by wgmma (after commit_smem), the pipeline's release of each
    # stage is preceded by a warpgroup barrier (which also orders the next step's decode
    # after this step's wgmma_wait), and the epilogue places its own barrier before
    # reusing an output slot.
    return sk.call_gemm(functools.partial(_kernel, p=p, cfg=cfg, interpret=interpret),
                        (lhs_d, lhs_s, rhs_d, rhs_s, out_scale), p, cfg, interpret,
                        kernel_name="fp4jax_gemm", scratch=scratch)
