# GPU session 2026-12-01 (f), call 2: SASS and ptxas reports of the two-output quantize
# kernels (RNE and SR), to count instructions per element; one tarball back.
export PYTHONPATH=. PYTHONUNBUFFERED=1
D=/tmp/sass; mkdir -p $D
CASES="q2_rne q2_sr" OUT=$D bash benchmarks/gpu_dump_sass.sh > $OUT/dump.log 2>&1
ls -la $D/* | head -40 >> $OUT/dump.log
tar czf $OUT/sass.tgz -C $D .
cat $OUT/dump.log | tail -20
