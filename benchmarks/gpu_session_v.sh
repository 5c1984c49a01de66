# Sixteenth session's device calls (issue 12; <= 9.5 min each): the two recipes never run
# on their corpus (4/6 with the BF16-forward tail on Python, whose seed 0 samples per-layer
# diagnostics; 4/6 on prose), then more paired seeds of the headline gap on Python (the
# measured sd, 0.91 pp over 14 seeds, needs ~38 for a ±0.3 pp interval), in batches of
# six where they fit (~91 s a pair per seed against ~105 s in batches of three).
# Device tool: bash benchmarks/gpu_session_v.sh 1 (then 2, then 3 [BUDGET]), no carry.
# Afterwards, here, for each STUDY folder the call returned:
#   python studies/validation.py unpack STUDY --from FILES_AT/STUDY; ... report
# and run the next call on the state the unpacked results leave (a batch that finished
# is not run again; one that was skipped runs in a later call).
#
# Estimates (`seed_batch.batch_wall_estimate` on the results committed with this script;
# a batch of six from the variant's own batch of five or three, its compilation once):
# Python four_over_six_tail s0-2 558 s (4/6's 329 s plus the 117 s the sampling cost the
# paper recipe's seed-8 batch, x 1.25: never timed); prose four_over_six s0-2 329 s
# (Python's 4/6 batch: the same shapes); Python paper s14-16 186 s (their BF16 pairs ran);
# Python paper s17-22 366 s, BF16 s17-22 246 s; BF16 s17-19 119 s, and s20-22 on its
# programs 103 s.
export PYTHONPATH=. PYTHONUNBUFFERED=1
SIX=17,18,19,20,21,22
case ${1:?call 1, 2 or 3} in
  1)  # 4/6 with the BF16-forward tail on Python (~460 s: 4/6, the tail, the diagnostics)
    bash benchmarks/gpu_studies_call.sh 580 pure_llama:four_over_six_tail:python:0,1,2 ;;
  2)  # 4/6 on prose (~330 s), then the paper recipe on Python seeds 14-16 (~190 s)
    bash benchmarks/gpu_studies_call.sh 575 pure_llama:four_over_six:prose:0,1,2 \
      pure_llama:paper:python:14,15,16 ;;
  3)  # Python seeds 17-22 of the headline pair: in batches of six where they fit, else
      # three (a later argument finds what an earlier one finished and does not rerun it)
    bash benchmarks/gpu_studies_call.sh "${2:-560}" pure_llama:paper:python:$SIX:6 \
      pure_llama:bf16:python:$SIX:6 pure_llama:bf16,paper:python:$SIX:3 ;;
esac
