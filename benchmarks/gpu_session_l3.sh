# GPU session 2026-12-01 (eighth), call 3 (≤ 9.5 min): issue 9 t1 after the skeleton's
# role-split pipeline (`gemm_skeleton.role_pipeline`: setmaxnreg once per role, separate
# tile loops), which on the CPU host's ptxas removes the C7512 wgmma serialization that
# call 1's profile and call 2's PTX showed.
# 1. the 8192³ pipelined kernel's PTX through ptxas (-v: C75xx notes) and its SASS's wgmma
#    waits (DEPBAR gsb0 0x0 = serialized, 0x1 = one group in flight);
# 2. the mainloop table (BF16, XLA, serial, pipelined; 4096³ and 8192³, three layouts;
#    bit-for-bit check on exact-sum data);
# 3. the GPU tests of the three GEMM kernels (the skeleton changed under all of them).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
FINAL=$OUT; L=/tmp/logs; mkdir -p $L; D=/tmp/ptx; mkdir -p $D
save() { tar czf $FINAL/logs.tgz -C $L .; }
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$D timeout 90 \
  python3 benchmarks/profile_kernels.py --cases gemm_pallas,gemm_skinny > $L/ptx_run.log 2>&1
echo "ptx run rc=$?"
for p in $D/fp4jax_gemm*.ptx; do
  b=$(basename ${p%.ptx}); gzip -c $p > $L/$b.ptx.gz
  ptxas -arch=sm_90a -v "$p" -o /tmp/$b.cubin > $L/$b.ptxas_stderr.txt 2>&1
  cuobjdump -sass /tmp/$b.cubin > /tmp/$b.sass
  echo "== $b: $(grep -h 'C75\|Used' $L/$b.ptxas_stderr.txt | tr '\n' ' ')"
  echo "   HGMMA $(grep -c HGMMA /tmp/$b.sass), DEPBAR gsb0 0x0: $(grep -c 'DEPBAR.LE gsb0, 0x0' /tmp/$b.sass), 0x1: $(grep -c 'DEPBAR.LE gsb0, 0x1' /tmp/$b.sass)"
done; save
timeout 200 python3 -m pallas_kernels.gemm --mainloops > $L/mainloops.log 2>&1
echo "mainloops rc=$?"; grep -A12 "^Mainloops" $L/mainloops.log; grep -i "failed\|error" $L/mainloops.log | head -4; save
timeout 230 python3 -m pytest -q -m gpu tests/kernels/test_gemm_pipelined.py \
  tests/kernels/test_gemm_skinny.py tests/kernels/test_gemm.py > $L/test_gemm_gpu.log 2>&1
echo "GEMM GPU tests rc=$?"; tail -4 $L/test_gemm_gpu.log; save
