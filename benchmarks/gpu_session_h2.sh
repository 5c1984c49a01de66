# Next GPU session, call 2 (written 2026-12-01): the shorter e2m1 -> bf16 decode
# (33fb739, one select; every XLA-path GEMM operand) on the GPU.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -x > $OUT/test_gpu.log 2>&1
echo "test_gpu rc=$?"; tail -2 $OUT/test_gpu.log
timeout 170 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --out $OUT/train_step_768.json 2>$OUT/train_step_768_stderr.log > $OUT/train_step_768.log
echo "train_step 768 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768.log
