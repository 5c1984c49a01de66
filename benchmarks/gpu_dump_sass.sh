# Dumps ptxas -v and SASS of the Mosaic GPU kernels (register counts, spills, instruction
# mix, read offline). The MOSAIC_GPU_DUMP_* variables are Mosaic's own debugging switches,
# set for this one process only. Logs to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/dump
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=$OUT/dump timeout 200 \
  python3 benchmarks/profile_kernels.py --cases ${CASES:-amax,q_rne,q_sr,q2_rne,q2_sr,gemm_pallas} \
  > $OUT/dump_sass.log 2>&1; echo "dump rc=$?"
ls -la $OUT/dump | head -30; grep -h -i "registers\|spill" $OUT/dump/* $OUT/dump_sass.log 2>/dev/null | head -20
