# GPU session 2026-12-01 (seventh), call 1 (≤ 9.5 min):
# 1. the in-program timer on the GPU (tests/kernels/test_timing.py, seconds);
# 2. the pipelined GEMM mainloop (issue 9 t1): its GPU tests, ptxas report and SASS per pipe
#    (registers, spills, serialized wgmmas);
# 3. the mainloop table: BF16, XLA, serial, pipelined at 4096³/8192³, three layouts, bits;
# 4. issue 8 t1's limiter: the single-output 1D RNE kernel's SASS, instructions per
#    element by pipe (Nsight Compute segfaults on this kernel).
# The device tool returns at most 8 files: logs under /tmp, one tarball rewritten per step.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:$(dirname $(ls /usr/local/cuda*/bin/nvdisasm 2>/dev/null | head -1) 2>/dev/null)
FINAL=$OUT; L=/tmp/logs; mkdir -p $L/dump
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 60 python3 -m pytest -q -m gpu tests/kernels/test_timing.py > $L/test_timing.log 2>&1
echo "timing GPU test rc=$?"; tail -2 $L/test_timing.log
timeout 170 python3 -m pytest -q -m gpu -x tests/kernels/test_gemm_pipelined.py \
  > $L/test_pipelined.log 2>&1
echo "pipelined GPU tests rc=$?"; tail -3 $L/test_pipelined.log; save
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=$L/dump timeout 80 \
  python3 - > $L/dump.log 2>&1 <<'PY'
import jax.numpy as jnp
from pallas_kernels import gemm
from pallas_kernels.gemm_config import PIPELINED_CONFIG
from tests.kernels.nvfp4_bits import layout_operands
for layout in ("fprop", "dgrad", "wgrad"):
    lhs, rhs, kw = layout_operands(layout, 1024, 1024, 1024)
    out = gemm.matmul(lhs, rhs, config=PIPELINED_CONFIG, preferred_element_type=jnp.bfloat16, **kw)
    print(layout, out.block_until_ready().shape)
PY
echo "dump rc=$?"; rm -f $L/dump/*.mlir-passes.log $L/dump/*.ptx; ls $L/dump | head
grep -H "Used\|spill\|serializ" $L/dump/*.ptxas | head -12
for s in $L/dump/*.sass; do
  python3 benchmarks/sass_loop_counts.py $s --elements-per-thread 192 > $s.counts 2>&1
  echo "== $s"; head -14 $s.counts
done; save
timeout 190 python3 -m pallas_kernels.gemm --mainloops > $L/mainloops.log 2>&1
echo "mainloops rc=$?"; grep -A12 "^Mainloops" $L/mainloops.log; grep failed $L/mainloops.log | head -4; save
mkdir -p /tmp/sass; OUT=/tmp/sass CASES="q_rne" timeout 90 bash benchmarks/gpu_dump_sass.sh \
  > $L/sass_dump.log 2>&1
ls -R /tmp/sass > $L/sass_files.txt
for s in /tmp/sass/q_rne/*.sass; do
  python3 benchmarks/sass_loop_counts.py $s --elements-per-thread 64 > $L/sass_q_rne_$(basename $s).txt 2>&1
  echo "== $s"; head -24 $L/sass_q_rne_$(basename $s).txt
done
cp /tmp/sass/q_rne/*.sass $L/ 2>/dev/null; save
