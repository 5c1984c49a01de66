# GPU session 2026-12-01 (ninth), call 3 (≤ 9.5 min): what the new defaults change elsewhere.
# 1. issue 9 t4: the jitted step, BF16 and NVFP4 auto in one process, dim 768 (the
#    compare.py model) — last measured in the sixth session (1.34x);
# 2. issue 9 t5: the auto table's 16-token rows (the skinny default changed for M <= 16)
#    and the wgrad rows the eighth session did not reach, where the kernel was picked or
#    within 1.3x of XLA.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 170 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --dim 768 --out $L/step768.json 2>$L/step768_stderr.log > $L/step768.log
echo "step 768 rc=$?"; grep -A4 "^| recipe" $L/step768.log; save
timeout 360 python3 benchmarks/gemm_auto_table.py --layouts fprop,dgrad,wgrad --tokens 16,8192,1024 \
  --kernel-rows-of fp4jax/gemm_table.py --within 1.3 --keep-rows-of fp4jax/gemm_table.py \
  --json $L/table.json --module $L/gemm_table.py.txt > $L/table.log 2>&1
echo "table rc=$?"; tail -8 $L/table.log; save
