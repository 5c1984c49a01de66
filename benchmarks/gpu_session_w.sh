# Seventeenth session's device calls (issue 12; <= 10 min each): the headline pair on
# Python to 32 seeds (the measured sd, 0.83 pp over 20 pairs, needs ~32 for a ±0.3 pp
# interval), then the first of the prose pairs beyond seed 2 (sd 0.77 pp over 3: ~28
# needed), in batches of six where they fit (~50 s a paper seed against ~62 s in three).
# Device tool: bash benchmarks/gpu_session_w.sh 1 (then 2, then 3 [BUDGET]), no carry.
# Afterwards, here, for each STUDY folder the call returned:
#   python studies/validation.py unpack STUDY --from FILES_AT/STUDY; ... report
# and run the next call on the state the unpacked results leave (a batch that finished
# is not run again; one that was skipped runs in a later call).
#
# Each call also brings back the kernels XLA's autotuner picked, per process
# ($OUT/autotune/N-pure_llama.textproto.gz). Calls 1 and 2 both compile the BF16 batch of
# six on Python (call 1's second process, call 2's first): whether the two picked the
# same kernels for the same programs says whether autotuning is why runs of one seed
# part between sessions (docs/STUDY.md), on one machine; commit the files with the
# calls' record, so that a later session on another machine compares its own with them:
#   python benchmarks/autotune_picks.py CALL1/autotune/2-pure_llama.textproto.gz \
#     CALL2/autotune/1-pure_llama.textproto.gz
#
# Budgets sit just under the tool's 600 s limit: the study keeps 30 s of its budget in
# reserve (`--reserve-s`) and ~2 s go to its start, so a budget of 580 left a batch
# estimated at 558 s unstarted in the sixteenth session.
# Estimates (`seed_batch.batch_wall_estimate` on the results committed with this script):
# Python paper s23-28 302 s (its batch of six took 302 s), BF16 s20-25 246 s (from its
# batch of three, x 1.1), BF16 s26-31 246 s, paper s29-31 186 s; prose BF16 s3-8 246 s,
# paper s3-8 302 s; BF16 in three 119 s.
export PYTHONPATH=. PYTHONUNBUFFERED=1
P23=23,24,25,26,27,28 P20=20,21,22,23,24,25 P26=26,27,28,29,30,31 P29=29,30,31 S3=3,4,5,6,7,8
case ${1:?call 1, 2 or 3} in
  1)  # Python pairs to seed 25: paper s23-28 (~300 s), BF16 s20-25 (~250 s)
    bash benchmarks/gpu_studies_call.sh 596 pure_llama:paper:python:$P23:6 \
      pure_llama:bf16:python:$P20:6 pure_llama:bf16:python:$P20:3 ;;
  2)  # Python pairs to seed 31: BF16 s26-31 (~250 s), paper s29-31 (~190 s), then what
      # fits of prose BF16 s3-8
    bash benchmarks/gpu_studies_call.sh 596 pure_llama:bf16:python:$P26:6 \
      pure_llama:paper:python:$P29:3 pure_llama:bf16:prose:$S3:6 \
      pure_llama:bf16:prose:$S3:3 ;;
  3)  # prose pairs s3-8: paper in six (~300 s), BF16 what call 2 left
    bash benchmarks/gpu_studies_call.sh "${2:-590}" pure_llama:paper:prose:$S3:6 \
      pure_llama:bf16:prose:$S3:6 pure_llama:bf16,paper:prose:$S3:3 ;;
esac
