# Next GPU session, call 1 (written 2026-12-01, eighth session; not yet run; ≤ 9.5 min):
# issue 9 t1/t2: the tuning sweep after the skeleton's role-split pipeline
# (`pallas_kernels.gemm._sweep`, in-program timer): the pipelined mainloop's depth and
# tile order at 8192³, the skinny kernel's K step, depth, split and substeps at 16 and 64
# tokens; the pipelined kernel's new decoded_slots=2 option, its GPU tests first. Each
# line is printed as it is measured, the best per shape last.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_gemm_pipelined.py -k "configs" \
  > $L/test_pipelined_configs.log 2>&1  # incl. decoded_slots=2 (first GPU run)
echo "pipelined config GPU tests rc=$?"; tail -3 $L/test_pipelined_configs.log; save
# (the M = 64 shape: a second call, `64, 8192, 8192` in place of these two)
for shape in "(8192, 8192, 8192)" "(16, 8192, 8192)"; do
  timeout 200 python3 -c "
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm
gemm._sweep(quantize, shapes=[$shape])" >> $L/sweep.log 2>&1
  echo "sweep $shape rc=$?"; grep "best" $L/sweep.log | tail -1; save
done
