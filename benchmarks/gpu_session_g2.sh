# GPU session 2026-12-01 (g), call 2: narrow 64x64 tiles for the two-output quantize kernels.
# Call 1 found the two-output kernels latency-bound: with 1 CTA (4 warps) per SM instead of
# 2 they run 1.54x (SR) and 1.6x (RNE) slower, and at 255 registers per thread no more
# than 2 CTAs fit. The narrow layouts (tma_pipeline.engine_layouts) give each thread 32
# elements instead of 64. (1) bit-exactness on the GPU (default and narrow, odd shapes);
# (2) registers per thread (ptxas -v of the dumped PTX); (3) timing against the default
# at 3 and 4 CTAs per SM, both backward-pass shapes; (4) the GPU tests call 1 ran out of
# time for.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_quantize_two_output.py -x \
  > $OUT/test_two_output_gpu.log 2>&1
echo "two-output gpu tests rc=$?"; tail -3 $OUT/test_two_output_gpu.log
D=/tmp/narrow; mkdir -p $D
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$D timeout 240 python3 - > $OUT/narrow.log 2>&1 <<'PY'
import dataclasses
from pallas_kernels import quantize_two_output as q2
from pallas_kernels.quantize_single import TWO_OUTPUT_CONFIG as C
narrow = [dataclasses.replace(C, block_cols=64, ctas_per_sm=c) for c in (3, 4)]
for k in (2048, 5504):
    q2.main(32768, k, configs=(C, *narrow))
PY
echo "narrow rc=$?"; grep -A16 "fraction of copy" $OUT/narrow.log
for p in $(ls -tr $D/fp4jax_quantize*.ptx); do
  ptxas -arch=sm_90a -v "$p" -o /tmp/k.cubin 2>&1 | grep -o "Used [0-9]* registers.*" | \
    sed "s|^|$(basename $p): |"
done | tee $OUT/narrow_registers.txt
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_quantize_single.py tests/test_gpu.py \
  -x > $OUT/test_gpu_rest.log 2>&1
echo "remaining gpu tests rc=$?"; tail -3 $OUT/test_gpu_rest.log
