# GPU session 2026-12-01 (e), call 3: the forward's X rowwise copy written decoded (BF16
# code·s) by the two-output kernel, so the fprop GEMM needs no XLA decode pass. Its GPU
# bit-exactness (kernel vs reference, dot_general on the GPU), then the step at dim 768
# and 2048 (trace by kind at 2048).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_quantize_two_output.py tests/test_gpu.py \
  tests/test_dot_general.py -k "decoded or gpu or 384" > $OUT/test_gpu.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/test_gpu.log
timeout 170 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --out $OUT/train_step_768.json 2>$OUT/train_step_768_stderr.log > $OUT/train_step_768.log
echo "train_step 768 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768.log
timeout 230 python3 benchmarks/train_step.py --dim 2048 --recipes bf16,nvfp4 --impls auto --iters 3 \
  --trace /tmp/st --out $OUT/train_step_2048.json 2>$OUT/train_step_2048_stderr.log \
  > $OUT/train_step_2048.log
echo "train_step 2048 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_2048.log
grep -A8 "^| kind" $OUT/train_step_2048.log
