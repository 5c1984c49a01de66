# GPU session 2026-12-01 (f), call 3: PTX of the two-output quantize kernels (RNE, SR),
# assembled here with ptxas and disassembled with cuobjdump (Mosaic's own SASS dump
# cannot spawn nvdisasm on this machine); one tarball back.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
D=/tmp/sass; mkdir -p $D
for c in q2_rne q2_sr; do
  mkdir -p $D/$c
  MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$D/$c timeout 200 \
    python3 benchmarks/profile_kernels.py --cases $c > $D/$c/log.txt 2>&1 &
done
wait
for p in $D/*/fp4jax_quantize*.ptx; do
  ptxas -arch=sm_90a -v "$p" -o "${p%.ptx}.cubin" 2> "${p%.ptx}.ptxas_v.txt"
  cuobjdump -sass "${p%.ptx}.cubin" > "${p%.ptx}.sass"
  rm -f "${p%.ptx}.cubin"
  echo "$p: $(grep -c '^ *\/\*[0-9a-f]*\*\/' ${p%.ptx}.sass) SASS lines"; cat "${p%.ptx}.ptxas_v.txt"
done
rm -f $D/*/*.mlir-passes.log
tar czf $OUT/sass.tgz -C $D .
