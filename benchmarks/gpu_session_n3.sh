# Next GPU session, call 3 (written 2026-12-01, ninth session; not yet run; <= 9.5 min):
# issue 12, pure_llama at LR 1e-3 (8 seeds; seeds 0-2 of bf16/paper/python adopted from the
# noise pilot): seeds 3-7 of BF16 and of the paper recipe, python corpus, each variant's
# five seeds as one vmapped program (`--seed-batch 5`; a batch has no checkpoint and is
# not started unless the time measured for a comparable batch fits what is left).
# Afterwards, here: python studies/validation.py unpack pure_llama --from FILES_AT; report.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 560 python3 studies/validation.py run pure_llama --budget-s 540 --seed-batch 5 \
  --variants bf16,paper --corpora python --seeds 3,4,5,6,7 --handoff /tmp/hand \
  --compile-cache none --progress > $OUT/study.log 2>&1
echo "study rc=$?"; grep -E "seed batch|finished|stopping|Error" $OUT/study.log
cp /tmp/hand/results-* $OUT/ 2>/dev/null; ls $OUT
