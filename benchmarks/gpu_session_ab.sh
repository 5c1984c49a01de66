# Twenty-second session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_ab.sh 1    (then 2, then 3 BUDGET), no carry.
# Unpack each call's results here before the next (the device runs on a copy of this
# tree): python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; report.
# Record the calls as benchmarks/results/DATE-h200z/README.md, keep the autotune/ dumps
# that hold programs the committed picks lack (`autotune_picks.py compare`), and merge
# them, the committed file first so that no program's pick changes:
#   python benchmarks/autotune_picks.py merge studies/autotune_picks.textproto \
#     studies/autotune_picks.textproto FILES_AT/autotune/*.textproto.gz
#
# These are the last 30 of pure_llama's planned units (at 9dc626b):
# prose paper s24-29 with their BF16-forward tails and the BF16 runs they pair with; on
# Python 4/6 block scaling s6-7 with its tail (spec seeds 0-7) and the paper recipe
# s50-52 with its tail (their BF16 runs are in); prose 4/6 block scaling s3-7.
# Estimates (`batch_plans.batch_wall_estimate` + `fork_wall_estimate` on the committed
# results; the runs have come in under them): prose paper in six 306 s + forks 97 s, prose
# BF16 in three 109 s; Python 4/6 in two 312 s + forks 84 s, Python paper in three 180 s +
# forks 97 s; prose 4/6 in five 530 s. Each process also takes ~10 s to start, and `run`
# keeps 30 s of its budget in reserve. A batch that does not fit what its call has left is
# skipped (gpu_studies_call.sh), so call 2's Python paper batch runs only if 4/6 finishes
# within ~300 s (it took 300 s for three seeds in the twenty-first session); call 3 gets
# what is left (`status`: budget_left_s - 40): prose 4/6 needs ~540 s.
case ${1:?call 1, 2 or 3} in
  1)  # prose paper s24-29 forking paper_tail (~403 s); prose bf16 s27-29 (~109 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper,paper_tail:prose:24,25,26,27,28,29:6 \
      pure_llama:bf16:prose:27,28,29:3 ;;
  2)  # python four_over_six s6-7 forking its tail (~396 s); python paper s50-52 forking (~277 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:four_over_six,four_over_six_tail:python:6,7:2 \
      pure_llama:paper,paper_tail:python:50,51,52:3 ;;
  3)  # prose four_over_six s3-7 (~530 s); what call 2 left of the Python paper batch
    bash benchmarks/gpu_studies_call.sh "${2:?budget in seconds}" \
      pure_llama:four_over_six:prose:3,4,5,6,7:5 \
      pure_llama:paper,paper_tail:python:50,51,52:3 ;;
esac
