"""The skinny NVFP4 GEMM (M ≤ 64) for Hopper: ``Cᵀ = W' · Xᵀ`` with the weight in registers.

On decode-like shapes (few tokens, a big weight) the GEMM streams the 4.5-bit weight
once; everything else is small. The kernel swaps the operands so the weight is
``wgmma``'s A side (64-row instruction groups) and the tokens its N side (8 to 64 wide,
M padded to a multiple of 8), so no tensor-core work is spent on padding rows. It takes
the 16×16-tiled weight as stored, ``(K/2, N)``, in both of its GEMMs: fprop ``X @ W``
(``W' = Wᵀ``) and dgrad ``dY @ W.mT`` (``W' = W``); `gemm_skinny_layouts` has the
register layouts of each.

* Each CTA (2 consumer warpgroups + 1 TMA producer; the launch and K pipeline are
  `gemm_skeleton`'s) owns 256 output columns
  (`gemm_skinny_layouts.WG_ROWS` per warpgroup) and one of ``k_splits`` K ranges; the
  grid is ``N/256 · k_splits`` CTAs, persistent.
* A pipeline stage holds ``tile_k`` contraction elements of the weight's packed codes
  and of its 16×16-tile E4M3 scale bytes (as stored: no expanded per-block array), and
  the activations' ``(M, tile_k)`` BF16 tile.
* A consumer warpgroup decodes its 128 columns straight into the WGMMA register layout
  (`gemm_skinny_decode.decode_tile`: ``e2m1 · s · 2**-8``, exact) and issues ``wgmma``
  with the activations' tile from SMEM as B (a free transposed view).
* Tried on an H200 and dropped: overlapping a step's last ``wgmma`` with the next
  step's decode (no faster) and decoder warpgroups that decode the weight into shared
  memory for the consumers (slower); docs/BENCHMARKS.md, tenth session, and the code in
  commits 3b0b56c and c712f58.
* The activations (at most 64 × K) are decoded by XLA to ``e2m1 · s`` in BF16 (exact;
  a few hundred KB) before the launch (dgrad: with the kernel's column order).
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
from pallas_kernels import gemm_skeleton as sk
from pallas_kernels import gemm_skinny_decode as sd
from pallas_kernels import gemm_skinny_layouts as sl
from pallas_kernels.gemm_config import SKINNY_CTA_N, SkinnyConfig
from pallas_kernels.gemm_skeleton import swizzled
from pallas_kernels.gemm_skinny_layouts import WG_ROWS

M_ALIGN = 8
"""M is zero-padded to a multiple of this (``wgmma``'s N granularity)."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """Static shape of one skinny launch."""

    m: int  # rows of X, padded to a multiple of M_ALIGN (<= 64)
    n: int  # output columns (multiple of SKINNY_CTA_N)
    k: int  # contraction (multiple of tile_k · k_splits)
    out_dtype: Any
    variant: str = "fprop"  # the weight's layout (gemm_skinny_layouts.VARIANTS)


_SCALE_BLOCK = 16  # dgrad: scale columns per TMA box (its minor dim must be 16 bytes)


def _in_specs(p: Problem, tk: int) -> list:
    """Block specs of one pipeline step: weight codes, scale bytes, activations."""
    x = plgpu.BlockSpec((p.m, tk), lambda k: (0, k), transforms=swizzled(128, 16, "skinny"))
    if p.variant == "fprop":  # codes (K/2, N), scales (K/16, N/16)
        return [plgpu.BlockSpec((tk // 2, SKINNY_CTA_N), lambda k: (k, 0),
                                transforms=swizzled(WG_ROWS, 8, "skinny")),
                plgpu.BlockSpec((tk // BLOCK, SKINNY_CTA_N // BLOCK), lambda k: (k, 0)), x]
    # dgrad: codes (N/2, K), scales (N/16, K/16); a box of 16 scale columns covers
    # 16 / (tk/16) steps.
    per_box = _SCALE_BLOCK * BLOCK // tk
    return [plgpu.BlockSpec((SKINNY_CTA_N // 2, tk), lambda k: (0, k),
                            transforms=swizzled(tk, 8, "skinny")),
            plgpu.BlockSpec((SKINNY_CTA_N // BLOCK, _SCALE_BLOCK), lambda k: (0, k // per_box)),
            x]


def _kernel(w_gmem, ws_gmem, x_gmem, out_scale_gmem, out_gmem, a_smem,
            *, p: Problem, cfg: SkinnyConfig, interpret: bool):
    """One persistent CTA: loops over (K split, 256-column) tiles, pipelines K.

    Refs (GMEM): ``w_gmem`` uint8 codes, (K/2, N) (fprop) or (N/2, K) (dgrad);
    ``ws_gmem`` the uint8 E4M3 bits of the 16×16-tile scales, (K/16, N/16) or (N/16,
    K/16); ``x_gmem`` (M, K) bf16 decoded activations (dgrad: columns permuted within
    16-blocks, `gemm_skinny_decode.column_permutation`); ``out_scale_gmem`` (1,)
    float32; ``out_gmem`` (M, N) out dtype, or (k_splits, M, N) float32 partial sums.
    """
    variant = sl.VARIANTS[p.variant]
    tk, rows, fprop = cfg.tile_k, WG_ROWS, p.variant == "fprop"
    tks = tk // cfg.k_substeps
    n_iters = p.n // SKINNY_CTA_N
    kps = p.k // cfg.k_splits  # contraction per split
    in_specs = _in_specs(p, tk)

    def tile_index(info: plgpu.NDLoopInfo):
        (lin,) = info.index
        return lin // n_iters, lin % n_iters  # K split, 256-column tile

    def tile_operands(info: plgpu.NDLoopInfo):
        ks, n_idx = tile_index(info)
        n_sl = pl.ds(n_idx * SKINNY_CTA_N, SKINNY_CTA_N)
        np_sl = pl.ds(n_idx * (SKINNY_CTA_N // 2), SKINNY_CTA_N // 2)
        ns_sl = pl.ds(n_idx * (SKINNY_CTA_N // BLOCK), SKINNY_CTA_N // BLOCK)
        k_sl = pl.ds(ks * kps, kps)
        kp_sl = pl.ds(ks * (kps // 2), kps // 2)
        ks_sl = pl.ds(ks * (kps // BLOCK), kps // BLOCK)
        if fprop:
            return w_gmem.at[kp_sl, n_sl], ws_gmem.at[ks_sl, ns_sl], x_gmem.at[:, k_sl]
        return w_gmem.at[np_sl, k_sl], ws_gmem.at[ns_sl, ks_sl], x_gmem.at[:, k_sl]

    def part_tiles(c, h, idx, w_smem, ws_smem):
        """The code and scale tiles of consumer ``c``'s 128 weight rows, part ``h``."""
        c_rows, c_scales = pl.ds(c * rows, rows), pl.ds(c * (rows // BLOCK), rows // BLOCK)
        if fprop:
            return (w_smem.at[pl.ds(h * tks // 2, tks // 2), c_rows],
                    ws_smem.at[pl.ds(h * tks // BLOCK, tks // BLOCK), c_scales])
        col = (idx[0] * (tk // BLOCK)) % _SCALE_BLOCK + h * (tks // BLOCK)
        return (w_smem.at[pl.ds(c * (rows // 2), rows // 2), pl.ds(h * tks, tks)],
                ws_smem.at[c_scales, pl.ds(col, tks // BLOCK)])

    def consumer(wg):
        wg_rows = pl.ds(wg * rows, rows)

        def mma_body(idx, w_smem, ws_smem, x_smem, acc_ref):
            # k_substeps parts: the tensor cores multiply one while the next decodes.
            for h in range(cfg.k_substeps):
                codes, scales = part_tiles(wg, h, idx, w_smem, ws_smem)
                a = sd.decode_tile(variant, codes, scales, interpret=interpret)
                if interpret:  # interpret-mode wgmma takes SMEM operands only
                    a_smem.at[wg][...] = a
                    a = a_smem.at[wg]
                plgpu.wgmma(acc_ref, a, x_smem.at[:, pl.ds(h * tks, tks)].T)
            plgpu.wgmma_wait(0)  # the stage's x tile is wgmma's B: read before release
            return acc_ref

        def per_tile(info: plgpu.NDLoopInfo, run_k: sk.RunK):
            ks, n_idx = tile_index(info)

            @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((rows, p.m), jnp.float32))
            def _acc_scope(acc_ref):
                run_k(mma_body, acc_ref)
                acc = acc_ref[...] * sd.ACC_UNSCALE  # exact: undoes the weight's 2**-8
                if cfg.k_splits > 1:
                    out_tile = out_gmem.at[ks]
                else:
                    acc = (acc * out_scale_gmem[0]).astype(p.out_dtype)
                    out_tile = out_gmem
                out_tile = out_tile.at[:, pl.ds(n_idx * SKINNY_CTA_N, SKINNY_CTA_N)]
                sd.store_tile(variant, acc, out_tile.at[:, wg_rows], interpret=interpret)
        return per_tile

    sk.role_pipeline(in_specs, (w_gmem.dtype, ws_gmem.dtype, x_gmem.dtype),
                     stages=cfg.max_concurrent_steps, k_steps=kps // tk,
                     num_tiles=cfg.k_splits * n_iters, tile_operands=tile_operands,
                     consumer=consumer)


def call_kernel(w_codes, w_scales, x, out_scale, p: Problem, cfg: SkinnyConfig,
                interpret: bool) -> jax.Array:
    """Launches the kernel on operands already in its layout.

    Args:
      w_codes: uint8 packed codes of the weight as stored: (K/2, N) (fprop) or (N/2, K)
        (dgrad).
      w_scales: uint8 bits of its 16×16-tile E4M3 scales: (K/16, N/16) or (N/16, K/16).
      x: (M, K) bf16 decoded activations ``e2m1 · s`` (M padded, see `Problem`; dgrad:
        columns permuted, see `decode_activations`).
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
    a_shape = (2, WG_ROWS, cfg.tile_k // cfg.k_substeps) if interpret else (1, 8, 64)
    return sk.launch(
        functools.partial(_kernel, p=p, cfg=cfg, interpret=interpret),
        (w_codes, w_scales, x, out_scale),
        out_type=jax.ShapeDtypeStruct(out_shape, out_dtype),
        num_tiles=cfg.k_splits * (p.n // SKINNY_CTA_N), num_ctas=cfg.num_sms,
        kernel_name="fp4jax_gemm_skinny",
        scratch={"a_smem": plgpu.SMEM(a_shape, jnp.bfloat16,
                                      transforms=swizzled(128, 16, "skinny"))},
        interpret=interpret)


def decode_activations(lhs: NVFP4Array, m_pad: int, variant: str = "fprop") -> jax.Array:
    """``e2m1 · s`` of an (M, K) lhs blocked along K, in BF16 (exact), rows zero-padded;
    for dgrad with the columns of every 16-block in the kernel's order
    (`gemm_skinny_decode.column_permutation`: a transpose of (4, 2, 2) sub-blocks)."""
    vals = e2m1_to_bf16(unpack_codes(lhs.data, 1))
    x = layout.pad_axis(vals * lhs.per_element(lhs.scales.astype(jnp.bfloat16)), 0, m_pad)
    if variant == "dgrad":  # column 8q + 2c + v of a block holds column 4c + 2q + v
        x = x.reshape(m_pad, -1, 4, 2, 2).transpose(0, 1, 3, 2, 4).reshape(m_pad, -1)
    return x


def variant_of(rhs: NVFP4Array) -> str | None:
    """The skinny kernel's name for a 2D rhs's layout: ``"fprop"`` for a 16×16-tiled
    weight stored (K/2, N), ``"dgrad"`` for the ``.mT`` of one (N/2, K); else None."""
    if rhs.ndim != 2 or not rhs.block_2d:
        return None
    return "fprop" if rhs.axis == 0 else "dgrad"


def unsupported(lhs: NVFP4Array, rhs: NVFP4Array, cfg: SkinnyConfig) -> str | None:
    """Why the skinny kernel cannot take valid operands under ``cfg`` (None if it can)."""
    shapes = f"lhs {lhs.shape} @ rhs {rhs.shape}"
    m, n, k = lhs.shape[-2], rhs.shape[-1], lhs.padded_length
    if lhs.ndim != 2 or lhs.axis != 1:
        return f"{shapes}: the skinny kernel takes a 2D lhs blocked along K"
    if (variant := variant_of(rhs)) is None:
        return (f"{shapes}: the skinny kernel takes a 16×16-tiled 2D weight (W stored "
                "(K/2, N), or W.mT)")
    if m > 64:
        return f"{shapes}: the skinny kernel takes M <= 64, got M={m}"
    if n % SKINNY_CTA_N:
        return f"{shapes}: N={n} must be a multiple of {SKINNY_CTA_N} (skinny kernel)"
    if k % (cfg.tile_k * cfg.k_splits):
        return (f"{shapes}: K={k} must be a multiple of tile_k·k_splits = "
                f"{cfg.tile_k}·{cfg.k_splits} = {cfg.tile_k * cfg.k_splits} (skinny kernel)")
    if variant == "dgrad" and (k // cfg.k_splits) % (_SCALE_BLOCK * BLOCK):
        return (f"{shapes}: K/k_splits = {k // cfg.k_splits} must be a multiple of "
                f"{_SCALE_BLOCK * BLOCK} (skinny kernel, W.mT)")
    if variant == "dgrad" and cfg.tile_k > _SCALE_BLOCK * BLOCK:
        return (f"{shapes}: tile_k={cfg.tile_k} must be at most {_SCALE_BLOCK * BLOCK} "
                "(skinny kernel, W.mT: one scale box per step)")
    if variant == "dgrad" and (cfg.tile_k // cfg.k_substeps) % 128:
        return (f"{shapes}: tile_k/k_substeps = {cfg.tile_k // cfg.k_substeps} must be a "
                "multiple of 128 (skinny kernel, W.mT: whole 128-byte rows)")
    return None


def operands(lhs: NVFP4Array, rhs: NVFP4Array, out_dtype: Any
             ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], Problem]:
    """The kernel's operands ``(codes, scale bits, activations)`` and `Problem` for
    operands `unsupported` accepts: the weight's arrays as stored (the ``.mT`` of dgrad
    undone), the activations decoded (`decode_activations`)."""
    m, n, k = lhs.shape[0], rhs.shape[1], lhs.padded_length
    m_pad = -(-m // M_ALIGN) * M_ALIGN
    variant = variant_of(rhs)
    codes, scales = (rhs.data, rhs.scales) if variant == "fprop" else (rhs.data.T, rhs.scales.T)
    x = decode_activations(lhs, m_pad, variant)
    p = Problem(m_pad, n, k, jnp.dtype(out_dtype), variant)
    return (codes, lax.bitcast_convert_type(scales, jnp.uint8), x), p


def matmul(lhs: NVFP4Array, rhs: NVFP4Array, out_scale: jax.Array, cfg: SkinnyConfig,
           out_dtype: Any, interpret: bool) -> jax.Array:
    """``lhs @ rhs`` for operands `unsupported` accepts (`pallas_kernels.gemm.matmul`)."""
    args, p = operands(lhs, rhs, out_dtype)
    out = call_kernel(*args, out_scale, p, cfg, interpret)
    if cfg.k_splits > 1:
        out = (jnp.sum(out, axis=0) * out_scale[0]).astype(out_dtype)
    return out[:lhs.shape[0]] if p.m != lhs.shape[0] else out
