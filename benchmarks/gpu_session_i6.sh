# GPU session 2026-12-01 (sixth), call 4 (run with the device tool's carry=[".whl"]):
# 1. Issue 9 target 2: the skinny (M <= 64) NVFP4 GEMM (`pallas_kernels/gemm_skinny.py`):
#    GPU tests, then its table and config sweep against BF16 jnp.dot, XLA decode + dot
#    and the general kernel.
# 2. Issue 8's peers: one linear layer fwd+bwd at 8192 tokens 8192 -> 8192, fp4jax
#    auto / xla / pallas, jax.nn's nvfp4 scaled_dot_general, qwix 0.1.8's nvfp4 rule
#    (its wheel in .whl), with the bytes saved for the backward pass.
# 3. Compile time: the dim-768 step with the weights' 16x16-tile quantizations on XLA
#    (implementation.XLA_TILED_ELEMENTS = 2**22: 8 instead of 11 distinct Mosaic
#    kernels); the default compiled in 24.4-33.2 s (BF16 10.2-13.4) in calls 1-3.
#    Not kept: the threshold was removed after this call; step 3 runs at commit 16e9d52.
# 4. Issue 9 target 3, second shape: the layer at 8192 tokens 2048 -> 2048.
# Logs: one tarball, rewritten after each step (the tool returns at most 8 files, and
# what a step left survives a later step's time limit).
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
L=/tmp/logs; mkdir -p $L
save() { tar czf $OUT/logs.tgz -C $L .; }
timeout 100 python3 -m pytest -q -m gpu tests/kernels/test_gemm_skinny.py > $L/test_skinny.log 2>&1
echo "skinny GEMM GPU tests rc=$?"; tail -3 $L/test_skinny.log; save
timeout 170 python3 -m pallas_kernels.gemm_skinny_bench --sweep > $L/skinny_bench.log 2>&1
echo "skinny bench rc=$?"; tail -45 $L/skinny_bench.log; save
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
timeout 150 python3 benchmarks/bench_nvfp4.py --skip a,b --out $L > $L/bench_layer.log 2>&1
echo "peers rc=$?"; grep "^| " $L/bench_layer.log; save
timeout 100 python3 - > $L/step768_xla_weights.log 2>&1 <<'PY'
import runpy, sys
from fp4jax import implementation
implementation.XLA_TILED_ELEMENTS = 1 << 22
sys.argv = ["benchmarks/train_step.py", "--recipes", "bf16,nvfp4", "--impls", "auto",
            "--iters", "3", "--dim", "768"]
runpy.run_path("benchmarks/train_step.py", run_name="__main__")
PY
echo "step, weights on XLA rc=$?"; grep -A3 "^| recipe" $L/step768_xla_weights.log | tail -2; save
timeout 60 python3 benchmarks/layer_breakdown.py --d-in 2048 --d-out 2048 \
  --json $L/layer2048.json > $L/layer2048.log 2>&1
echo "layer 2048 rc=$?"; grep "^| " $L/layer2048.log | head -4; save
