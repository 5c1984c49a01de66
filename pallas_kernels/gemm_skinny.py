"""The skinny NVFP4 GEMM (M ≤ 64) for Hopper: ``Cᵀ = Wᵀ · Xᵀ`` with the weight in registers.

On decode-like shapes (few tokens, a big weight) the GEMM streams the 4.5-bit weight
once; everything else is small. The kernel swaps the operands so the weight is
``wgmma``'s A side (64-row instruction groups) and the tokens its N side (8 to 64 wide,
M padded to a multiple of 8), so no tensor-core work is spent on padding rows:

* Each CTA (2 consumer warpgroups + 1 TMA producer, `plgpu.emit_pipeline_warp_specialized`)
  owns 256 weight columns (`gemm_skinny_decode.WG_ROWS` per warpgroup) and one of
  ``k_splits`` K ranges; the grid is ``N/256 · k_splits`` CTAs, persistent.
* A pipeline stage holds ``tile_k`` rows of the weight's packed codes (as stored,
  ``(K/2, N)``), its 16×16-tile E4M3 scale bytes (as stored, one per tile: no expanded
  per-block array), and the activations' ``(M, tile_k)`` BF16 tile.
* A consumer warpgroup decodes its 128 columns straight into the WGMMA register layout
  (`gemm_skinny_decode.decode_tile`: ``e2m1 · s · 2**-8``, exact) and issues ``wgmma``
  with the activations' tile from SMEM as B (a free transposed view).
* The activations (at most 64 × K) are decoded by XLA to ``e2m1 · s`` in BF16 (exact;
  a few hundred KB) before the launch.
* The epilogue multiplies the float32 accumulator by ``2**8`` (exact) and, unless K is
  split, by ``fl(gds_x · gds_w)``, casts, and writes the transposed tile straight from
  registers (`gemm_skinny_decode.store_tile`). Split-K partial sums are added and
  scaled by XLA.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from pallas_kernels import gemm_config, gemm_skinny
  >>> p = gemm_skinny.Problem(16, 512, 1024, jnp.bfloat16)
  >>> args = [jax.ShapeDtypeStruct(s, d) for s, d in (((512, 512), jnp.uint8),
  ...         ((64, 32), jnp.uint8), ((16, 1024), jnp.bfloat16), ((1,), jnp.float32))]
  >>> cfg = gemm_config.SkinnyConfig(k_splits=2)
  >>> f = lambda *a: gemm_skinny.call_kernel(*a, p, cfg, False)
  >>> jax.eval_shape(f, *args).shape  # (k_splits, M, N) float32 partial sums
  (2, 16, 512)
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

from fp4jax.numerics import layout
from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.nvfp4_array import NVFP4Array, e2m1_to_bf16, unpack_codes
from pallas_kernels import gemm_skinny_decode as sd
from pallas_kernels import tma_pipeline as tp
from pallas_kernels.gemm_config import SKINNY_CTA_N, SkinnyConfig

M_ALIGN = 8
"""M is zero-padded to a multiple of this (``wgmma``'s N granularity)."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """Static shape of one skinny launch."""

    m: int  # rows of X, padded to a multiple of M_ALIGN (<= 64)
    n: int  # weight columns (multiple of SKINNY_CTA_N)
    k: int  # contraction (multiple of tile_k · k_splits)
    out_dtype: Any


def _swizzle(minor_bytes: int, bits: int) -> tuple[Any, ...]:
    swizzle = plgpu.find_swizzle(minor_bytes * 8, "skinny")
    return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def _kernel(w_gmem, ws_gmem, x_gmem, out_scale_gmem, out_gmem, a_smem,
            *, p: Problem, cfg: SkinnyConfig, interpret: bool):
    """One persistent CTA: loops over (K split, 256-column) tiles, pipelines K.

    Refs (GMEM): ``w_gmem`` (K/2, N) uint8 codes; ``ws_gmem`` (K/16, N/16) uint8 E4M3
    bits of the 16×16-tile scales; ``x_gmem`` (M, K) bf16 decoded activations;
    ``out_scale_gmem`` (1,) float32; ``out_gmem`` (M, N) out dtype, or (k_splits, M, N)
    float32 partial sums.
    """
    tk, rows = cfg.tile_k, sd.WG_ROWS
    n_iters = p.n // SKINNY_CTA_N
    k_per_split = p.k // cfg.k_splits
    split_out = cfg.k_splits > 1
    in_specs = [
        plgpu.BlockSpec((tk // 2, SKINNY_CTA_N), lambda k: (k, 0),
                        transforms=_swizzle(rows, 8)),
        plgpu.BlockSpec((tk // BLOCK, SKINNY_CTA_N // BLOCK), lambda k: (k, 0)),
        plgpu.BlockSpec((p.m, tk), lambda k: (0, k), transforms=_swizzle(128, 16)),
    ]

    def get_pipeline(body, compute_context):
        return plgpu.emit_pipeline_warp_specialized(
            body, grid=(k_per_split // tk,), memory_registers=40, in_specs=in_specs,
            wg_axis="wg", num_compute_wgs=2, max_concurrent_steps=cfg.max_concurrent_steps,
            compute_context=compute_context,
        )

    def ignore(*_, **__):
        return None

    @functools.partial(
        pl.run_scoped,
        allocs=get_pipeline(ignore, ignore).get_allocations(w_gmem, ws_gmem, x_gmem),
        collective_axes="wg",
    )
    def _scope(allocs):
        wg = lax.axis_index("wg")

        @plgpu.nd_loop((cfg.k_splits * n_iters,), collective_axes="sm")
        def _tile_loop(info: plgpu.NDLoopInfo):
            (lin,) = info.index
            ks, n_idx = lin // n_iters, lin % n_iters
            n_sl = pl.ds(n_idx * SKINNY_CTA_N, SKINNY_CTA_N)
            ns_sl = pl.ds(n_idx * (SKINNY_CTA_N // BLOCK), SKINNY_CTA_N // BLOCK)
            k_sl = pl.ds(ks * k_per_split, k_per_split)
            kp_sl = pl.ds(ks * (k_per_split // 2), k_per_split // 2)
            ks_sl = pl.ds(ks * (k_per_split // BLOCK), k_per_split // BLOCK)

            def compute_context(eval_pipeline):
                @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((rows, p.m), jnp.float32))
                def _acc_scope(acc_ref):
                    eval_pipeline(acc_ref)
                    acc = acc_ref[...] * sd.ACC_UNSCALE  # exact: undoes the weight's 2**-8
                    if split_out:
                        out_tile = out_gmem.at[ks]
                    else:
                        acc = (acc * out_scale_gmem[0]).astype(p.out_dtype)
                        out_tile = out_gmem
                    out_tile = out_tile.at[:, n_sl].at[:, pl.ds(wg * rows, rows)]
                    sd.store_tile(acc, out_tile, interpret=interpret)

            def mma_body(_, w_smem, ws_smem, x_smem, acc_ref):
                a = sd.decode_tile(
                    w_smem.at[:, pl.ds(wg * rows, rows)],
                    ws_smem.at[:, pl.ds(wg * sd.WG_SCALE_COLS, sd.WG_SCALE_COLS)],
                    interpret=interpret,
                )
                if interpret:  # interpret-mode wgmma takes SMEM operands only
                    a_smem.at[wg][...] = a
                    a = a_smem.at[wg]
                plgpu.wgmma(acc_ref, a, x_smem.T)
                plgpu.wgmma_wait(0)
                return acc_ref

            get_pipeline(mma_body, compute_context)(
                w_gmem.at[kp_sl, n_sl], ws_gmem.at[ks_sl, ns_sl], x_gmem.at[:, k_sl],
                allocations=allocs,
            )


def call_kernel(w_codes, w_scales, x, out_scale, p: Problem, cfg: SkinnyConfig,
                interpret: bool) -> jax.Array:
    """Launches the kernel on operands already in its layout.

    Args:
      w_codes: (K/2, N) uint8 packed codes of the weight (packed along K).
      w_scales: (K/16, N/16) uint8 bits of its 16×16-tile E4M3 scales.
      x: (M, K) bf16 decoded activations ``e2m1 · s`` (M padded, see `Problem`).
      out_scale: (1,) float32 ``fl(gds_x · gds_w)``.
      p: the problem.
      cfg: the tuning.
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      (M, N) of ``p.out_dtype``, or with ``k_splits > 1`` (k_splits, M, N) float32
      partial sums before the output scale.
    """
    split = cfg.k_splits > 1
    out_dtype = jnp.float32 if split else p.out_dtype
    out_shape = ((cfg.k_splits,) if split else ()) + (p.m, p.n)
    a_shape = (2, sd.WG_ROWS, cfg.tile_k) if interpret else (1, 8, 64)  # unused on the GPU
    num_tiles = cfg.k_splits * (p.n // SKINNY_CTA_N)
    grid = min(cfg.num_sms if cfg.num_sms is not None else tp.num_sms(interpret), num_tiles)
    kernel = plgpu.kernel(
        functools.partial(_kernel, p=p, cfg=cfg, interpret=interpret),
        out_type=jax.ShapeDtypeStruct(out_shape, out_dtype),
        grid=(grid,),
        grid_names=("sm",),
        kernel_name="fp4jax_gemm_skinny",
        num_threads=3,
        thread_name="wg",
        scratch_types={"a_smem": plgpu.SMEM(a_shape, jnp.bfloat16,
                                            transforms=_swizzle(128, 16))},
        compiler_params=tp.lane_params(),
        interpret=tp.interpret_params(interpret),
    )
    return kernel(w_codes, w_scales, x, out_scale)


def decode_activations(lhs: NVFP4Array, m_pad: int) -> jax.Array:
    """``e2m1 · s`` of an (M, K) lhs blocked along K, in BF16 (exact), rows zero-padded."""
    vals = e2m1_to_bf16(unpack_codes(lhs.data, 1))
    s = lhs.per_element(lhs.scales.astype(jnp.bfloat16))
    return layout.pad_axis(vals * s, 0, m_pad)


def unsupported(lhs: NVFP4Array, rhs: NVFP4Array, cfg: SkinnyConfig) -> str | None:
    """Why the skinny kernel cannot take valid operands under ``cfg`` (None if it can)."""
    shapes = f"lhs {lhs.shape} @ rhs {rhs.shape}"
    m, n, k = lhs.shape[-2], rhs.shape[-1], lhs.padded_length
    if lhs.ndim != 2 or lhs.axis != 1:
        return f"{shapes}: the skinny kernel takes a 2D lhs blocked along K"
    if rhs.axis != 0 or not rhs.block_2d:
        return (f"{shapes}: the skinny kernel takes a 16×16-tiled rhs stored (K/2, N) "
                "(the fprop weight)")
    if m > 64:
        return f"{shapes}: the skinny kernel takes M <= 64, got M={m}"
    if n % SKINNY_CTA_N:
        return f"{shapes}: N={n} must be a multiple of {SKINNY_CTA_N} (skinny kernel)"
    if k % (cfg.tile_k * cfg.k_splits):
        return (f"{shapes}: K={k} must be a multiple of tile_k·k_splits = "
                f"{cfg.tile_k}·{cfg.k_splits} = {cfg.tile_k * cfg.k_splits} (skinny kernel)")
    return None


def matmul(lhs: NVFP4Array, rhs: NVFP4Array, out_scale: jax.Array, cfg: SkinnyConfig,
           out_dtype: Any, interpret: bool) -> jax.Array:
    """``lhs @ rhs`` for operands `unsupported` accepts (`pallas_kernels.gemm.matmul`)."""
    m, n = lhs.shape[0], rhs.shape[1]
    k = lhs.padded_length
    m_pad = -(-m // M_ALIGN) * M_ALIGN
    x = decode_activations(lhs, m_pad)
    w_scales = lax.bitcast_convert_type(rhs.scales, jnp.uint8)
    p = Problem(m_pad, n, k, jnp.dtype(out_dtype))
    out = call_kernel(rhs.data, w_scales, x, out_scale, p, cfg, interpret)
    if cfg.k_splits > 1:
        out = (jnp.sum(out, axis=0) * out_scale[0]).astype(out_dtype)
    return out[:m] if m_pad != m else out
