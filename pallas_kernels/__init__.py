"""Hopper (sm_90) Pallas Mosaic GPU kernels for NVFP4, beside the pure-JAX reference.

One job per module (docs/ARCHITECTURE.md):

* `quantize_single`: quantize one tensor (`quantize`, `supports`, `reference`, `main`).
* `quantize_two_output`: the rowwise and columnwise-RHT copies from one read
  (`quantize_rowwise_columnwise`, `supports`, `reference`, `main`).
* `gemm`: the NVFP4 × NVFP4 GEMM (`matmul`, `supports`, `reference`, `main`);
  `gemm_config` its tuning, `gemm_kernel` the serial mainloop, `gemm_decode` the in-kernel
  E2M1 decode; `gemm_skinny` the kernel for M <= 64 (weight in registers, fprop and
  dgrad), `gemm_skinny_layouts` / `gemm_skinny_decode` its register layouts and decode,
  `gemm_skinny_bench` its benchmark table; `gemm_pipelined` the pipelined mainloop
  (``TuningConfig.mainloop``), `gemm_pipelined_layouts` / `gemm_pipelined_decode` its
  layouts and decode; `gemm_skeleton` the persistent kernel skeleton (pipeline, tile
  loop, epilogue, launch) the GEMM kernels share; `wgmma_regs` the register-level E2M1
  decode both kernels share;
  `gemm_data` the exact-sum data of the GEMM benchmarks and tests.
* `amax`: the global-amax pass; `quantize_engines`: the quantize kernel body;
  `bit_tricks`: in-kernel elementwise numerics; `tma_pipeline`: the shared Mosaic GPU
  plumbing (layouts, TMA pipeline, grid, `num_sms`); `timing`: the timers (`time_fn`,
  `time_in_program` for calls shorter than their dispatch).

The modules import only `fp4jax.numerics` and each other (a `reference()` or `main()`
may import the pure-JAX reference it is compared with). This package imports nothing:
import the submodule you need.
"""
