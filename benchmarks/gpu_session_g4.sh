# GPU session 2026-12-01 (g), call 4: (1) the dim-768 step after the SR keys are derived
# with O(1) threefry hashes (the program 30% smaller: fp4jax.keys.layer_keys, the step
# scope's key table), compile time and step time, traced; (2) the validation study's
# Trainer.for_run on the H200 (seeds of a variant share one compiled step): two more
# pure_llama units, all_nvfp4 seeds 1 and 2.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 170 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --trace /tmp/st768 --out $OUT/train_step_768.json \
  2>$OUT/train_step_768_stderr.log > $OUT/train_step_768.log
echo "train_step 768 rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768.log
mkdir -p /tmp/hand
python3 studies/validation.py run pure_llama --budget-s 300 --variants all_nvfp4 \
  --corpora python --seeds 1,2 --handoff /tmp/hand --compile-cache none --progress \
  > $OUT/study.log 2>&1
echo "study rc=$?"; tail -12 $OUT/study.log
ls -la /tmp/hand; cp /tmp/hand/results-* /tmp/hand/partial-* $OUT/ 2>/dev/null; ls $OUT
