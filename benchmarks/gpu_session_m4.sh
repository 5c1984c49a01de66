# GPU session 2026-12-01 (ninth), call 4 (the session's last ~7 min): issue 12's noise
# pilot, first GPU run of seed batches: `noise_pilot` (pure_llama dim 256 at half its LR,
# python corpus, 10 tokens/param), BF16 then the paper recipe, 3 seeds as one vmapped
# program each, as far as the budget goes (a batch that does not fit is not started).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 380 python3 studies/validation.py run noise_pilot --budget-s 360 --seed-batch 3 \
  --variants bf16,paper --corpora python --handoff /tmp/hand \
  --compile-cache none --progress > $OUT/study.log 2>&1
echo "study rc=$?"; grep -E "seed batch|finished|stopping|Error" $OUT/study.log
cp /tmp/hand/results-* $OUT/ 2>/dev/null; ls $OUT
