# GPU session 2026-12-01, last call: the kernels' bit-exactness after the batched global
# scales (two-output and single-output GPU tests), and the Trainer step's compile and step
# time (dim 768, BF16 vs NVFP4 auto) after it.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 70 python3 -m pytest -q -m gpu tests/kernels/test_quantize_two_output.py -k "384 or 1152" > $OUT/test_kernels_gpu.log 2>&1
echo "kernel tests rc=$?"; tail -2 $OUT/test_kernels_gpu.log
timeout 190 python3 benchmarks/train_step.py --tokens corpus --recipes bf16,nvfp4 --impls auto --iters 3 \
  --out $OUT/train_step_768.json 2>$OUT/train_step_stderr.log > $OUT/train_step_768.log
echo "train_step rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768.log
