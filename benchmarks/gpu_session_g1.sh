# GPU session 2026-12-01 (g), call 1: what the last session changed that only the H200
# can show, and why the stochastic-rounding kernel's variants do not follow their work.
# (1) GPU tests: the jitted amax/scale launches, the two-output kernels, the single-output
#     SR kernels (the new threshold-compare sequence below 1), GPU == CPU end to end;
# (2) the NVFP4 step's compile time with each distinct Mosaic kernel lowered once
#     (27 -> 16 kernels), beside BF16's, with the XLA pass breakdown;
# (3) sr_cost.py: the new SR sequence against the previous one, and every variant's PTX,
#     assembled with ptxas and counted (benchmarks/sass_loop_counts.py);
# (4) occupancy probe: the two-output kernels with 1 CTA per SM (4 warps) against the
#     default 2 (8 warps): how much latency hiding the 255-register kernel gets from warps.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin
timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_scale_kernels.py \
  tests/kernels/test_quantize_two_output.py tests/kernels/test_quantize_single.py \
  tests/test_gpu.py -x > $OUT/test_gpu.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/test_gpu.log
timeout 200 python3 benchmarks/compile_time.py --cases step_bf16,step_nvfp4_auto --log-passes \
  --scales-in kernel --out $OUT/compile_time.json > $OUT/compile_time.log 2>&1
echo "compile_time rc=$?"; tail -8 $OUT/compile_time.log
D=/tmp/sass_sr; mkdir -p $D
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$D timeout 200 python3 benchmarks/sr_cost.py \
  --out $OUT/sr_cost.json > $OUT/sr_cost.log 2>&1
echo "sr_cost rc=$?"; tail -16 $OUT/sr_cost.log
# Compile order = sr_cost.VARIANTS order, per shape: list the quantize PTX by time.
for p in $(ls -tr $D/fp4jax_quantize*.ptx); do
  ptxas -arch=sm_90a -v "$p" -o "${p%.ptx}.cubin" 2> "${p%.ptx}.ptxas_v.txt"
  cuobjdump -sass "${p%.ptx}.cubin" > "${p%.ptx}.sass"; rm -f "${p%.ptx}.cubin"
  echo "== $(basename $p) $(grep -o 'Used [0-9]* registers' ${p%.ptx}.ptxas_v.txt)"
  python3 benchmarks/sass_loop_counts.py "${p%.ptx}.sass" --elements-per-thread 64 \
    --split 'ST\.E\.64' | head -4
done > $OUT/sr_cost_sass.txt 2>&1
head -60 $OUT/sr_cost_sass.txt
rm -f $D/*.mlir-passes.log; tar czf $OUT/sr_cost_sass.tgz -C $D .
timeout 120 python3 - > $OUT/occupancy.log 2>&1 <<'PY'
import dataclasses
from pallas_kernels import quantize_two_output as q2
from pallas_kernels.quantize_single import TWO_OUTPUT_CONFIG as C
q2.main(32768, 2048, configs=(C, dataclasses.replace(C, ctas_per_sm=1),
                              dataclasses.replace(C, stages=2)))
PY
echo "occupancy rc=$?"; tail -14 $OUT/occupancy.log
