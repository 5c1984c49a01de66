# Fifteenth session's device calls (issue 12; <= 9.5 min each): pure_llama's paper recipe
# and BF16 on seeds 8-10 (toward the ~17 paired seeds a ±0.3 pp interval needs; seed 8
# samples per-layer diagnostics, the first pure_llama seed batch to, which measures what
# the sampling costs there), 4/6 with the BF16-forward tail, and the second corpus: BF16,
# the paper recipe and its BF16-forward tail on prose, seeds 0-2 (no diagnostics there).
# Device tool: bash benchmarks/gpu_session_u.sh 1 (then 2, then 3), no carry needed.
# Afterwards, here, for each STUDY folder the call returned:
#   python studies/validation.py unpack STUDY --from FILES_AT/STUDY; ... report
# and run the next call on the state the unpacked results leave (a batch that finished
# is not run again; one that was skipped runs in a later call).
#
# Estimates (`seed_batch.batch_wall_estimate` on the committed results; actual times in
# brackets, from the batches they are estimated from): pure_llama python paper s8-10
# 424 s (the 5-seed batch's 287 s plus an unbatched unit's 137-s pause for the
# diagnostics; the 3-seed paper batch took 203 s), BF16 120 s (120); four_over_six_tail
# (untimed) 583 s now, (329 + the sampling's cost measured in call 1) x 1.25 after it;
# prose BF16 120 s, paper 287 s, paper_tail 215 s (the Python batches': the prose corpus
# is another byte stream of the same shapes).
export PYTHONPATH=. PYTHONUNBUFFERED=1
case ${1:?call 1, 2 or 3} in
  1)  # the paper recipe then BF16 on Python seeds 8-10, BF16 on prose if it fits
    bash benchmarks/gpu_studies_call.sh 545 pure_llama:paper:python:8,9,10 \
      pure_llama:bf16:python:8,9,10 pure_llama:bf16:prose:0,1,2 ;;
  2)  # 4/6 with the BF16-forward tail on Python (diagnostics on seed 0), BF16 on prose
      # if call 1 left it
    bash benchmarks/gpu_studies_call.sh 560 pure_llama:four_over_six_tail:python:0,1,2 \
      pure_llama:bf16:prose:0,1,2 ;;
  3)  # prose: BF16 if not yet run, the paper recipe, its BF16-forward tail
    bash benchmarks/gpu_studies_call.sh 540 pure_llama:bf16,paper,paper_tail:prose:0,1,2 ;;
esac
