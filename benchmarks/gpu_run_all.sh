# GPU session part 1 (device tool, repo root): GPU==CPU and kernel bit-exactness tests, then
# the quantize/GEMM/layer benchmark. Logs and JSON go to $OUT. Usage: bash benchmarks/gpu_run_all.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__)" | tee -a $OUT/gpu.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py > $OUT/test_gpu.log 2>&1; echo "test_gpu rc=$?"; tail -3 $OUT/test_gpu.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -s --tb=short tests/kernels > $OUT/test_kernels_gpu.log 2>&1; echo "kernel GPU tests rc=$?"; grep -E "passed|failed|FAILED" $OUT/test_kernels_gpu.log | tail -8
timeout 240 python3 benchmarks/bench_nvfp4.py --out $OUT --iters 20 2>$OUT/bench_stderr.log | tee $OUT/bench.log
