# GPU session 2026-12-01 (seventh), call 3 (≤ 8.5 min):
# 1. issue 9 t1's limiter: Nsight Compute of the 8192³ GEMM, the pipelined mainloop (now
#    the large default) and the BF16 jnp.dot (tensor pipe, issue slots, warp stalls);
# 2. the two-output launches' amax pass in XLA (`QuantizeConfig.xla_rht_amax`): GPU bits
#    against the kernel, then the dim-768 step with the kernel and with XLA's pass (before:
#    32.26 ms, the 44 RHT amax launches 1.413 ms per step).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
NCU="ncu --clock-control none --profile-from-start off"
timeout 150 $NCU --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats --section Occupancy \
  --section SchedulerStats --csv --page details --log-file $L/ncu_gemm.csv \
  python3 benchmarks/profile_kernels.py --cases gemm_pallas,gemm_bf16 > $L/ncu_gemm.log 2>&1
echo "ncu gemm rc=$?"; grep -i "tensor\|Issue Slots Busy\|Duration\|Registers" $L/ncu_gemm.csv | cut -c1-220 | head -20; save
timeout 60 python3 - > $L/amax_gpu.log 2>&1 <<'PY'
import jax, numpy as np
from pallas_kernels import amax, quantize_single as qs
from tests.kernels.nvfp4_bits import data
for shape in ((32768, 768), (32768, 2048)):
    x = data(shape, seed=1)
    k = amax.run_amax(x, True, None, qs.TWO_OUTPUT_CONFIG, False)
    xl = jax.jit(amax.xla_amax_pass, static_argnums=1)(x, None)
    same = all(np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
               for (a, _), (b, _) in zip(k, xl))
    print(shape, "GPU kernel == XLA amax pass:", same)
PY
echo "amax GPU rc=$?"; tail -3 $L/amax_gpu.log; save
for v in kernel xla; do
  timeout 150 python3 - $v > $L/step768_amax_$v.log 2>&1 <<'PY'
import dataclasses, runpy, sys
from pallas_kernels import quantize_two_output as q2
if sys.argv[1] == "xla":  # the name quantize_rowwise_columnwise reads for config=None
    q2.TWO_OUTPUT_CONFIG = dataclasses.replace(q2.TWO_OUTPUT_CONFIG, xla_rht_amax=True)
sys.argv = ["benchmarks/train_step.py", "--recipes", "nvfp4", "--impls", "auto",
            "--iters", "3", "--dim", "768", "--trace", f"/tmp/trace_{sys.argv[1]}"]
runpy.run_path("benchmarks/train_step.py", run_name="__main__")
PY
  echo "step, amax pass $v rc=$?"; grep -A3 "^| recipe" $L/step768_amax_$v.log | tail -1
  grep -A8 "^| kind" $L/step768_amax_$v.log | tail -6; grep "fp4jax_" $L/step768_amax_$v.log | head -5; save
done
