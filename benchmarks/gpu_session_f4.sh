# GPU session 2026-12-01 (f), call 4: the quantize kernels without Mosaic's automatic
# store barriers (QuantizeConfig.store_barriers=False, now the default): bit-exactness on
# the GPU, kernel times both ways, and the dim-768 train step.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_quantize_two_output.py \
  tests/kernels/test_quantize_single.py tests/kernels/test_scale_kernels.py tests/test_gpu.py \
  > $OUT/test_gpu.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/test_gpu.log
timeout 150 python3 benchmarks/barrier_cost.py --out $OUT/barrier_cost.json > $OUT/barrier_cost.log 2>&1
echo "barrier_cost rc=$?"; grep "kernel\|copy\|XLA" $OUT/barrier_cost.log | grep -v "^  " | head -40
timeout 170 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --out $OUT/train_step_768.json 2>$OUT/train_step_768_stderr.log > $OUT/train_step_768.log
echo "train_step 768 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768.log
