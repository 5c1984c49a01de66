"""The pipelined Hopper NVFP4 GEMM mainloop (``TuningConfig.mainloop = "pipelined"``).

One CTA = 2 consumer warpgroups + 1 TMA producer warpgroup, persistent over 128×256
output tiles (`plgpu.emit_pipeline_warp_specialized`, packed codes and block factors in
4 stages). Per 64-wide K step each consumer warpgroup (64 output rows × 256 columns):

1. decodes its 64 lhs rows straight into ``wgmma``'s register A operand (one 64-bit
   shared-memory load per row and thread for an lhs stored ``(M, K/2)``, 16-bit loads of
   two adjacent rows for one stored ``(K/2, M)``; `gemm_pipelined_layouts`);
2. decodes its half (64 × 128) of the step's rhs tile into one of 3 decoded buffers in
   shared memory (64-bit loads, 128-bit stores), which both warpgroups multiply with;
3. arrives on the buffer's barrier and waits for the other warpgroup's half, issues the
   step's ``wgmma`` (m64n256k16 × 4) and waits only for the *previous* step's: the decode
   of step k+1 runs while the tensor cores multiply step k.

Three decoded buffers need no "consumed" barrier: a warpgroup that writes buffer k % 3
in step k has passed the barrier of step k-1, so the other warpgroup had finished step
k-2, including its wait for the wgmma of step k-3, the last reader of that buffer.

Why this shape (arithmetic per K step of a 128×256×64 CTA tile, H200, one SM):

* ``wgmma``: 2·128·256·64 = 4.19 MFLOP = 1024 cycles at the dense BF16 peak (4096
  FLOP/cycle/SM); BF16 ``jnp.dot`` runs at ~70% of it (692 TFLOP/s at 8192³), ~1460
  cycles, so 0.95× BF16 leaves ~1540 cycles per step.
* Decode: (128 + 256)·64 = 24576 elements = 12288 pairs, each once. The serial mainloop
  (`gemm_kernel`, the default) decodes the lhs tile in both warpgroups: 16384 pairs,
  with a byte load per lhs pair, a 32-bit store per rhs pair and ~7 instructions per
  pair, and each warpgroup then waits for its own wgmma (decode and MMA alternate).
  Here: 3 integer instructions per pair (`wgmma_regs.decode_pair`) plus 3 per 32-bit
  word for the nibble planes and one bf16x2 multiply; loads 1/8 to 1/2 per pair, 1/4
  store per rhs pair. ≈ 3.1 ALU-pipe instructions per pair: 38K lane-ops = 1190 warp
  instructions = ~600 cycles of the ALU pipe (2 warp instructions per cycle per SM),
  ~40% of the step; IMAD + HMUL2 ~380 cycles of the FMA pipe; ~5.5 instructions per
  pair in all ≈ 2100 warp instructions = ~530 issue cycles (4 schedulers), ~35%.
* Shared memory per step: TMA writes 15 KB, decode reads ~17 KB, decoded rhs writes 32 KB,
  wgmma reads the rhs (64×256 BF16) once per warpgroup: 64 KB; ≈ 128 KB = 83 B/cycle at
  1540 cycles, 65% of the 128 B/cycle (cuBLAS's BF16 128×256 mainloop moves about as
  much). A separate decode warpgroup writing both operands to SMEM (option (a)) would
  add the lhs's 16 KB store and 16 KB of wgmma reads and leave the two MMA warpgroups'
  registers to the setmaxnreg split of four warpgroups; a 256×128 tile decodes the same
  pairs but needs 128 accumulator + 64 A registers per thread for the overlap (64×256
  per warpgroup: 128 + 2·16).
* Registers per consumer thread: 128 (accumulator) + 2×16 (A of steps k and k+1, the
  wgmma of step k still reading its A) + decode temporaries, under the 232 that
  ``memory_registers=40`` leaves.
* SMEM: 4 stages × 15 KB + 3 decoded buffers × 32 KB + the epilogue's 64 KB (float32) =
  220 KB of the 227 KB.

So the decode fits under the tensor-core time with margin on every pipe, provided it
overlaps the MMA, which step 3 arranges. What is *not* verified on this host: the
speed, ptxas's register allocation (a spill or a serialized wgmma would show in the
GPU timing) and the bank-conflict-free access patterns (checked by the tests on the
layouts' definitions only).

Example:
  >>> import jax, jax.numpy as jnp
  >>> from pallas_kernels import gemm_config, gemm_kernel, gemm_pipelined
  >>> p = gemm_kernel.Problem(1, 128, 256, 512, False, False, jnp.float32)
  >>> args = [jax.ShapeDtypeStruct(s, d) for s, d in (((1, 128, 256), jnp.uint8),
  ...         ((1, 32, 128), jnp.bfloat16), ((1, 256, 256), jnp.uint8),
  ...         ((1, 32, 256), jnp.bfloat16), ((1,), jnp.float32))]
  >>> cfg = gemm_config.PIPELINED_CONFIG
  >>> f = lambda *a: gemm_pipelined.call_kernel(*a, p, cfg, False)
  >>> jax.eval_shape(f, *args).shape  # traces the kernel, runs nothing
  (1, 128, 256)
"""

from __future__ import annotations

import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from fp4jax.numerics.constants import BLOCK
from pallas_kernels import gemm_decode as dec
from pallas_kernels import gemm_pipelined_decode as pd
from pallas_kernels import gemm_pipelined_layouts as pl_
from pallas_kernels import tma_pipeline as tp
from pallas_kernels.gemm_config import TuningConfig
from pallas_kernels.gemm_kernel import Problem, store_epilogue, swizzled
from pallas_kernels.gemm_pipelined_layouts import HALF_N, WG_M

B_SLOTS = 3
"""Decoded rhs buffers (see the module docstring for why three need no release barrier)."""


def _kernel(
    lhs_gmem, lhs_scales_gmem, rhs_gmem, rhs_scales_gmem, out_scale_gmem,
    out_gmem, out_smem, a_smem, b_dec_smem, b_full,
    *, p: Problem, cfg: TuningConfig, interpret: bool,
):
    """One persistent CTA: loops over output tiles, pipelines packed K-tiles.

    Refs (batch-major; GMEM): as `pallas_kernels.gemm_kernel` except the rhs factors of
    an rhs stored ``(N/2, K)``: one per 16×16 tile, ``(B, K/16, N/16)``.
    """
    a_op, b_op = pl_.operands(p.lhs_cols, p.rhs_cols)
    tk, cta_tm, cta_tn = cfg.tile_k, cfg.cta_tile_m, cfg.cta_tile_n
    m_iters, n_iters = p.m // cta_tm, p.n // cta_tn
    k_per_split = p.k // cfg.k_splits
    k_iters = k_per_split // tk
    split_out = cfg.k_splits > 1

    # Swizzles follow the per-warpgroup slices, so the slices stay whole tiles.
    lhs_tf = swizzled(WG_M, 8, "lhs") if p.lhs_cols else swizzled(tk // 2, 8, "lhs")
    rhs_tf = swizzled(tk, 8, "rhs") if p.rhs_cols else swizzled(HALF_N, 8, "rhs")
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
        plgpu.BlockSpec((tk // BLOCK, cta_tn // BLOCK if p.rhs_cols else cta_tn),
                        lambda k: (k, 0)),
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
        wg_rows = pl.ds(wg * WG_M, WG_M)
        wg_half = pl.ds(wg * HALF_N, HALF_N)

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

            def compute_context(eval_pipeline):
                @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((WG_M, cta_tn), jnp.float32))
                def _acc_scope(acc_ref):
                    eval_pipeline(acc_ref)
                    acc = acc_ref[...] * dec.ACC_UNSCALE  # waits for the last wgmma
                    if split_out:
                        out_tile = out_gmem.at[ks, b]
                    else:
                        acc = (acc * out_scale_gmem[0]).astype(p.out_dtype)
                        out_tile = out_gmem.at[b]
                    out_tile = out_tile.at[m_sl, n_sl].at[wg_rows, :]
                    store = None
                    if p.lhs_cols:  # A rows permuted: the slices are renamed back
                        def store(part, ref):
                            pd.store_output(a_op, part, ref, interpret=interpret)
                    store_epilogue(acc, out_smem.at[wg], out_tile, cfg, store)

            def mma_body(idx, lhs_smem, lhs_s_smem, rhs_smem, rhs_s_smem, acc_ref):
                slot = lax.rem(info.local_index * k_iters + idx[0], B_SLOTS)
                codes = lhs_smem.at[:, wg_rows] if p.lhs_cols else lhs_smem.at[wg_rows]
                a = pd.decode_a(a_op, codes, lhs_s_smem.at[:, wg_rows], interpret=interpret)
                b_dec = b_dec_smem.at[slot]
                if p.rhs_cols:
                    pd.decode_b(b_op, rhs_smem.at[pl.ds(wg * (HALF_N // 2), HALF_N // 2)],
                                rhs_s_smem.at[:, pl.ds(wg * (HALF_N // BLOCK), HALF_N // BLOCK)],
                                b_dec.at[wg_half], interpret=interpret)
                    b_ref = b_dec.T
                else:
                    pd.decode_b(b_op, rhs_smem.at[:, wg_half], rhs_s_smem.at[:, wg_half],
                                b_dec.at[:, wg_half], interpret=interpret)
                    b_ref = b_dec
                plgpu.commit_smem()  # this thread's stores, visible to the async proxy
                plgpu.barrier_arrive(b_full.at[slot])
                plgpu.barrier_wait(b_full.at[slot])  # the other warpgroup's half
                if interpret:  # interpret-mode wgmma takes SMEM operands only
                    a_smem.at[wg][...] = a
                    a = a_smem.at[wg]
                plgpu.wgmma(acc_ref, a, b_ref)
                plgpu.wgmma_wait(1)  # the previous step's wgmma, not this one's
                return acc_ref

            lhs_tile = lhs_gmem.at[b]
            lhs_tile = lhs_tile.at[kp_sl, m_sl] if p.lhs_cols else lhs_tile.at[m_sl, kp_sl]
            rhs_tile = rhs_gmem.at[b]
            rhs_tile = (
                rhs_tile.at[pl.ds(n_idx * (cta_tn // 2), cta_tn // 2), k_sl]
                if p.rhs_cols else rhs_tile.at[kp_sl, n_sl]
            )
            rhs_s_tile = rhs_scales_gmem.at[b].at[
                ks_sl, pl.ds(n_idx * (cta_tn // BLOCK), cta_tn // BLOCK) if p.rhs_cols else n_sl]
            get_pipeline(mma_body, compute_context)(
                lhs_tile,
                lhs_scales_gmem.at[b].at[ks_sl, m_sl],
                rhs_tile,
                rhs_s_tile,
                allocations=allocs,
            )

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def call_kernel(lhs_d, lhs_s, rhs_d, rhs_s, out_scale, p: Problem,
                cfg: TuningConfig, interpret: bool) -> jax.Array:
    """Launches the kernel on operands already in its layout.

    Args:
      lhs_d: (B, M, K/2) uint8 codes, or (B, K/2, M) with ``p.lhs_cols``.
      lhs_s: (B, K/16, M) bf16 block factors (`gemm_decode.scale_factors`).
      rhs_d: (B, K/2, N) uint8 codes, or (B, N/2, K) with ``p.rhs_cols``.
      rhs_s: (B, K/16, N) bf16 factors, or (B, K/16, N/16) (16×16 tiles) with
        ``p.rhs_cols``.
      out_scale: (1,) float32 ``fl(gds_lhs · gds_rhs)``.
      p: the problem (M padded to the CTA tile).
      cfg: the tuning (``cfg.mainloop == "pipelined"``).
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      (B, M, N) of ``p.out_dtype``, or with ``k_splits > 1`` (k_splits, B, M, N) float32
      partial sums before the output scale.
    """
    if cfg.mainloop != "pipelined":
        raise ValueError(f"the pipelined kernel needs mainloop='pipelined', got {cfg.mainloop!r}")
    tk = cfg.tile_k
    out_dtype = jnp.float32 if cfg.k_splits > 1 else p.out_dtype
    out_shape = (p.batch, p.m, p.n)
    if cfg.k_splits > 1:
        out_shape = (cfg.k_splits,) + out_shape
    bits = jnp.dtype(out_dtype).itemsize * 8
    num_out_slots = min(2, (cfg.tile_m * cfg.tile_n) // (cfg.epi_tile_m * cfg.epi_tile_n))
    bf16_tf = swizzled(128, 16, "decoded")  # (8, 64) tiles, 128B swizzle
    b_shape = (cfg.cta_tile_n, tk) if p.rhs_cols else (tk, cfg.cta_tile_n)
    a_shape = (2, WG_M, tk) if interpret else (1, 8, 64)  # unused on the GPU
    scratch = {
        "out_smem": plgpu.SMEM(
            (2, num_out_slots, cfg.epi_tile_m, cfg.epi_tile_n), out_dtype,
            transforms=swizzled(cfg.epi_tile_n * bits // 8, bits, "out"),
        ),
        "a_smem": plgpu.SMEM(a_shape, jnp.bfloat16, transforms=bf16_tf),
        "b_dec_smem": plgpu.SMEM((B_SLOTS, *b_shape), jnp.bfloat16, transforms=bf16_tf),
        "b_full": plgpu.Barrier(num_arrivals=2, num_barriers=B_SLOTS),
    }
    num_tiles = p.batch * cfg.k_splits * (p.m // cfg.cta_tile_m) * (p.n // cfg.cta_tile_n)
    grid = min(cfg.num_sms if cfg.num_sms is not None else tp.num_sms(interpret), num_tiles)
    kernel = plgpu.kernel(
        functools.partial(_kernel, p=p, cfg=cfg, interpret=interpret),
        out_type=jax.ShapeDtypeStruct(out_shape, out_dtype),
        grid=(grid,),
        grid_names=("sm",),
        kernel_name="fp4jax_gemm_pipelined",
        num_threads=3,
        thread_name="wg",
        scratch_types=scratch,
        compiler_params=tp.lane_params(
            # The decoded buffers are ordered by their barrier (each thread fences its
            # stores first); the epilogue places its own barriers.
            unsafe_no_auto_barriers=not cfg.auto_barriers,
        ),
        interpret=tp.interpret_params(interpret),
    )
    return kernel(lhs_d, lhs_s, rhs_d, rhs_s, out_scale)
