# GPU session 2026-12-01 (seventh), call 4 (≤ 9 min): issue 9 t5, the rows of the auto table
# where fp4jax/gemm_table.py picks the kernel, for 16, 128 and 1024 tokens, re-measured with
# the in-program timer (the old rows there were timed with time_fn, host-bound below
# ~0.1 ms); the pipelined mainloop is now the large default. The JSON and module are
# rewritten after every row, so a run cut short keeps what it measured.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 520 python3 benchmarks/gemm_auto_table.py --tokens 16,128,1024 \
  --kernel-rows-of fp4jax/gemm_table.py --keep-rows-of fp4jax/gemm_table.py \
  --json $OUT/table_kernel_rows.json --module $OUT/gemm_table.py.txt 2>&1 | tee $OUT/table.log
