# GPU session 2026-12-01 (f), call 5: column-pair decodes with a full-shape iota shift
# (no small shift array shared by every layer's decode, which made XLA merge all wgrad
# decodes into one multi-output fusion): the dim-768 and dim-2048 steps, traced.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --trace /tmp/st768 --hlo $OUT --out $OUT/train_step_768.json \
  2>$OUT/train_step_768_stderr.log > $OUT/train_step_768.log
echo "train_step 768 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768.log
timeout 260 python3 benchmarks/train_step.py --dim 2048 --recipes bf16,nvfp4 --impls auto --iters 3 \
  --trace /tmp/st2048 --out $OUT/train_step_2048.json \
  2>$OUT/train_step_2048_stderr.log > $OUT/train_step_2048.log
echo "train_step 2048 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_2048.log
rm -f $OUT/bf16_*.hlo.gz
