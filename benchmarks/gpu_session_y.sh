# Nineteenth session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_y.sh 1    (then 2, then 3 [BUDGET]), no carry.
# The three calls train disjoint units, so none waits for another's results; still,
# unpack each call's results here before the next (the device runs on a copy of this
# tree, so a unit that is not unpacked here counts as missing there):
#   python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; ... report
# Record the calls as benchmarks/results/2026-12-0X-h200w/README.md, keep the autotune/
# dumps that hold programs the committed picks lack (`autotune_picks.py compare`), and
# merge them, the committed file first so that no program's pick changes:
#   python benchmarks/autotune_picks.py merge studies/autotune_picks.textproto \
#     studies/autotune_picks.textproto FILES_AT/autotune/*.textproto.gz
#
# Calls 1-2 bring the headline pair on Python to 44 seeds: its gap's sd over 38 pairs,
# 0.98 pp, needs ~44 for a ±0.3 pp interval (docs/STUDY.md). The paper batches train the
# BF16-forward-tail variant on their seeds as forks (the steps after the switch only).
# Call 2 adds six prose seeds of the paper recipe with their tails, call 3 their BF16
# pairs, then ablation seeds (at 3-6 seeds each they sit below the full recipe, against
# the expectation, unresolved) as far as the budget goes.
# Estimates (`batch_plans.batch_wall_estimate`, `fork_wall_estimate` on the committed
# results): paper in six 307 s plus its six forks 71 s, BF16 in three 109 s, BF16 in six
# 204 s, no_rht in three 238 s, no_sr in three 183 s (with the picks loaded the
# eighteenth session's batches took 3-10% less: docs/BENCHMARKS.md).
export PYTHONPATH=. PYTHONUNBUFFERED=1
case ${1:?call 1, 2 or 3} in
  1)  # Python paper s38-43 forking paper_tail (~370 s), BF16 s38-40 (~106 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper,paper_tail:python:38,39,40,41,42,43:6 \
      pure_llama:bf16:python:38,39,40:3 ;;
  2)  # Python BF16 s41-43 (~106 s); prose paper s12-17 forking paper_tail (~370 s)
    bash benchmarks/gpu_studies_call.sh 596 pure_llama:bf16:python:41,42,43:3 \
      pure_llama:paper,paper_tail:prose:12,13,14,15,16,17:6 ;;
  3)  # prose BF16 s12-17 (~204 s); then no_rht s3-5 (~238 s), no_sr s3-5 (~183 s) as they fit
    bash benchmarks/gpu_studies_call.sh "${2:-596}" pure_llama:bf16:prose:12,13,14,15,16,17:6 \
      pure_llama:no_rht:python:3,4,5:3 pure_llama:no_sr:python:3,4,5:3 ;;
esac
