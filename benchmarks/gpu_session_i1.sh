# Next GPU session, call 1 (written 2026-12-01, fifth session; not yet run):
# 1. the vmapped quantize kernel on the GPU (seed batches run the kernels under vmap:
#    one more grid axis) and the GPU == CPU suite;
# 2. seed batches' throughput: three seeds of each of three study variants, each batch one
#    vmapped program (`studies/validation.py run --seed-batch 3`); compare their ms per
#    batched step with the unbatched units' ~24 ms (docs/STUDY.md).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_quantize_two_output.py -k vmapped \
  > $OUT/test_vmapped.log 2>&1; echo "vmapped kernel rc=$?"; tail -2 $OUT/test_vmapped.log
timeout 380 python3 studies/validation.py run pure_llama --budget-s 360 --seed-batch 3 \
  --variants no_2d,paper_tail,four_over_six --corpora python --handoff /tmp/hand \
  --compile-cache none --progress > $OUT/study.log 2>&1
echo "study rc=$?"; grep -E "seed batch|finished|stopping" $OUT/study.log
cp /tmp/hand/results-* $OUT/ 2>/dev/null; ls $OUT
