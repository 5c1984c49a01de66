# GPU session 2026-12-01 (eighth), call 2 (≤ 6 min):
# 1. issue 9 t1: the pipelined GEMM's PTX and ptxas's report. Call 1's per-instruction
#    sampling shows a `WARPGROUP.DEPBAR.LE gsb0, 0x0` after every HGMMA (ptxas serialized
#    the wgmma pipeline, so the decode never overlaps the MMA); the PTX comes back so that
#    ptxas's reason can be found and tested on the CPU host (ptxas and cuobjdump are there).
# 2. issue 9 t5: the dgrad table rows call 1 did not reach (128 tokens 2048x8192 and
#    8192x2048; 1024 tokens), dgrad's W.mT inside the timed program.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
FINAL=$OUT; L=/tmp/logs; mkdir -p $L; D=/tmp/ptx; mkdir -p $D
save() { tar czf $FINAL/logs.tgz -C $L .; }
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=$D timeout 100 \
  python3 benchmarks/profile_kernels.py --cases gemm_pallas,gemm_skinny > $L/ptx_run.log 2>&1
echo "ptx run rc=$?"; ls $D | grep -v mlir-passes > $L/ptx_files.txt
for p in $D/fp4jax_gemm*.ptx; do
  b=$(basename ${p%.ptx}); cp $p $L/
  ptxas -arch=sm_90a -v -warn-spills -warn-lmem-usage "$p" -o /tmp/$b.cubin > $L/$b.ptxas_stderr.txt 2>&1
  echo "== $b"; cat $L/$b.ptxas_stderr.txt
  cp $D/$b.ptxas $L/ 2>/dev/null
done; save
timeout 200 python3 benchmarks/gemm_auto_table.py --layouts dgrad --tokens 128 \
  --widths 2048x8192,8192x2048 --keep-rows-of fp4jax/gemm_table.py --json $L/table_128.json \
  --module /tmp/gemm_table_128.py > $L/table_128.log 2>&1
echo "table 128 rc=$?"; tail -4 $L/table_128.log; cp /tmp/gemm_table_128.py $L/ 2>/dev/null; save
prev=/tmp/gemm_table_128.py; [ -f $prev ] || prev=fp4jax/gemm_table.py
timeout 150 python3 benchmarks/gemm_auto_table.py --layouts dgrad --tokens 1024 \
  --keep-rows-of $prev --json $L/table_1024.json --module $L/gemm_table_1024.py \
  > $L/table_1024.log 2>&1
echo "table 1024 rc=$?"; tail -6 $L/table_1024.log; save
