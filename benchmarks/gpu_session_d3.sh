# GPU session 2026-12-01, call 3: after the stored-orientation decode and the kernel names:
# layer breakdown at the model's shapes and at 8192 (traces name each kernel), the Trainer
# step BF16 vs NVFP4 auto with a trace, and where the NVFP4 step's compile time goes
# (XLA pass times; the same compile without GEMM autotuning), and jit(quantize) on kernels.
export PYTHONPATH=. PYTHONUNBUFFERED=1
for s in "32768 768 2048" "32768 2048 768" "8192 8192 8192"; do set -- $s
  timeout 100 python3 benchmarks/layer_breakdown.py --tokens $1 --d-in $2 --d-out $3 --iters 10 \
    --json $OUT/lb_$2_$3.json --trace /tmp/trace_$2_$3 > $OUT/lb_$2_$3.log 2>&1
  echo "breakdown $1x$2->$3 rc=$?"; sed -n '/^| pass/,$p' $OUT/lb_$2_$3.log | head -30
done
timeout 60 python3 benchmarks/compile_time.py --impl auto --cases quantize_1d_rne,quantize_2d,quantize_rht_sr,dot_general_fwd_bwd \
  --out $OUT/compile_time_ops_auto.json > $OUT/compile_time_ops_auto.log 2>&1; echo "compile ops rc=$?"; tail -6 $OUT/compile_time_ops_auto.log
timeout 200 python3 benchmarks/train_step.py --tokens corpus --recipes bf16,nvfp4 --impls auto \
  --trace /tmp/st --out $OUT/train_step.json 2>$OUT/train_step_stderr.log > $OUT/train_step.log
echo "train_step rc=$?"; grep -A40 "^| recipe" $OUT/train_step.log | head -45
timeout 150 python3 benchmarks/compile_time.py --cases step_nvfp4_auto --log-passes \
  --out $OUT/compile_step_passes.json > $OUT/compile_step_passes.log 2>&1; echo "compile passes rc=$?"; tail -4 $OUT/compile_step_passes.log
python3 -c "
import json; r=json.load(open('$OUT/compile_step_passes.json'))['rows'][0]; l=r.get('log',{})
for k in ('passes','other'):
  print(k); [print(f'  {v:8.2f}  {n}') for n,v in list(l.get(k,{}).items())[:15]]"
timeout 120 python3 benchmarks/compile_time.py --cases step_nvfp4_auto --xla-flags=--xla_gpu_autotune_level=0 \
  --out $OUT/compile_step_noautotune.json > $OUT/compile_step_noautotune.log 2>&1; echo "compile no-autotune rc=$?"; tail -3 $OUT/compile_step_noautotune.log
