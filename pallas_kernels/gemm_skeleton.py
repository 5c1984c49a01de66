"""The persistent, warp-specialized skeleton the Hopper NVFP4 GEMM kernels share.

Every GEMM kernel (`gemm_kernel`'s serial mainloop, `gemm_pipelined`, `gemm_skinny`) is
one CTA of 2 consumer warpgroups + 1 TMA producer warpgroup (thread axis ``"wg"``),
persistent over its output tiles (grid axis ``"sm"``, `launch`), pipelining K through
shared memory with TMA (`role_pipeline`: each role sets its registers once and runs its
own tile loop, so the producer loads the next tile while the consumers store). The two
mainloops of the general kernel share more: `persistent_gemm` is their kernel body (the
TMA operand specs, the tile loop, the accumulator, the epilogue) around a `Mainloop`,
and `call_gemm` their launch (output, epilogue buffers, grid); a mainloop file keeps
only its decode and ``wgmma`` per K step, its operand swizzles and its shared-memory
buffers.

The epilogue multiplies the float32 accumulator by ``2**16`` (exact: undoes the ``2**-8``
per decoded operand) and by ``fl(gds_lhs · gds_rhs)``, casts, and stores through SMEM
with TMA (`store_epilogue`). With ``k_splits > 1`` it stores float32 partial sums instead.

Example:
  >>> import jax.numpy as jnp
  >>> from pallas_kernels import gemm_config, gemm_skeleton
  >>> p = gemm_skeleton.Problem(1, 128, 256, 512, False, False, jnp.bfloat16)
  >>> gemm_skeleton.output_type(p, gemm_config.LARGE_CONFIG)
  ShapeDtypeStruct(shape=(1, 128, 256), dtype=bfloat16)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from fp4jax.numerics.constants import BLOCK
from pallas_kernels import gemm_decode as dec
from pallas_kernels import tma_pipeline as tp
from pallas_kernels.gemm_config import TuningConfig


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


def launch(body: Callable[..., None], operands: Sequence[jax.Array], *,
           out_type: jax.ShapeDtypeStruct, num_tiles: int, num_ctas: int | None,
           kernel_name: str, scratch: dict[str, Any], interpret: bool,
           no_auto_barriers: bool = False) -> jax.Array:
    """Runs ``body(*operand_refs, out_ref, **scratch_refs)`` on ``operands`` as a
    persistent kernel: 3 warpgroups per CTA (axis ``"wg"``), ``num_ctas`` CTAs (default
    one per SM) but at most one per tile (axis ``"sm"``); ``no_auto_barriers`` drops
    Pallas' automatic barriers (the body must place its own)."""
    grid = tp.grid_size(num_tiles, num_ctas=num_ctas, ctas_per_sm=1, interpret=interpret)
    kernel = plgpu.kernel(
        body,
        out_type=out_type,
        grid=(grid,),
        grid_names=("sm",),
        kernel_name=kernel_name,
        num_threads=NUM_CONSUMERS + 1,  # and the producer
        thread_name="wg",
        scratch_types=scratch,
        compiler_params=tp.lane_params(unsafe_no_auto_barriers=no_auto_barriers),
        interpret=tp.interpret_params(interpret),
    )
    return kernel(*operands)


MEMORY_REGISTERS = 40
"""Registers per thread of the TMA producer warpgroup (``setmaxnreg``); the two consumer
warpgroups get the rest of the 64K register file: (512 − 40) / 2 → 232 per thread."""
CONSUMER_REGISTERS = (512 - MEMORY_REGISTERS) // 2 // 8 * 8
NUM_CONSUMERS = 2

RunK = Callable[[Callable[..., Any], Any], None]
"""``run_k(mma_body, acc_ref)``: one output tile's K loop in a consumer warpgroup; per K
step it waits for the stage's TMA loads, calls ``mma_body((k,), *stage_refs, acc_ref)``
and releases the stage to the producer."""


def _block(spec: plgpu.BlockSpec, k: jax.Array) -> tuple[Any, ...]:
    """The slices of K step ``k``'s block of a tile ref (``spec.index_map(k)`` blocks)."""
    return tuple(pl.ds(i * b, b) for i, b in zip(spec.index_map(k), spec.block_shape))


def role_pipeline(in_specs: Sequence[plgpu.BlockSpec], dtypes: Sequence[Any], *,
                  stages: int, k_steps: int, num_tiles: int,
                  tile_operands: Callable[[plgpu.NDLoopInfo], Sequence[Any]],
                  consumer: Callable[[jax.Array], Callable[[plgpu.NDLoopInfo, RunK], None]]
                  ) -> None:
    """The warp-specialized, persistent K pipeline of every GEMM kernel here.

    The producer warpgroup (``wg == NUM_CONSUMERS``) and the consumer warpgroups each
    set their register budget once (``setmaxnreg``) and then run their own loop over
    this CTA's output tiles (`plgpu.nd_loop` over ``num_tiles``, axis ``"sm"``): the
    producer streams every tile's ``k_steps`` blocks of ``in_specs`` through ``stages``
    shared-memory slots with TMA, and moves on to the next tile's blocks while the
    consumers still finish the last one (their epilogue overlaps its loads). The
    consumers run ``consumer(wg)(info, run_k)`` per tile.

    Why not ``plgpu.emit_pipeline_warp_specialized`` per tile: it sets the register
    budgets inside the tile loop, where the two roles' paths merge again, and ptxas then
    serializes a ``wgmma`` whose A operand is in registers ("(C7512) wgmma.mma_async
    instructions are serialized due to insufficient register resources"): each
    ``wgmma`` waits for the one before, and no decode overlaps the tensor cores. With the
    budgets set once and the roles' loops apart, the same mainloop assembles with its
    ``wgmma.wait_group 1`` intact (docs/BENCHMARKS.md, eighth session: the PTX variants
    ptxas serializes or not, and the speed-up on the H200).

    Stage ``s`` of the CTA's flat step sequence (tiles × K steps) uses slot
    ``s % stages``: its TMA loads arrive on ``full[slot]`` (one arrival per operand, with
    their bytes), and both consumers arrive on ``empty[slot]`` once their ``mma_body``
    returned, which must therefore have finished reading the stage's buffers (its own
    ``wgmma`` waits, or ``wgmma`` operands decoded elsewhere). The producer waits for
    ``empty`` before it reuses a slot. Phases follow from every thread waiting on each of
    its barriers once per use, in order.

    Args:
      in_specs: per operand, the block of one K step (``index_map(k)``) and its SMEM
        transforms.
      dtypes: the operands' dtypes.
      stages: shared-memory slots (K steps in flight); at most ``k_steps``.
      k_steps: K steps per output tile.
      num_tiles: output tiles of the launch (shared out over the CTAs).
      tile_operands: the GMEM refs of one tile's operands (``k_steps`` blocks each).
      consumer: ``consumer(wg)`` runs once per consumer warpgroup before its tile loop
        and returns the per-tile function.
    """
    # A configuration's SMEM budget counts at most one tile's K steps in flight.
    stages = min(stages, k_steps)
    smem = [plgpu.SMEM((stages, *spec.block_shape), dtype, transforms=spec.transforms)
            for spec, dtype in zip(in_specs, dtypes)]

    def scope(*bufs, full, empty):
        wg = lax.axis_index("wg")

        @pl.when(wg == NUM_CONSUMERS)
        def _producer():
            plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")

            @plgpu.nd_loop((num_tiles,), collective_axes="sm")
            def _tile(info: plgpu.NDLoopInfo):
                tiles = tile_operands(info)

                @pl.loop(0, k_steps)
                def _k(k):
                    step = info.local_index * k_steps + k
                    slot = lax.rem(step, stages)

                    @pl.when(step >= stages)
                    def _():
                        plgpu.barrier_wait(empty.at[slot])

                    for spec, tile_ref, buf in zip(in_specs, tiles, bufs):
                        plgpu.copy_gmem_to_smem(tile_ref.at[_block(spec, k)], buf.at[slot],
                                                full.at[slot])

                # After the last tile, observe the releases not yet waited for, so that no
                # barrier is left with a phase its waiter never saw.
                @pl.when(info.local_index == info.num_local_steps - 1)
                def _drain():
                    total = info.num_local_steps * k_steps

                    @pl.loop(jnp.maximum(total - stages, 0), total)
                    def _(step):
                        plgpu.barrier_wait(empty.at[lax.rem(step, stages)])

        @pl.when(wg < NUM_CONSUMERS)
        def _consumers():
            per_tile = consumer(wg)
            plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")

            @plgpu.nd_loop((num_tiles,), collective_axes="sm")
            def _tile(info: plgpu.NDLoopInfo):
                def run_k(mma_body, acc_ref):
                    @pl.loop(0, k_steps)
                    def _k(k):
                        slot = lax.rem(info.local_index * k_steps + k, stages)
                        plgpu.barrier_wait(full.at[slot])
                        mma_body((k,), *(buf.at[slot] for buf in bufs), acc_ref)
                        plgpu.barrier_arrive(empty.at[slot])

                per_tile(info, run_k)

    pl.run_scoped(scope, *smem,
                  full=plgpu.Barrier(num_arrivals=len(in_specs), num_barriers=stages),
                  empty=plgpu.Barrier(num_arrivals=NUM_CONSUMERS, num_barriers=stages),
                  collective_axes="wg")


@dataclasses.dataclass(frozen=True)
class TileMainloop:
    """A mainloop's part of one output tile, for one consumer warpgroup.

    Attributes:
      mma_body: the pipeline body of one K step, ``(idx, lhs_smem, lhs_scales_smem,
        rhs_smem, rhs_scales_smem, acc_ref) -> acc_ref`` (decodes and multiplies into
        the warpgroup's (tile_m, tile_n) float32 accumulator).
      out_window: the index of this warpgroup's accumulator in the CTA's output tile.
      store: `store_epilogue`'s ``store`` (None: a plain SMEM store).
    """

    mma_body: Callable[..., Any]
    out_window: tuple[Any, ...]
    store: Callable[[jax.Array, Any], None] | None = None


Mainloop = Callable[[jax.Array], Callable[[plgpu.NDLoopInfo], TileMainloop]]
"""``mainloop(wg)`` runs once per warpgroup before the tile loop and returns
``tile(info)``, run once per output tile (``info``: `plgpu.nd_loop`'s) before its pipeline."""


def persistent_gemm(gmem: Sequence[Any], out_smem: Any, p: Problem, cfg: TuningConfig, *,
                    lhs_transforms: tuple[Any, ...], rhs_transforms: tuple[Any, ...],
                    rhs_scale_tiles: bool, mainloop: Mainloop) -> None:
    """One persistent CTA: loops over output tiles, pipelines packed K-tiles, stores.

    Args:
      gmem: the GMEM refs (batch-major):
        ``lhs`` (B, M, K/2) or, with ``p.lhs_cols``, (B, K/2, M) uint8 codes;
        ``lhs_scales`` (B, K/16, M) bf16 block-scale factors (`gemm_decode.scale_factors`);
        ``rhs`` (B, K/2, N) or, with ``p.rhs_cols``, (B, N/2, K) uint8 codes;
        ``rhs_scales`` (B, K/16, N) bf16, or with ``p.rhs_cols`` (B, N/16, K), or
        (B, K/16, N/16) (one per 16×16 tile) with ``rhs_scale_tiles`` too;
        ``out_scale`` (1,) float32 ``fl(gds_lhs · gds_rhs)``;
        ``out`` (B, M, N) out dtype, or (k_splits, B, M, N) float32 partial sums.
      out_smem: the epilogue's (2, slots, epi_tile_m, epi_tile_n) buffers (`call_gemm`).
      p: the problem.
      cfg: the tuning (its CTA tile, K step, pipeline depth, grid order, epilogue).
      lhs_transforms: SMEM transforms of the lhs codes' pipeline buffers.
      rhs_transforms: those of the rhs codes.
      rhs_scale_tiles: an rhs stored (N/2, K) comes with one factor per 16×16 tile.
      mainloop: the decode and ``wgmma`` of each K step (`Mainloop`).
    """
    lhs_gmem, lhs_scales_gmem, rhs_gmem, rhs_scales_gmem, out_scale_gmem, out_gmem = gmem
    tk, cta_tm, cta_tn = cfg.tile_k, cfg.cta_tile_m, cfg.cta_tile_n
    m_iters, n_iters = p.m // cta_tm, p.n // cta_tn
    k_per_split = p.k // cfg.k_splits
    split_out = cfg.k_splits > 1
    rhs_scales_nk = p.rhs_cols and not rhs_scale_tiles  # (N/16, K)

    in_specs = [
        plgpu.BlockSpec(
            (tk // 2, cta_tm) if p.lhs_cols else (cta_tm, tk // 2),
            (lambda k: (k, 0)) if p.lhs_cols else (lambda k: (0, k)),
            transforms=lhs_transforms,
        ),
        plgpu.BlockSpec((tk // BLOCK, cta_tm), lambda k: (k, 0)),
        plgpu.BlockSpec(
            (cta_tn // 2, tk) if p.rhs_cols else (tk // 2, cta_tn),
            (lambda k: (0, k)) if p.rhs_cols else (lambda k: (k, 0)),
            transforms=rhs_transforms,
        ),
        plgpu.BlockSpec((cta_tn // BLOCK, tk), lambda k: (0, k)) if rhs_scales_nk else
        plgpu.BlockSpec((tk // BLOCK, cta_tn // BLOCK if p.rhs_cols else cta_tn),
                        lambda k: (k, 0)),
    ]

    def tile_slices(info: plgpu.NDLoopInfo):
        (lin,) = info.index
        bk, mn = lin // (m_iters * n_iters), lin % (m_iters * n_iters)
        b, ks = bk // cfg.k_splits, bk % cfg.k_splits
        m_idx, n_idx = plgpu.planar_snake(
            mn, (m_iters, n_iters), cfg.grid_minor_dim, cfg.grid_tile_width
        )
        return b, ks, m_idx, n_idx

    def tile_operands(info: plgpu.NDLoopInfo):
        b, ks, m_idx, n_idx = tile_slices(info)
        m_sl = pl.ds(m_idx * cta_tm, cta_tm)
        n_sl = pl.ds(n_idx * cta_tn, cta_tn)
        k_sl = pl.ds(ks * k_per_split, k_per_split)
        kp_sl = pl.ds(ks * (k_per_split // 2), k_per_split // 2)
        ks_sl = pl.ds(ks * (k_per_split // BLOCK), k_per_split // BLOCK)
        lhs_tile = lhs_gmem.at[b]
        lhs_tile = lhs_tile.at[kp_sl, m_sl] if p.lhs_cols else lhs_tile.at[m_sl, kp_sl]
        rhs_tile = rhs_gmem.at[b]
        rhs_tile = (
            rhs_tile.at[pl.ds(n_idx * (cta_tn // 2), cta_tn // 2), k_sl]
            if p.rhs_cols else rhs_tile.at[kp_sl, n_sl]
        )
        rhs_s_tile = rhs_scales_gmem.at[b]
        if not p.rhs_cols:
            rhs_s_tile = rhs_s_tile.at[ks_sl, n_sl]
        elif rhs_scales_nk:
            rhs_s_tile = rhs_s_tile.at[pl.ds(n_idx * (cta_tn // BLOCK), cta_tn // BLOCK), k_sl]
        else:
            rhs_s_tile = rhs_s_tile.at[ks_sl, pl.ds(n_idx * (cta_tn // BLOCK), cta_tn // BLOCK)]
        return lhs_tile, lhs_scales_gmem.at[b].at[ks_sl, m_sl], rhs_tile, rhs_s_tile

    def consumer(wg):
        tile = mainloop(wg)

        def per_tile(info: plgpu.NDLoopInfo, run_k: RunK):
            b, ks, m_idx, n_idx = tile_slices(info)
            work = tile(info)

            @functools.partial(pl.run_scoped,
                               acc_ref=plgpu.ACC((cfg.tile_m, cfg.tile_n), jnp.float32))
            def _acc_scope(acc_ref):
                run_k(work.mma_body, acc_ref)
                # Waits for the last wgmma; exact: undoes the 2**-8 per operand.
                acc = acc_ref[...] * dec.ACC_UNSCALE
                if split_out:
                    out_tile = out_gmem.at[ks, b]
                else:
                    acc = (acc * out_scale_gmem[0]).astype(p.out_dtype)
                    out_tile = out_gmem.at[b]
                out_tile = out_tile.at[pl.ds(m_idx * cta_tm, cta_tm), pl.ds(n_idx * cta_tn, cta_tn)]
                store_epilogue(acc, out_smem.at[wg], out_tile.at[work.out_window], cfg,
                               work.store)
        return per_tile

    role_pipeline(in_specs, [g.dtype for g in (lhs_gmem, lhs_scales_gmem, rhs_gmem,
                                               rhs_scales_gmem)],
                  stages=cfg.max_concurrent_steps, k_steps=k_per_split // tk,
                  num_tiles=p.batch * cfg.k_splits * m_iters * n_iters,
                  tile_operands=tile_operands, consumer=consumer)
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


def output_type(p: Problem, cfg: TuningConfig) -> jax.ShapeDtypeStruct:
    """The kernel's output: (B, M, N) of ``p.out_dtype``, or with ``k_splits > 1``
    (k_splits, B, M, N) float32 partial sums before the output scale."""
    out_dtype = jnp.float32 if cfg.k_splits > 1 else p.out_dtype
    out_shape = (p.batch, p.m, p.n)
    if cfg.k_splits > 1:
        out_shape = (cfg.k_splits,) + out_shape
    return jax.ShapeDtypeStruct(out_shape, out_dtype)


def call_gemm(body: Callable[..., None], operands: Sequence[jax.Array], p: Problem,
              cfg: TuningConfig, interpret: bool, *, kernel_name: str,
              scratch: dict[str, Any], max_out_slots: int = 2) -> jax.Array:
    """Launches a `persistent_gemm` kernel ``body(*gmem, out_smem=, **scratch)``.

    Args:
      body: the kernel body; its ``out_smem`` is the epilogue's buffers: per consumer
        warpgroup up to ``max_out_slots`` (at most 2) slices of the output tile.
      operands: ``(lhs, lhs_scales, rhs, rhs_scales, out_scale)`` (`persistent_gemm`).
      p: the problem.
      cfg: the tuning.
      interpret: Mosaic GPU interpret mode (CPU).
      kernel_name: the kernel's name (in profiles and dumps).
      scratch: the mainloop's shared-memory buffers and barriers.
      max_out_slots: a cap on the epilogue slots (shared-memory budget).

    Returns:
      `output_type`.
    """
    out_type = output_type(p, cfg)
    bits = jnp.dtype(out_type.dtype).itemsize * 8
    num_out_slots = min(2, (cfg.tile_m * cfg.tile_n) // (cfg.epi_tile_m * cfg.epi_tile_n),
                        max_out_slots)
    out_smem = plgpu.SMEM(
        (2, num_out_slots, cfg.epi_tile_m, cfg.epi_tile_n), out_type.dtype,
        transforms=swizzled(cfg.epi_tile_n * bits // 8, bits, "out"),
    )
    num_tiles = p.batch * cfg.k_splits * (p.m // cfg.cta_tile_m) * (p.n // cfg.cta_tile_n)
    return launch(body, operands, out_type=out_type, num_tiles=num_tiles,
                  num_ctas=cfg.num_sms, kernel_name=kernel_name,
                  scratch={"out_smem": out_smem, **scratch}, interpret=interpret,
                  no_auto_barriers=not cfg.auto_barriers)
