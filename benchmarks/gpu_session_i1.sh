# Next GPU session, call 1 (written 2026-12-01, fifth session; not yet run): verify and time
# what the fifth session committed untimed.
# 1. Decoded operands (the two-output kernel writes X rowwise and both copies of dY as BF16
#    code * scale for XLA's GEMMs): GPU == reference bit for bit, and the vmapped kernel
#    (seed batches); then the GPU == CPU suite (it runs impl="auto" layers).
# 2. The step (dim 768 and 2048): before, 35.00 / 119.13 ms (1.47x / 1.23x BF16, call 6 of
#    the fifth session). If a test fails or the step is slower: revert the decoded path
#    (quantized_dot asks for it through implementation.auto_gemm_runs_xla).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_quantize_two_output.py \
  -k "decoded or vmapped" > $OUT/test_decoded.log 2>&1
echo "decoded/vmapped kernel tests rc=$?"; tail -2 $OUT/test_decoded.log
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -x > $OUT/test_gpu.log 2>&1
echo "test_gpu rc=$?"; tail -2 $OUT/test_gpu.log
for dim in 768 2048; do
  timeout 150 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
    --dim $dim --out $OUT/step$dim.json 2>$OUT/step${dim}_stderr.log > $OUT/step$dim.log
  echo "step $dim rc=$?"; grep -A4 "^| recipe" $OUT/step$dim.log
done
# One linear layer fwd+bwd (8192 tokens, 8192 -> 8192): 5.995 vs 4.786 ms BF16 (1.25x) when
# last measured (docs/BENCHMARKS.md); the decoded copies remove three of its XLA decodes.
timeout 90 python3 benchmarks/layer_breakdown.py --json $OUT/layer8192.json > $OUT/layer8192.log 2>&1
echo "layer rc=$?"; tail -14 $OUT/layer8192.log
