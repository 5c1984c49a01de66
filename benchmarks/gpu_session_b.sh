# GPU session 2026-11-30b, benchmarks: GPU == CPU tests, the quantize/GEMM/layer benchmark
# (after the conversion-free SR rounding and the measured GEMM table of impl=auto) and the
# layer's pass-by-pass breakdown with a jax.profiler trace. Logs and JSON to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py > $OUT/test_gpu.log 2>&1; echo "test_gpu rc=$?"; tail -2 $OUT/test_gpu.log
timeout 260 python3 benchmarks/bench_nvfp4.py --out $OUT --iters 15 2>$OUT/bench_stderr.log > $OUT/bench.log; echo "bench rc=$?"; tail -45 $OUT/bench.log
timeout 150 python3 benchmarks/layer_breakdown.py --json $OUT/layer_breakdown.json --trace /tmp/trace \
  > $OUT/layer_breakdown.log 2>&1; echo "breakdown rc=$?"; tail -40 $OUT/layer_breakdown.log
