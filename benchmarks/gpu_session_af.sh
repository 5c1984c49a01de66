# Twenty-sixth session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_af.sh 1    (then 2, then 3 BUDGET), no carry.
# How a call runs, hands off and records its autotuning picks: gpu_studies_call.sh's
# header. Unpack each call straight from the device tool's files_at folder
# (python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; report).
# Call back to back: the machine is given back 30 s after a call, and a new one starts in
# ~60-130 s of the session's device time (a refused start costs ~90 s and may name a
# wait). Record the calls as benchmarks/results/DATE-h200ad/README.md; merge autotuning
# dumps only where `autotune_picks.py compare` finds programs the committed picks lack.
#
# pure_llama (study_specs at 0554643) plans 151 prose pairs (BF16 and the paper recipe);
# paper s0-59 and BF16 s0-77 are done, so paper is 18 seeds behind and each call gives
# it a batch of six. The twenty-fifth session's processes, start and handoff included: a
# paper batch of six 355-366 s (batch 311-312 s), a BF16 batch of six 221-234 s (194-198
# s). A call's budget is at most 560 s (gpu_studies_call.sh: 40 s of the 600 s limit for
# the last handoff), which after a paper batch leaves 194-218 s: too little for a BF16
# batch of six (~194 s estimated plus the 30 s reserve), enough for one of three (~111 s
# estimated, ~145 s with its process). Call 3 gets `status` budget_left_s - 70, and 130 s
# less again where status says the machine is not warm, at most 560: the paper batch
# runs from ~345 s (then the three BF16 seeds too from ~510 s); below that the BF16
# batch of six runs instead (from ~230 s), then the three where they fit. Each batch's
# log now says where its process's time beyond the training wall goes (setup,
# initialization and final evaluation, results, handoff): record it in BENCHMARKS.
case ${1:?call 1, 2 or 3} in
  1)  # prose paper s60-65 (~366 s); prose bf16 s78-80 (~145 s)
    bash benchmarks/gpu_studies_call.sh 560 \
      pure_llama:paper:prose:60,61,62,63,64,65:6 \
      pure_llama:bf16:prose:78,79,80:3 ;;
  2)  # prose paper s66-71 (~366 s); prose bf16 s81-83 (~145 s)
    bash benchmarks/gpu_studies_call.sh 560 \
      pure_llama:paper:prose:66,67,68,69,70,71:6 \
      pure_llama:bf16:prose:81,82,83:3 ;;
  3)  # prose paper s72-77 where it fits, else prose bf16 s84-89; prose bf16 s90-92
    bash benchmarks/gpu_studies_call.sh "${2:?budget in seconds, at most 560}" \
      pure_llama:paper:prose:72,73,74,75,76,77:6 \
      pure_llama:bf16:prose:84,85,86,87,88,89:6 \
      pure_llama:bf16:prose:90,91,92:3 ;;
esac
