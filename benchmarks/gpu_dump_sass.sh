# Dumps ptxas -v (registers, spills) and SASS of each Mosaic GPU kernel case, one process
# per case (so each dump folder holds one case's kernels). The MOSAIC_GPU_DUMP_* variables
# are Mosaic's own debugging switches, set for these processes only. Logs to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:$(dirname $(ls /usr/local/cuda*/bin/nvdisasm 2>/dev/null | head -1) 2>/dev/null)
which nvdisasm
for c in ${CASES:-q_rne q_sr q2_rne q2_sr}; do
  mkdir -p $OUT/$c
  MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=$OUT/$c timeout 200 \
    python3 benchmarks/profile_kernels.py --cases $c > $OUT/$c/log.txt 2>&1 &
done
wait
for c in ${CASES:-q_rne q_sr q2_rne q2_sr}; do
  rm -f $OUT/$c/*.mlir-passes.log $OUT/$c/*.ptx
  echo "== $c"; grep -h "Used\|spill" $OUT/$c/*.ptxas
done
