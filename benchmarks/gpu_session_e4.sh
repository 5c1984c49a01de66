# GPU session 2026-12-01 (e), call 4: the wgrad's column-packed X decoded through the .mT
# view (a transposing decode) instead of as uint32 column pairs: in the step, XLA fuses
# all layers' pair decodes into two multi-output fusions at ~4x their floor (call 2's trace).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 240 python3 benchmarks/train_step.py --dim 2048 --recipes bf16,nvfp4 --impls auto --iters 3 \
  --column-decode transpose --trace /tmp/st --out $OUT/train_step_2048_transpose.json \
  2>$OUT/train_step_2048_stderr.log > $OUT/train_step_2048_transpose.log
echo "train_step 2048 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_2048_transpose.log
grep -A8 "^| kind" $OUT/train_step_2048_transpose.log
timeout 160 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --column-decode transpose --out $OUT/train_step_768_transpose.json \
  2>$OUT/train_step_768_stderr.log > $OUT/train_step_768_transpose.log
echo "train_step 768 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768_transpose.log
