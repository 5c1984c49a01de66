# GPU session: why the examples' step measured 61 ms where train_step.py measured 25 ms
# (BF16, dim 768, 64x512 tokens), and the step and loop after the one-hot embedding
# lookup. Logs to $OUT. One part per call (each fits a 10-minute command):
#   bash benchmarks/gpu_step_gap.sh 1   # the cause: embedding backward and BF16 step by lookup x tokens (~3 min)
#   bash benchmarks/gpu_step_gap.sh 2   # train_step.py, BF16 vs NVFP4, corpus and random tokens (~4 min)
#   bash benchmarks/gpu_step_gap.sh 3   # train_loop.py: the loop vs its jitted step (~5 min)
#   bash benchmarks/gpu_step_gap.sh 4   # train_step.py on the wider model, dim 2048 (~6 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "$1" in
1)
  # The scatter-add's atomics as PTX (atom.*.cas = compare-and-swap retry loop, atom/red .add = native).
  XLA_FLAGS="--xla_dump_to=/tmp/embed_dump" timeout 240 python3 benchmarks/embed_backward.py \
    --out $OUT/embed_backward.json 2>$OUT/embed_backward_stderr.log | tee $OUT/embed_backward.log
  echo "atomics in the dumped PTX:"; grep -ho "\(atom\|red\)\.[a-z0-9.]*" /tmp/embed_dump/*.ptx | sort | uniq -c
  rm -rf /tmp/embed_dump
  timeout 400 python3 benchmarks/train_step.py --recipes bf16 --embed gather,onehot --tokens corpus,random \
    --out $OUT/step_lookup_ab.json 2>$OUT/step_lookup_ab_stderr.log | tee $OUT/step_lookup_ab.log ;;
2)
  timeout 560 python3 benchmarks/train_step.py --tokens corpus,random --out $OUT/train_step.json \
    2>$OUT/train_step_stderr.log | tee $OUT/train_step.log ;;
3)
  timeout 560 python3 benchmarks/train_loop.py --repeats 2 --steps 60 --no-breakdown \
    --out $OUT/train_loop.json 2>$OUT/train_loop_stderr.log | tee $OUT/train_loop.log ;;
4)
  timeout 580 python3 benchmarks/train_step.py --dim 2048 --out $OUT/train_step_2048.json \
    2>$OUT/train_step_2048_stderr.log | tee $OUT/train_step_2048.log ;;
*) echo "usage: bash benchmarks/gpu_step_gap.sh 1|2|3|4"; exit 2 ;;
esac
