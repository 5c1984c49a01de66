# GPU session 2026-12-01, call 1: confirm the previous session's committed changes on the
# H200: the layer breakdown (decode of column-packed operands through .mT), the Trainer step
# BF16 vs NVFP4 xla/auto with the auto-table guard and a trace of where the step's device
# time goes, jit(quantize) compile times, and the GPU==CPU tests (now with the 4/6 rule).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -x tests/test_gpu.py > $OUT/test_gpu.log 2>&1; echo "test_gpu rc=$?"; tail -2 $OUT/test_gpu.log
timeout 100 python3 benchmarks/layer_breakdown.py --iters 10 --json $OUT/layer_breakdown.json \
  --trace /tmp/t > $OUT/layer_breakdown.log 2>&1; echo "breakdown rc=$?"; head -14 $OUT/layer_breakdown.log | tail -11
timeout 80 python3 benchmarks/compile_time.py --cases quantize_1d_rne,quantize_2d,quantize_rht_sr,dot_general_fwd_bwd \
  --out $OUT/compile_time_ops.json > $OUT/compile_time_ops.log 2>&1; echo "compile rc=$?"; tail -8 $OUT/compile_time_ops.log
timeout 330 python3 benchmarks/train_step.py --tokens corpus --recipes bf16,nvfp4 --impls auto,xla \
  --trace /tmp/st --out $OUT/train_step.json 2>$OUT/train_step_stderr.log > $OUT/train_step.log
echo "train_step rc=$?"; grep -A60 "^command" $OUT/train_step.log | head -70
