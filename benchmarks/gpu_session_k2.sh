# GPU session 2026-12-01 (seventh), call 2 (≤ 9.5 min):
# 1. issue 8 t1's limiter: SASS of the single-output 1D RNE kernel (Mosaic's PTX,
#    assembled with ptxas and disassembled with cuobjdump on the device: Mosaic's own SASS
#    dump cannot spawn nvdisasm there), instructions per element by pipe;
# 2. issue 9 t2: the skinny GEMM vs BF16 at M = 16 and 64 with the in-program timer;
# 3. issue 9 t5: the auto table's rows for 16, 128 and 1024 tokens with the in-program
#    timer (the old rows there were host-bound), the pipelined mainloop now the large
#    default; three runs chained by --keep-rows-of, each module copied to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
FINAL=$OUT; L=/tmp/logs; mkdir -p $L; D=/tmp/sass; mkdir -p $D
save() { tar czf $FINAL/logs.tgz -C $L .; }
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$D timeout 70 \
  python3 benchmarks/profile_kernels.py --cases q_rne > $L/sass_run.log 2>&1
ls $D > $L/sass_files.txt
for p in $D/fp4jax_quantize*.ptx; do
  b=$(basename ${p%.ptx})
  ptxas -arch=sm_90a -v "$p" -o /tmp/$b.cubin 2> $L/$b.ptxas_v.txt
  cuobjdump -sass /tmp/$b.cubin > $L/$b.sass
  python3 benchmarks/sass_loop_counts.py $L/$b.sass --elements-per-thread 64 > $L/$b.counts.txt 2>&1
  echo "== $b"; cat $L/$b.ptxas_v.txt | tail -1; head -30 $L/$b.counts.txt
done; save
timeout 190 python3 -c "from pallas_kernels import gemm_skinny_bench as b; b.main([], ms=(16, 64))" \
  > $L/skinny_bench.log 2>&1
echo "skinny bench rc=$?"; tail -14 $L/skinny_bench.log; save
prev=fp4jax/gemm_table.py
for t in 16 128 1024; do
  timeout 110 python3 benchmarks/gemm_auto_table.py --tokens $t --json $L/table_$t.json \
    --module /tmp/gemm_table_$t.py --keep-rows-of $prev > $L/table_$t.log 2>&1
  rc=$?; echo "table tokens $t rc=$rc"; tail -12 $L/table_$t.log
  if [ $rc = 0 ]; then prev=/tmp/gemm_table_$t.py; cp $prev $FINAL/gemm_table_$t.py.txt; fi
  save
done
