# GPU session 2026-12-01 (e), call 2: div_rn's digit correction in unsigned ops (the
# in-kernel scale math's GPU mismatch), GPU tests of the XLA path and the kernels; the
# dim-2048 step with the scale math in kernels (trace by kind, optimized HLO to look up
# the fusions the trace names); where the NVFP4 step's compile time goes now.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_scale_kernels.py tests/test_gpu.py \
  tests/kernels/test_quantize_two_output.py -k "scale or gpu or 384 or 1152" > $OUT/test_gpu.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/test_gpu.log
timeout 260 python3 benchmarks/train_step.py --dim 2048 --recipes bf16,nvfp4 --impls auto --iters 3 \
  --scales-in kernel --trace /tmp/st --hlo $OUT/hlo --out $OUT/train_step_2048_kernel.json \
  2>$OUT/train_step_2048_stderr.log > $OUT/train_step_2048_kernel.log
echo "train_step rc=$?"; grep -A4 "^| recipe" $OUT/train_step_2048_kernel.log
grep -A8 "^| kind" $OUT/train_step_2048_kernel.log
timeout 150 python3 benchmarks/compile_time.py --cases step_nvfp4_auto --log-passes --scales-in kernel \
  --out $OUT/compile_passes_kernel.json > $OUT/compile_passes_kernel.log 2>&1
echo "compile_time rc=$?"; tail -4 $OUT/compile_passes_kernel.log
