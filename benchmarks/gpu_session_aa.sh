# Twenty-first session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_aa.sh 1    (then 2, then 3 [BUDGET]), no carry.
# Unpack each call's results here before the next (the device runs on a copy of this
# tree): python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; report.
# Record the calls as benchmarks/results/2026-12-0X-h200y/README.md, keep the autotune/
# dumps that hold programs the committed picks lack (`autotune_picks.py compare`), and
# merge them, the committed file first so that no program's pick changes:
#   python benchmarks/autotune_picks.py merge studies/autotune_picks.textproto \
#     studies/autotune_picks.textproto FILES_AT/autotune/*.textproto.gz
#
# The Python headline gap is resolved (+2.72% ± 0.29 pp over 50 pairs), so these calls
# fill the recipe comparisons the goals read, toward the spec's seeds 0-7 on
# Python: 4/6 block scaling and its BF16-forward tail (n=3 so far), all blocks NVFP4
# (n=3), no 2D weight blocks and no RHT (n=6); and three more prose pairs (n=24).
# Estimates (`batch_plans.batch_wall_estimate`, `fork_wall_estimate` on the committed
# results): 4/6 in three 312 s plus its three forks 105 s; all_nvfp4 in four 313 s; no_rht
# in two 209 s, no_2d in two 181 s; prose paper in three 184 s plus forks 97 s, BF16 110 s.
# Each process also takes ~10 s to start, and `run` keeps 30 s of its budget in reserve.
# A study that does not fit what its call has left is skipped (gpu_studies_call.sh).
case ${1:?call 1, 2 or 3} in
  1)  # python four_over_six s3-5 forking four_over_six_tail (~417 s); prose bf16 s21-23 (~110 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:four_over_six,four_over_six_tail:python:3,4,5:3 \
      pure_llama:bf16:prose:21,22,23:3 ;;
  2)  # python no_rht s6-7 (~209 s); prose paper s21-23 forking paper_tail (~281 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:no_rht:python:6,7:2 \
      pure_llama:paper,paper_tail:prose:21,22,23:3 ;;
  3)  # python all_nvfp4 s3-6 (~313 s); no_2d s6-7 (~181 s)
    bash benchmarks/gpu_studies_call.sh "${2:-560}" \
      pure_llama:all_nvfp4:python:3,4,5,6:4 \
      pure_llama:no_2d:python:6,7:2 ;;
esac
