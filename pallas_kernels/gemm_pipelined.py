"""The pipelined Hopper NVFP4 GEMM mainloop (``TuningConfig.mainloop = "pipelined"``).

One CTA = 2 consumer warpgroups + 1 TMA producer warpgroup, persistent over 128×256
output tiles (`pallas_kernels.gemm_skeleton`, the skeleton shared with the serial
mainloop: packed codes and block factors in 3 stages of 128 K, the tile loop, the
epilogue). This module is the mainloop: each stage is two 64-wide substeps; per substep
each consumer warpgroup (64 output rows × 256 columns):

1. decodes its 64 lhs rows straight into ``wgmma``'s register A operand (one 64-bit
   shared-memory load per row and thread for an lhs stored ``(M, K/2)``, 16-bit loads of
   two adjacent rows for one stored ``(K/2, M)``; `gemm_pipelined_layouts`);
2. decodes its half (64 × 128) of the substep's rhs tile into one of 3 decoded buffers in
   shared memory (64-bit loads, 128-bit stores), which both warpgroups multiply with;
3. arrives on the buffer's barrier and waits for the other warpgroup's half, issues the
   substep's ``wgmma`` (m64n256k16 × 4) and waits only for the *previous* substep's: the
   decode of one substep runs while the tensor cores multiply the one before.

Two rules keep this correct. A ``wgmma`` reads its A registers until it completes, so
consecutive substeps must not reuse them: the two substeps of a stage are separate
registers (separate values in one loop iteration), and a substep's registers are
written again one stage later, after the wait that retires their wgmma (this is why a
stage holds two substeps: with one, the next iteration would rewrite the registers of a
wgmma in flight). And three decoded buffers need no "consumed" barrier: a warpgroup
that writes buffer s % 3 in substep s has passed the barrier of substep s-1, so the
other warpgroup had finished substep s-2, including its wait for the wgmma of substep
s-3, the last reader of that buffer. (``TuningConfig.decoded_slots = 2`` trades that
argument for a release barrier per buffer: each warpgroup arrives on the previous
substep's buffer once ``wgmma_wait(1)`` has retired its read, and a writer waits for
both; the buffer of a substep is then a constant, and 32 KB of shared memory are free.)

Why this shape (arithmetic per 64-wide substep of a 128×256 CTA tile, H200, one SM):

* ``wgmma``: 2·128·256·64 = 4.19 MFLOP = 1024 cycles at the dense BF16 peak (4096
  FLOP/cycle/SM); BF16 ``jnp.dot`` runs at ~70% of it (692 TFLOP/s at 8192³), ~1460
  cycles, so 0.95× BF16 leaves ~1540 cycles per substep.
* Decode: (128 + 256)·64 = 24576 elements = 12288 pairs, each once. The serial mainloop
  (`gemm_kernel`, the default) decodes the lhs tile in both warpgroups: 16384 pairs,
  with a byte load per lhs pair, a 32-bit store per rhs pair and ~7 instructions per
  pair, and each warpgroup then waits for its own wgmma (decode and MMA alternate).
  Here: 3 integer instructions per pair (`wgmma_regs.decode_pair`) plus 3 per 32-bit
  word for the nibble planes and one bf16x2 multiply; loads 1/8 to 1/2 per pair, 1/4
  store per rhs pair (the lowered module has exactly 48 ``prmt`` per thread and
  substep: 16 lhs + 32 rhs pairs). ≈ 3.1 ALU-pipe instructions per pair: 38K lane-ops
  = 1190 warp instructions = ~600 cycles of the ALU pipe (2 warp instructions per cycle
  per SM), ~40% of the substep; IMAD + HMUL2 ~380 cycles of the FMA pipe; ~5.5
  instructions per pair in all ≈ 2100 warp instructions = ~530 issue cycles of the 4
  schedulers, ~35%.
* Shared memory per substep: TMA writes 15 KB, decode reads ~17 KB, decoded rhs writes
  32 KB, wgmma reads the rhs (64×256 BF16) once per warpgroup: 64 KB; ≈ 128 KB = 83
  B/cycle at 1540 cycles, 65% of the 128 B/cycle (cuBLAS's BF16 128×256 mainloop moves
  about as much). A separate decode warpgroup writing both operands to SMEM (option
  (a)) would add the lhs's 16 KB store and 16 KB of wgmma reads per substep and leave
  the MMA warpgroups only the registers a four-warpgroup setmaxnreg split allows; a
  256×128 tile decodes the same pairs but needs 128 accumulator + 2·32 A registers per
  thread for the overlap (64×256 per warpgroup: 128 + 2·16).
* Registers per consumer thread: 128 (accumulator) + 2×16 (A of two substeps) + decode
  temporaries, under the 232 that `gemm_skeleton.CONSUMER_REGISTERS` allows.
* SMEM: 3 stages × 30 KB + 3 decoded buffers × 32 KB + the epilogue's 32 KB (two 64×64
  slices per warpgroup in BF16, one in float32) = 218 KB of the 227 KB.

So the decode fits under the tensor-core time with margin on every pipe, provided it
overlaps the MMA, which step 3 arranges; ptxas keeps that overlap only with the register
budgets set once per role (`gemm_skeleton.role_pipeline`: under a per-tile
``emit_pipeline_warp_specialized`` it serialized every ``wgmma``, C7512). Measured on an
H200 (docs/BENCHMARKS.md, eighth session): 0.76–0.78× BF16 at 8192³, bound by the
decode's instruction latency (655 instructions per consumer warp and 128-K stage, 498 of
them the decode; tensor pipe ~53% busy), not by a pipe.

Decoder warpgroups (one or two more warpgroups that decode the rhs tile, or both
operands, into shared memory while the consumers only multiply) were tried and measured
slower on an H200: 0.17–0.97× this mainloop's speed at 8192³ (docs/BENCHMARKS.md, tenth
session). ptxas compiles every instruction within the launch's even register share
(65536 / threads, a multiple of 8), whatever ``setmaxnreg`` grants later: 128 per thread
with four warpgroups, under the 158 an m64n256 ``wgmma`` needs (C7602), and 96 with
five, which serializes the ``wgmma`` (C7512). The code lived in commits 51507b9 ..
74c5ae5.

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
from pallas_kernels import gemm_pipelined_decode as pd
from pallas_kernels import gemm_pipelined_layouts as pl_
from pallas_kernels import gemm_skeleton as sk
from pallas_kernels.gemm_config import TuningConfig
from pallas_kernels.gemm_pipelined_layouts import HALF_N, TILE_K, WG_M
from pallas_kernels.gemm_skeleton import Problem, swizzled


def _kernel(*gmem, out_smem, a_smem, b_dec_smem, b_full, b_free=None, p: Problem,
            cfg: TuningConfig, interpret: bool):
    """The pipelined mainloop in `gemm_skeleton.persistent_gemm` (``gmem``: its refs, the
    rhs factors of an rhs stored ``(N/2, K)`` one per 16×16 tile, ``(B, K/16, N/16)``;
    ``a_smem``: the interpret-mode A operands; ``b_free``: the decoded buffers' release
    barriers, with ``cfg.decoded_slots == 2``)."""
    a_op, b_op = pl_.operands(p.lhs_cols, p.rhs_cols)
    k_iters = p.k // cfg.k_splits // cfg.tile_k
    substeps = cfg.tile_k // TILE_K
    slots = cfg.decoded_slots

    def step_of(info, k, h):
        """The CTA's flat substep count (tiles × K steps × substeps)."""
        return (info.local_index * k_iters + k) * substeps + h

    def slot_of(step, h):
        # Two buffers: substep h of a stage always uses buffer h % 2 (a stage has an even
        # number of substeps), a constant address.
        return h % 2 if slots == 2 else lax.rem(step, slots)

    def decode_rhs_half(half, h, rhs_smem, rhs_s_smem, b_dec):
        """Decodes half ``half`` (128 columns) of substep ``h``'s rhs tile into ``b_dec``."""
        kp = pl.ds(h * (TILE_K // 2), TILE_K // 2)  # packed rows or bytes
        kb = pl.ds(h * (TILE_K // BLOCK), TILE_K // BLOCK)  # scale blocks
        cols = pl.ds(half * HALF_N, HALF_N)
        if p.rhs_cols:
            pd.decode_b(b_op,
                        rhs_smem.at[pl.ds(half * (HALF_N // 2), HALF_N // 2),
                                    pl.ds(h * TILE_K, TILE_K)],
                        rhs_s_smem.at[kb, pl.ds(half * (HALF_N // BLOCK), HALF_N // BLOCK)],
                        b_dec.at[cols], interpret=interpret)
        else:
            pd.decode_b(b_op, rhs_smem.at[kp, cols], rhs_s_smem.at[kb, cols],
                        b_dec.at[:, cols], interpret=interpret)

    def decode_lhs(wg, h, lhs_smem, lhs_s_smem):
        wg_rows = pl.ds(wg * WG_M, WG_M)
        kp = pl.ds(h * (TILE_K // 2), TILE_K // 2)
        kb = pl.ds(h * (TILE_K // BLOCK), TILE_K // BLOCK)
        codes = lhs_smem.at[kp, wg_rows] if p.lhs_cols else lhs_smem.at[wg_rows, kp]
        return pd.decode_a(a_op, codes, lhs_s_smem.at[kb, wg_rows], interpret=interpret)

    def multiply(wg, acc_ref, a, b_dec):
        """Issues the substep's wgmma (``a``: its A registers, ``b_dec``: its decoded rhs
        buffer) and waits for the previous substep's."""
        if interpret:  # interpret-mode wgmma takes SMEM operands only
            a_smem.at[wg][...] = a
            a = a_smem.at[wg]
        plgpu.wgmma(acc_ref, a, b_dec.T if p.rhs_cols else b_dec)
        plgpu.wgmma_wait(1)  # the previous substep's wgmma, not this one's

    def acquire(step, slot):
        """Waits until the buffer's last readers, both consumers' wgmma of substep
        ``step - slots``, are done (its first use waits for nothing)."""
        @pl.when(step >= slots)
        def _():
            plgpu.barrier_wait(b_free.at[slot])

    def mainloop(wg):
        def tile(info):
            def mma_body(idx, lhs_smem, lhs_s_smem, rhs_smem, rhs_s_smem, acc_ref):
                # Each substep's A is a separate set of registers: the wgmma of the
                # previous substep still reads its own while this one is decoded.
                for h in range(substeps):
                    step = step_of(info, idx[0], h)
                    slot = slot_of(step, h)
                    a = decode_lhs(wg, h, lhs_smem, lhs_s_smem)
                    b_dec = b_dec_smem.at[slot]
                    if slots == 2:
                        acquire(step, slot)
                    decode_rhs_half(wg, h, rhs_smem, rhs_s_smem, b_dec)
                    plgpu.commit_smem()  # this thread's stores, visible to the async proxy
                    plgpu.barrier_arrive(b_full.at[slot])
                    plgpu.barrier_wait(b_full.at[slot])  # the other warpgroup's half
                    multiply(wg, acc_ref, a, b_dec)
                    if slots == 2:
                        release_previous(step, h)
                return acc_ref

            def release_previous(step, h):
                """This warpgroup's wgmma of substep ``step - 1`` has retired: its buffer
                is free for the writers (who wait for both consumers). After the CTA's
                last substep, observe that last release (no phase left unseen)."""
                @pl.when(step >= 1)
                def _():
                    plgpu.barrier_arrive(b_free.at[slot_of(step - 1, h - 1)])

                @pl.when(step == info.num_local_steps * k_iters * substeps - 1)
                def _():
                    plgpu.barrier_wait(b_free.at[slot_of(step - 1, h - 1)])

            store = None
            if p.lhs_cols:  # A rows permuted: the slices are renamed back
                def store(part, ref):
                    pd.store_output(a_op, part, ref, interpret=interpret)
            return sk.TileMainloop(mma_body, (pl.ds(wg * WG_M, WG_M), slice(None)), store)
        return tile

    # Swizzles follow the per-warpgroup and per-substep slices, so they stay whole tiles.
    sk.persistent_gemm(
        gmem, out_smem, p, cfg,
        lhs_transforms=(swizzled(WG_M, 8, "lhs") if p.lhs_cols
                        else swizzled(TILE_K // 2, 8, "lhs")),
        rhs_transforms=(swizzled(TILE_K, 8, "rhs") if p.rhs_cols
                        else swizzled(HALF_N, 8, "rhs")),
        rhs_scale_tiles=True, mainloop=mainloop)


SMEM_BYTES = 227 * 1024
"""Shared memory of one CTA on an H200 (sm_90)."""


def smem_bytes(p: Problem, cfg: TuningConfig, out_bits: int, out_slots: int) -> int:
    """Bytes of shared memory the kernel allocates (within a few hundred of barriers)."""
    tk, cta_tm, cta_tn = cfg.tile_k, cfg.cta_tile_m, cfg.cta_tile_n
    rhs_scales = tk // BLOCK * (cta_tn // BLOCK if p.rhs_cols else cta_tn) * 2
    stage = cta_tm * tk // 2 + tk // BLOCK * cta_tm * 2 + tk // 2 * cta_tn + rhs_scales
    decoded = cfg.decoded_slots * TILE_K * cta_tn * 2
    out = 2 * out_slots * cfg.epi_tile_m * cfg.epi_tile_n * out_bits // 8
    return cfg.max_concurrent_steps * stage + decoded + out


def _out_slots_that_fit(p: Problem, cfg: TuningConfig, out_bits: int) -> int:
    """Epilogue slots per warpgroup: 2 if they fit in `SMEM_BYTES` (with 2 KB to spare
    for barriers and alignment), else 1 (float32 output with 3 stages: the TMA store of
    one slice then ends before the next is written)."""
    return 2 if smem_bytes(p, cfg, out_bits, 2) + 2048 <= SMEM_BYTES else 1


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
    bits = jnp.dtype(sk.output_type(p, cfg).dtype).itemsize * 8
    if (need := smem_bytes(p, cfg, bits, 1) + 2048) > SMEM_BYTES:
        raise ValueError(f"{cfg} needs {need} bytes of shared memory, more than the "
                         f"{SMEM_BYTES} of an H200 SM: fewer stages or decoded buffers")
    bf16_tf = swizzled(128, 16, "decoded")  # (8, 64) tiles, 128B swizzle
    b_shape = (cfg.cta_tile_n, TILE_K) if p.rhs_cols else (TILE_K, cfg.cta_tile_n)
    a_shape = (2, WG_M, TILE_K) if interpret else (1, 8, 64)  # unused on the GPU
    scratch = {
        "a_smem": plgpu.SMEM(a_shape, jnp.bfloat16, transforms=bf16_tf),
        "b_dec_smem": plgpu.SMEM((cfg.decoded_slots, *b_shape), jnp.bfloat16,
                                 transforms=bf16_tf),
        "b_full": plgpu.Barrier(num_arrivals=2, num_barriers=cfg.decoded_slots),  # both halves
    }
    if cfg.decoded_slots == 2:
        scratch["b_free"] = plgpu.Barrier(num_arrivals=2, num_barriers=2)
    # Without Pallas' automatic barriers (unless cfg.auto_barriers): the decoded buffers
    # are ordered by their barrier (each thread fences its stores first); the epilogue
    # places its own barriers.
    return sk.call_gemm(functools.partial(_kernel, p=p, cfg=cfg, interpret=interpret),
                        (lhs_d, lhs_s, rhs_d, rhs_s, out_scale), p, cfg, interpret,
                        kernel_name="fp4jax_gemm_pipelined", scratch=scratch,
                        max_out_slots=_out_slots_that_fit(p, cfg, bits))
