# GPU session part 2: the quantize kernels' GPU bit-exactness tests, the cast test, and the
# example model's jitted train step (compile and step time, BF16 vs NVFP4). Logs to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -s --tb=short tests/kernels/test_quantize_single.py tests/kernels/test_quantize_two_output.py > $OUT/test_quantize_kernels_gpu.log 2>&1; echo "quantize kernel GPU tests rc=$?"; grep -E "passed|failed|FAILED|differ" $OUT/test_quantize_kernels_gpu.log | tail -12
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py -k cast > $OUT/test_gpu_cast.log 2>&1; echo "cast tests rc=$?"; tail -2 $OUT/test_gpu_cast.log
timeout 300 python3 benchmarks/train_step.py --impls auto --out $OUT/train_step.json 2>$OUT/train_step_stderr.log | tee $OUT/train_step.log
