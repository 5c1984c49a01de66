# Twenty-fifth session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_ae.sh 1    (then 2, then 3 BUDGET), no carry.
# How a call runs, hands off and records its autotuning picks: gpu_studies_call.sh's
# header. Unpack each call straight from the device tool's files_at folder
# (python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; report):
# `cp -r` into a folder that already exists nests the copy, and the unpack then reads
# whatever that folder held before. Call back to back: the machine is given back 30 s
# after a call, and a new one starts in ~60-120 s of the session's device time (a refused
# start costs ~90 s and may name a wait). Record the calls as
# benchmarks/results/DATE-h200ac/README.md; merge autotuning dumps only where
# `autotune_picks.py compare` finds programs the committed picks lack.
#
# pure_llama (study_specs at 0554643) plans 151 prose pairs (BF16 and the paper recipe);
# paper s0-47 and BF16 s0-59 are done. The twenty-fourth session's processes, start and
# handoff included: a paper batch of six 342-363 s (batch 305-313 s), a BF16 batch of six
# 219-232 s (195-196 s). Call 3 gets `status` budget_left_s - 70, and 130 s less again
# where status says the machine is not warm. It asks for a paper batch first, and
# `validation.py` starts a batch only where its training wall (~305 s for paper, ~195 s
# for BF16, from the committed results) fits the budget less a 30 s reserve; the process
# then takes up to ~50 s beyond that wall (corpus, BF16-forward evaluation, handoff), so it
# may end ~30 s past the budget (gpu_studies_call.sh allows 60 s), and the other 70 s keep
# it inside the device limit. So the paper batch runs from ~405 s of device time left, the
# BF16 batch (the fallback) from ~305 s.
case ${1:?call 1, 2 or 3} in
  1)  # prose paper s48-53 (~363 s); prose bf16 s60-65 (~232 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper:prose:48,49,50,51,52,53:6 \
      pure_llama:bf16:prose:60,61,62,63,64,65:6 ;;
  2)  # prose paper s54-59 (~363 s); prose bf16 s66-71 (~232 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper:prose:54,55,56,57,58,59:6 \
      pure_llama:bf16:prose:66,67,68,69,70,71:6 ;;
  3)  # prose paper s60-65 where it fits, else prose bf16 s72-77
    bash benchmarks/gpu_studies_call.sh "${2:?budget in seconds}" \
      pure_llama:paper:prose:60,61,62,63,64,65:6 \
      pure_llama:bf16:prose:72,73,74,75,76,77:6 ;;
esac
