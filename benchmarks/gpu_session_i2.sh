# Next GPU session, call 2 (written 2026-12-01, fifth session; not yet run): seed batches'
# throughput. Three seeds of each of three study variants, each batch one vmapped program
# (`studies/validation.py run --seed-batch 3`); compare the batches' ms per batched step
# with the unbatched units' ~24 ms (docs/STUDY.md) to size the seed counts the +-0.3 pp
# intervals need (38-49 seeds per variant at the measured spread).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 540 python3 studies/validation.py run pure_llama --budget-s 520 --seed-batch 3 \
  --variants no_2d,paper_tail,four_over_six --corpora python --handoff /tmp/hand \
  --compile-cache none --progress > $OUT/study.log 2>&1
echo "study rc=$?"; grep -E "seed batch|finished|stopping" $OUT/study.log
cp /tmp/hand/results-* $OUT/ 2>/dev/null; ls $OUT
