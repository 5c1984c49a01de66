# Next GPU session, call 1 (written 2026-12-01, not yet run): the narrow two-output
# kernels' grid. With 64x64 tiles the training step's SR kernel (amax from the pass) uses
# 124-140 registers per thread (call g2), so 3 CTAs of 128 threads fit an SM; the default
# launches 4 per SM, so a quarter of the persistent CTAs run after the others, one per
# SM. Sweep CTAs per SM and pipeline stages for both roundings at both backward-pass
# shapes, with the registers of each kernel (ptxas -v of the dumped PTX).
export PYTHONPATH=. PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin
D=/tmp/grid; mkdir -p $D
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$D timeout 330 python3 - > $OUT/grid.log 2>&1 <<'PY'
import dataclasses
from pallas_kernels import quantize_two_output as q2
from pallas_kernels.quantize_single import TWO_OUTPUT_CONFIG as C
configs = [dataclasses.replace(C, ctas_per_sm=c, stages=s)
           for c, s in ((3, 3), (4, 3), (6, 3), (8, 2), (6, 2), (3, 4))]
for k in (2048, 5504):
    q2.main(32768, k, configs=configs)
PY
echo "grid rc=$?"; grep -A22 "fraction of copy" $OUT/grid.log
for p in $(ls -tr $D/fp4jax_quantize*.ptx); do
  ptxas -arch=sm_90a -v "$p" -o /tmp/k.cubin 2>&1 | grep -o "Used [0-9]* registers" | \
    sed "s|^|$(basename $p): |"
done | tee $OUT/grid_registers.txt
# The single-output kernels on narrow tiles: GPU == CPU bit for bit.
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_quantize_single.py -k narrow -x \
  > $OUT/test_narrow_single.log 2>&1
echo "narrow single-output tests rc=$?"; tail -2 $OUT/test_narrow_single.log
