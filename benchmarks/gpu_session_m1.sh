# Next GPU session, call 1 (written 2026-12-01, eighth session; not yet run; ≤ 9.5 min):
# issue 9 t1/t2: tuning sweeps after the skeleton's role-split pipeline, in-program timer.
# 1. the pipelined kernel's config GPU tests, incl. the new decoded_slots=2 (first GPU run);
# 2. the general kernel's configs at 8192³ (`gemm._sweep`: pipelined depth, tile order,
#    decoded_slots=2 with 3 and 4 stages; the best last);
# 3. the skinny kernel's configs (`gemm_skinny_bench._sweep`: fprop M = 16 and 64, dgrad
#    M = 16, N = K = 8192; dgrad's view now inside the timed program).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 110 python3 -m pytest -q -m gpu tests/kernels/test_gemm_pipelined.py -k "configs" \
  > $L/test_pipelined_configs.log 2>&1
echo "pipelined config GPU tests rc=$?"; tail -3 $L/test_pipelined_configs.log; save
timeout 200 python3 -c "
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm
gemm._sweep(quantize, shapes=[(8192, 8192, 8192)])" > $L/sweep_general.log 2>&1
echo "general sweep rc=$?"; grep "best" $L/sweep_general.log; save
timeout 230 python3 -c "
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm_skinny_bench as b
b._sweep(quantize)" > $L/sweep_skinny.log 2>&1
echo "skinny sweep rc=$?"; tail -30 $L/sweep_skinny.log; save
