# One GPU session: core GPU==CPU tests, kernel tests, then the benchmark table (logs to $OUT).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py 2>&1 | tail -4 | tee $OUT/test_gpu.log
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -x --tb=short tests/kernels/test_matmul_kernel.py > $OUT/test_matmul_kernel.log 2>&1; echo "matmul kernel tests rc=$?"; grep -E "passed|failed|Error" $OUT/test_matmul_kernel.log | tail -5
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --tb=line -k "384x640 or 1152x896" tests/kernels/test_quantize_kernel.py > $OUT/test_quantize_kernel.log 2>&1; echo "quantize kernel tests rc=$?"; grep -E "passed|failed" $OUT/test_quantize_kernel.log | tail -3
timeout 260 python3 benchmarks/bench_nvfp4.py --out $OUT --iters 20 2>$OUT/bench_stderr.log | tee $OUT/bench.log
