# GPU session 2026-12-01 (fifth), last call: the training step (dim 768 and 2048, default
# XLA flags) with fewer distinct Mosaic GPU kernels per step (compile time), then study
# units of issue 12 with the time left.
export PYTHONPATH=. PYTHONUNBUFFERED=1
for dim in 768 2048; do
  timeout 150 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
    --dim $dim --out $OUT/step$dim.json 2>$OUT/step${dim}_stderr.log > $OUT/step$dim.log
  echo "step $dim rc=$?"; grep -A4 "^| recipe" $OUT/step$dim.log
done
timeout 290 python3 studies/validation.py run pure_llama --budget-s 270 --variants no_rht \
  --corpora python --seeds 1,2 --handoff /tmp/hand --compile-cache none --progress \
  > $OUT/study.log 2>&1
echo "study rc=$?"; tail -5 $OUT/study.log; cp /tmp/hand/results-* $OUT/ 2>/dev/null; ls $OUT
