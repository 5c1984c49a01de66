# GPU session 2026-12-01 (sixth), call 3: the decoded copies written from the rounded
# values (`bit_tricks.value_nearest` / `value_stochastic` / `values_pair`) instead of
# decoding the codes again (~9 fewer integer ops per element and copy).
# 1. GPU == reference bit for bit: the decoded copies, the two-output kernels at the
#    default tiles (codes), the vmapped kernel; then the GPU == CPU suite.
# 2. The dim-768 step with a trace: before (call 2) 33.14 ms, the dY SR kernel 4.484 ms
#    per step over 28 launches, the X RNE kernel 1.187 ms over 16.
# 3. The two-output kernels alone (codes; hardware casts since call 2).
# Logs go to one tarball (the device tool returns at most 8 files).
export PYTHONPATH=. PYTHONUNBUFFERED=1
L=/tmp/logs; mkdir -p $L
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_quantize_two_output.py \
  -k "decoded or vmapped or (two_output and default)" > $L/test_two_output.log 2>&1
echo "two-output GPU tests rc=$?"; tail -2 $L/test_two_output.log
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu.py -x > $L/test_gpu.log 2>&1
echo "test_gpu rc=$?"; tail -2 $L/test_gpu.log
timeout 150 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --dim 768 --trace /tmp/trace --out $OUT/step768.json > $L/step768.log 2>&1
echo "step rc=$?"; grep -A4 "^| recipe" $L/step768.log; grep -A8 "^| kind" $L/step768.log
grep "fp4jax_" $L/step768.log | head -4
timeout 120 python3 - > $L/two_output.log 2>&1 <<'PY'
from pallas_kernels import quantize_two_output as q2
for k in (2048, 5504):
    q2.main(32768, k)
PY
echo "two-output rc=$?"; grep -A12 "fraction of copy" $L/two_output.log
grep "us " $L/two_output.log | head -16
tar czf $OUT/logs.tgz -C $L .
