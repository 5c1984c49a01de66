# GPU session 2026-11-30b, final call: the layer breakdown after the bitcast decode, the
# BF16 step with the old gather embedding (the cause of the 61 vs 25 ms gap), and the train
# step BF16 vs NVFP4 (impl=auto) with the examples' Trainer and the one-hot embedding, on
# corpus tokens. Logs and JSON to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/layer_breakdown.py --iters 10 --json $OUT/layer_breakdown.json \
  --trace /tmp/t > $OUT/layer_breakdown.log 2>&1; echo "breakdown rc=$?"; head -14 $OUT/layer_breakdown.log | tail -11
timeout 90 python3 benchmarks/train_step.py --tokens corpus --recipes bf16 --embed gather \
  --out $OUT/train_step_gather.json 2>$OUT/train_step_gather_stderr.log | tail -4
timeout 330 python3 benchmarks/train_step.py --tokens corpus --recipes bf16,nvfp4 --embed onehot \
  --out $OUT/train_step.json 2>$OUT/train_step_stderr.log | tee $OUT/train_step.log | tail -6
