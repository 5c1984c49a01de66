# Next GPU session, call 2 (written 2026-12-01, eighth session; not yet run; ≤ 9.5 min):
# re-measure what the eighth session changed under the targets it did not re-measure.
# 1. issue 9 t4: the jitted step, BF16 and NVFP4 auto in one process, dim 768 (the
#    compare.py model) — last measured in the sixth session (1.34x);
# 2. issue 9 t1: the mainloop table with every view inside the timed program (the
#    eighth session's `--mainloops` change) — after call 1, with any new default;
# 3. issue 9 t5: the wgrad rows the eighth session's call 5 did not reach.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 170 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --dim 768 --out $L/step768.json 2>$L/step768_stderr.log > $L/step768.log
echo "step 768 rc=$?"; grep -A4 "^| recipe" $L/step768.log; save
timeout 200 python3 -m pallas_kernels.gemm --mainloops > $L/mainloops.log 2>&1
echo "mainloops rc=$?"; grep -A12 "^Mainloops" $L/mainloops.log; save
timeout 180 python3 benchmarks/gemm_auto_table.py --layouts wgrad --tokens 8192,16,1024 \
  --kernel-rows-of fp4jax/gemm_table.py --within 1.3 --keep-rows-of fp4jax/gemm_table.py \
  --json $L/table_wgrad.json --module $L/gemm_table_wgrad.py.txt > $L/table_wgrad.log 2>&1
echo "table rc=$?"; tail -8 $L/table_wgrad.log; save
