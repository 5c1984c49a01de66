# Eleventh session, call 4 (ran; <= 9.5 min): issue 12, pure_llama python corpus, seeds 0-3
# of the paper recipe with the BF16 forward tail and of 4/6 block scaling (paper blocks),
# each variant's four seeds as one vmapped program. It lost its results: the 4/6 batch,
# never timed, was started with ~240 s left and the timeout killed the call before the
# handoff was written (log: benchmarks/results/2026-12-01-h200o/call4_study.log); fixed
# since by estimating untimed batches and handing off after each batch.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 560 python3 studies/validation.py run pure_llama --budget-s 530 --seed-batch 4 \
  --variants paper_tail,four_over_six --corpora python --seeds 0,1,2,3 --handoff /tmp/hand \
  --compile-cache none --progress > $OUT/study.log 2>&1
echo "study rc=$?"; grep -E "seed batch|finished|stopping|Error" $OUT/study.log
cp /tmp/hand/results-* $OUT/ 2>/dev/null; ls $OUT
