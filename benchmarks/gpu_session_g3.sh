# GPU session 2026-12-01 (g), call 3: the training step with the two-output quantize
# kernels on narrow 64x64 tiles at 4 CTAs/SM (TWO_OUTPUT_CONFIG, from call 2), traced, at
# dim 768 and 2048; the two-output GPU tests first (default = narrow, and the wide tiles).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_quantize_two_output.py -x \
  > $OUT/test_two_output_gpu.log 2>&1
echo "two-output gpu tests rc=$?"; tail -2 $OUT/test_two_output_gpu.log
timeout 200 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --trace /tmp/st768 --out $OUT/train_step_768.json \
  2>$OUT/train_step_768_stderr.log > $OUT/train_step_768.log
echo "train_step 768 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768.log
grep -m3 "quantize_row" $OUT/train_step_768.log
timeout 260 python3 benchmarks/train_step.py --dim 2048 --recipes bf16,nvfp4 --impls auto --iters 3 \
  --trace /tmp/st2048 --out $OUT/train_step_2048.json \
  2>$OUT/train_step_2048_stderr.log > $OUT/train_step_2048.log
echo "train_step 2048 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_2048.log
grep -m3 "quantize_row" $OUT/train_step_2048.log
