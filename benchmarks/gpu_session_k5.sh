# GPU session 2026-12-01 (seventh), call 5 (≤ 4.5 min, the session's last device minutes):
# 1. the GEMM kernels after their shared skeleton was factored out (serial, pipelined,
#    skinny): the GPU tests bitwise on exact-sum data;
# 2. issue 9 t2 with dgrad's W.mT taken inside the timed program (as in the step): the
#    skinny bench at N = K = 8192, M = 16 and 64;
# 3. two dgrad rows of the auto table, the same way (16 tokens, 2048² and 8192²).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 100 python3 -m pytest -q -m gpu tests/kernels/test_gemm.py tests/kernels/test_gemm_pipelined.py \
  tests/kernels/test_gemm_skinny.py -k "bitwise" > $L/test_gemm_bitwise.log 2>&1
echo "GEMM bitwise GPU tests rc=$?"; tail -2 $L/test_gemm_bitwise.log; save
timeout 130 python3 -c "from pallas_kernels import gemm_skinny_bench as b; b.main([], sizes=(8192,), ms=(16, 64))" \
  > $L/skinny_bench.log 2>&1
echo "skinny bench rc=$?"; tail -7 $L/skinny_bench.log; save
timeout 50 python3 benchmarks/gemm_auto_table.py --tokens 16 --widths 2048x2048,8192x8192 --layouts dgrad \
  --json $L/table_dgrad.json > $L/table_dgrad.log 2>&1
echo "table rc=$?"; grep dgrad $L/table_dgrad.log; save
