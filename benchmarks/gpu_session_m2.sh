# GPU session 2026-12-01 (ninth), call 2 (≤ 9.5 min): issue 9 t1/t2 after call 1's sweeps.
# The defaults now take the sweep's winners: PIPELINED_CONFIG with decoded_slots=2 (1.05×
# at 8192³ fprop) and, for M <= 16, skinny 256-wide K steps in two substeps, 4 deep (1.27×
# at 16×8192²). Before any speed figure, every GEMM GPU test under the new defaults.
# 1. the GEMM GPU tests (pipelined, skinny, general kernel);
# 2. the mainloop table (`--mainloops`, views inside the timed program);
# 3. the skinny table at N = K = 8192, M = 16 and 64 (fprop, dgrad), as called and alone.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 230 python3 -m pytest -q -m gpu tests/kernels/test_gemm_pipelined.py \
  tests/kernels/test_gemm_skinny.py tests/kernels/test_gemm.py > $L/test_gemm_gpu.log 2>&1
echo "GEMM GPU tests rc=$?"; tail -4 $L/test_gemm_gpu.log; save
timeout 170 python3 -m pallas_kernels.gemm --mainloops > $L/mainloops.log 2>&1
echo "mainloops rc=$?"; grep -A10 "^Mainloops" $L/mainloops.log; save
timeout 130 python3 -c "from pallas_kernels import gemm_skinny_bench as b; b.main([], sizes=(8192,), ms=(16, 64))" \
  > $L/skinny.log 2>&1
echo "skinny rc=$?"; tail -12 $L/skinny.log; save
