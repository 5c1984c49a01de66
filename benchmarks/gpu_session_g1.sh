# Next GPU session, call 1 (written 2026-12-01, not yet run): what this session changed
# that only the H200 can show. (1) The GPU tests of the kernels whose launches are now
# jitted (amax pass, scale kernels) and of the two-output kernels; (2) the NVFP4 step's
# compile time with each distinct Mosaic kernel lowered once (27 -> 16 kernels: the
# backend should build fewer), beside BF16's, with the XLA pass breakdown.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_scale_kernels.py \
  tests/kernels/test_quantize_two_output.py tests/test_gpu.py -x > $OUT/test_gpu.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/test_gpu.log
timeout 200 python3 benchmarks/compile_time.py --cases step_bf16,step_nvfp4_auto --log-passes \
  --scales-in kernel --out $OUT/compile_time.json > $OUT/compile_time.log 2>&1
echo "compile_time rc=$?"; tail -8 $OUT/compile_time.log
# (3) The stochastic-rounding sequence with one threshold compare below 1 (committed
# untimed) against the previous remainder sequence, both bit-exact, in the two-output kernel.
timeout 150 python3 benchmarks/sr_cost.py --out $OUT/sr_cost.json > $OUT/sr_cost.log 2>&1
echo "sr_cost rc=$?"; tail -17 $OUT/sr_cost.log
