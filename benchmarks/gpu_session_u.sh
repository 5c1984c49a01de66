# Fifteenth session's device calls (issue 12; <= 9.5 min each): pure_llama's paper recipe
# and BF16 on Python seeds 8-10 (toward the ~17 paired seeds a ±0.3 pp interval needs;
# seed 8 samples per-layer diagnostics, the first pure_llama seed batch to, which also
# measures what the sampling costs there), the second corpus (BF16 and the paper recipe
# on prose, seeds 0-2; no diagnostics there), then 4/6 with the BF16-forward tail.
# Device tool: bash benchmarks/gpu_session_u.sh 1 (then 2, then 3), no carry needed.
# Afterwards, here, for each STUDY folder the call returned:
#   python studies/validation.py unpack STUDY --from FILES_AT/STUDY; ... report
# and run the next call on the state the unpacked results leave (a batch that finished
# is not run again; one that was skipped runs in a later call).
#
# Estimates (`seed_batch.batch_wall_estimate` on the committed results) and what the
# batches they come from took: Python paper s8-10 424 s (the 5-seed batch's 287 s plus an
# unbatched unit's 137-s pause for the diagnostics; the 3-seed batch took 203 s without
# them), BF16 120 s (120 s); prose BF16 120 s, paper 287 s (the Python batches': another
# byte stream of the same shapes); four_over_six_tail (untimed, diagnostics on seed 0):
# (329 s + the sampling's cost that call 1 measures) x 1.25. Within one entry a later
# batch of the same variant (BF16 s11-13) runs on the first's compiled programs
# (`seed_batch.BatchPrograms`) and is estimated ~17 s shorter; it runs where time is left,
# and its paper pair in a later session.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case ${1:?call 1, 2 or 3} in
  1)  # the paper recipe on Python seeds 8-10 (~275 s), then BF16 on 8-10 (~120 s)
    bash benchmarks/gpu_studies_call.sh 545 pure_llama:paper:python:8,9,10 \
      pure_llama:bf16:python:8,9,10,11,12,13 ;;
  2)  # the second corpus: BF16 and the paper recipe on prose (~120 s + ~205 s), then
      # whatever of the Python seeds 11-13 fits
    bash benchmarks/gpu_studies_call.sh 560 pure_llama:bf16,paper:prose:0,1,2 \
      pure_llama:bf16,paper:python:8,9,10,11,12,13 ;;
  3)  # 4/6 with the BF16-forward tail on Python (~450 s), then what prose has left
    bash benchmarks/gpu_studies_call.sh 560 pure_llama:four_over_six_tail:python:0,1,2 \
      pure_llama:bf16,paper,paper_tail:prose:0,1,2 ;;
esac
