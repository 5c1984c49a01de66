# The pipelined NVFP4 GEMM mainloop (issue 9 target 1; pallas_kernels/gemm_pipelined.py,
# TuningConfig.mainloop="pipelined"), first GPU call:
# 1. correctness: its GPU tests (every layout, bitwise on exact-sum data, BF16 output,
#    split K, batch dims);
# 2. the ptxas report and SASS of the kernel in the three layouts: registers, spills, and
#    whether ptxas serialized the wgmmas (the decode of one substep should overlap the
#    previous substep's wgmma), and the main loop's instructions by pipe
#    (benchmarks/sass_loop_counts.py; 192 elements per thread and loop iteration: two
#    substeps of 16 lhs + 32 rhs pairs).
# The timing table is a separate call: python3 -m pallas_kernels.gemm --mainloops
# (add --sweep for the config sweep first). Logs to $OUT.
# The device tool returns at most 8 files from $OUT: the logs and dumps are written under
# /tmp and packed into one tarball at the end.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:$(dirname $(ls /usr/local/cuda*/bin/nvdisasm 2>/dev/null | head -1) 2>/dev/null)
FINAL=${OUT:-/tmp}
OUT=/tmp/pipelined
mkdir -p $OUT/dump
timeout 330 python3 -m pytest -q -m gpu tests/kernels/test_gemm_pipelined.py \
  > $OUT/test_pipelined.log 2>&1
echo "pipelined GPU tests rc=$?"; tail -3 $OUT/test_pipelined.log
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=$OUT/dump timeout 150 \
  python3 - > $OUT/dump.log 2>&1 <<'PY'
import jax.numpy as jnp
from pallas_kernels import gemm
from pallas_kernels.gemm_config import PIPELINED_CONFIG
from tests.kernels.nvfp4_bits import layout_operands
for layout in ("fprop", "dgrad", "wgrad"):
    lhs, rhs, kw = layout_operands(layout, 1024, 1024, 1024)
    out = gemm.matmul(lhs, rhs, config=PIPELINED_CONFIG, preferred_element_type=jnp.bfloat16, **kw)
    print(layout, out.block_until_ready().shape)
PY
echo "dump rc=$?"; rm -f $OUT/dump/*.mlir-passes.log
grep -H "Used\|spill\|serializ" $OUT/dump/*pipelined*.ptxas
for s in $OUT/dump/*pipelined*.sass; do
  python3 benchmarks/sass_loop_counts.py $s --elements-per-thread 192 > $s.counts 2>&1
  echo "== $s"; head -14 $s.counts
done
tar czf $FINAL/pipelined.tgz -C $OUT .
