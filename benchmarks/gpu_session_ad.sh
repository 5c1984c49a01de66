# Twenty-fourth session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_ad.sh 1    (then 2, then 3 BUDGET), no carry.
# Unpack each call's results here before the next (the device runs on a copy of this
# tree): python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; report.
# Call back to back: the machine is given back 30 s after a call, and a new one starts in
# ~60-120 s of the session's device time. Record the calls as
# benchmarks/results/DATE-h200ab/README.md, keep the autotune/ dumps that hold programs the
# committed picks lack (`autotune_picks.py compare`), and merge them, the committed file
# first so that no program's pick changes:
#   python benchmarks/autotune_picks.py merge studies/autotune_picks.textproto \
#     studies/autotune_picks.textproto FILES_AT/autotune/*.textproto.gz
#
# pure_llama (study_specs at 0554643) plans 151 prose pairs (BF16 and the paper recipe),
# fixed in advance from the 1.86 pp sd of 30 pairs; 36 pairs and BF16 s36-41 are done.
# Estimates (the twenty-third session's calls): a prose paper batch of six ~307 s and a
# BF16 batch of six ~195 s, each process 32-49 s more (start, data, handoff): paper 356 s
# and BF16 233 s into the twenty-third session's call 2, 589 s together. Call 3 gets what is left: `status`
# budget_left_s - 40, and 130 s less again where status says the machine is not warm (a
# machine start counts against the call's limit; the twenty-third session's call 3 was
# given 440 s, started cold, and was stopped at 365 s before its batch handed off).
case ${1:?call 1, 2 or 3} in
  1)  # prose paper s36-41 (~356 s); prose bf16 s42-47 (~233 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper:prose:36,37,38,39,40,41:6 \
      pure_llama:bf16:prose:42,43,44,45,46,47:6 ;;
  2)  # prose paper s42-47 (~356 s); prose bf16 s48-53 (~233 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper:prose:42,43,44,45,46,47:6 \
      pure_llama:bf16:prose:48,49,50,51,52,53:6 ;;
  3)  # prose paper s48-53 (~356 s) where it fits
    bash benchmarks/gpu_studies_call.sh "${2:?budget in seconds}" \
      pure_llama:paper:prose:48,49,50,51,52,53:6 ;;
esac
