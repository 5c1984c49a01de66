# Next GPU session, call 1 (written 2026-12-01, sixth session; not yet run).
# 1. The two-output launches' amax pass in XLA (`QuantizeConfig.xla_rht_amax`): GPU ==
#    kernel bits, then the dim-768 step with it (trace: do XLA's reductions join the
#    fusions that produce X and dY?). Before (6th session call 3): 32.26 ms, the 44 RHT
#    amax launches 1.413 ms per step.
# 2. Issue 8 target 1's limiter: the single-output 1D RNE kernel's SASS, ALU
#    instructions per element (ncu crashes on this kernel).
# Logs: one tarball, rewritten after each step.
export PYTHONPATH=. PYTHONUNBUFFERED=1
L=/tmp/logs; mkdir -p $L
save() { tar czf $OUT/logs.tgz -C $L .; }
timeout 120 python3 -m pytest -q tests/kernels/test_quantize_two_output.py -k amax_pass \
  > $L/test_amax_pass.log 2>&1
echo "amax pass tests (GPU: interpret=True cases run compiled?) rc=$?"; tail -2 $L/test_amax_pass.log
timeout 60 python3 - > $L/amax_gpu.log 2>&1 <<'PY'
import jax, jax.numpy as jnp, numpy as np
from pallas_kernels import amax, quantize_single as qs
from tests.kernels.nvfp4_bits import data
for shape in ((32768, 768), (32768, 2048)):
    x = data(shape, seed=1)
    k = amax.run_amax(x, True, None, qs.TWO_OUTPUT_CONFIG, False)
    xl = jax.jit(amax.xla_amax_pass, static_argnums=1)(x, None)
    same = all(np.asarray(a).view(np.uint32) == np.asarray(b).view(np.uint32)
               for (a, _), (b, _) in zip(k, xl))
    print(shape, "GPU kernel == XLA amax pass:", same)
PY
echo "amax GPU rc=$?"; cat $L/amax_gpu.log | tail -2; save
for v in kernel xla; do
  timeout 150 python3 - $v > $L/step768_amax_$v.log 2>&1 <<'PY'
import dataclasses, runpy, sys
from pallas_kernels import quantize_two_output as q2
if sys.argv[1] == "xla":
    q2.TWO_OUTPUT_CONFIG = dataclasses.replace(q2.TWO_OUTPUT_CONFIG, xla_rht_amax=True)
sys.argv = ["benchmarks/train_step.py", "--recipes", "nvfp4", "--impls", "auto",
            "--iters", "3", "--dim", "768", "--trace", f"/tmp/trace_{sys.argv[1]}"]
runpy.run_path("benchmarks/train_step.py", run_name="__main__")
PY
  echo "step, amax pass $v rc=$?"; grep -A3 "^| recipe" $L/step768_amax_$v.log | tail -1
  grep -A8 "^| kind" $L/step768_amax_$v.log | tail -6; save
done
mkdir -p /tmp/sass; OUT_SAVE=$OUT; OUT=/tmp/sass CASES="q_rne" \
  timeout 120 bash benchmarks/gpu_dump_sass.sh > $L/sass_dump.log 2>&1; OUT=$OUT_SAVE
ls -R /tmp/sass | head -20 > $L/sass_files.txt
s=$(ls /tmp/sass/q_rne/*.sass 2>/dev/null | grep -i quantize | head -1)
python3 benchmarks/sass_loop_counts.py $s --elements-per-thread 64 > $L/sass_q_rne.txt 2>&1
echo "sass q_rne: $s"; head -30 $L/sass_q_rne.txt; save
