# Twenty-third session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_ac.sh 1    (then 2, then 3 BUDGET), no carry.
# Unpack each call's results here before the next (the device runs on a copy of this
# tree): python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; report.
# Call back to back: the machine is given back 30 s after a call, and a new one starts in
# ~60-90 s of the session's device time. Record the calls as
# benchmarks/results/DATE-h200aa/README.md, keep the autotune/ dumps that hold programs the
# committed picks lack (`autotune_picks.py compare`), and merge them, the committed file
# first so that no program's pick changes:
#   python benchmarks/autotune_picks.py merge studies/autotune_picks.textproto \
#     studies/autotune_picks.textproto FILES_AT/autotune/*.textproto.gz
#
# pure_llama (study_specs at 0554643) plans 151 prose pairs (BF16 and the paper recipe) for a
# ±0.3 pp interval at the 1.86 pp sd of 30 pairs, and prose 4/6 block scaling s5-7 (left
# by the twenty-second session). Estimates (`batch_plans.batch_wall_estimate` on the
# committed results): prose 4/6 in three 312 s, prose BF16 in six 196 s, prose paper in
# six 304 s (no forks: the BF16-forward tail's prose seeds are done). Each process also
# takes ~10 s to start; a batch that does not fit what its call has left is skipped
# (gpu_studies_call.sh). Call 3 gets what is left (`status`: budget_left_s - 40).
case ${1:?call 1, 2 or 3} in
  1)  # prose four_over_six s5-7 (~312 s); prose bf16 s30-35 (~196 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:four_over_six:prose:5,6,7:3 \
      pure_llama:bf16:prose:30,31,32,33,34,35:6 ;;
  2)  # prose paper s30-35 (~304 s); prose bf16 s36-41 (~196 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper:prose:30,31,32,33,34,35:6 \
      pure_llama:bf16:prose:36,37,38,39,40,41:6 ;;
  3)  # prose paper s36-41 (~304 s); prose bf16 s42-47 (~196 s) if it fits
    bash benchmarks/gpu_studies_call.sh "${2:?budget in seconds}" \
      pure_llama:paper:prose:36,37,38,39,40,41:6 \
      pure_llama:bf16:prose:42,43,44,45,46,47:6 ;;
esac
