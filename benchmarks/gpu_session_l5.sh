# GPU session 2026-12-01 (eighth), call 5 (≤ 8 min): issue 9 t5 after the skeleton's
# role-split pipeline (the pipelined kernel 1.11-1.33x faster in call 3): the auto table's
# rows at 16, 1024 and 8192 tokens where the kernel was picked or at most 1.3x slower than
# XLA (`--kernel-rows-of --within 1.3`), re-measured in-program; the rest kept.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 400 python3 benchmarks/gemm_auto_table.py --tokens 8192,16,1024 \
  --kernel-rows-of fp4jax/gemm_table.py --within 1.3 --keep-rows-of fp4jax/gemm_table.py \
  --json $L/table_close.json --module $L/gemm_table_close.py > $L/table_close.log 2>&1
echo "table rc=$?"; tail -18 $L/table_close.log; save
