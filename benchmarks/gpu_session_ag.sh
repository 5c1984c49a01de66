# Twenty-seventh session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_ag.sh 1    (then 2, then 3 BUDGET), no carry.
# How a call runs, hands off and records its autotuning picks: gpu_studies_call.sh's
# header. Unpack each call straight from the device tool's files_at folder
# (python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; report).
# Call back to back: the machine is given back 30 s after a call, and a new one starts in
# ~60-130 s of the session's device time (a refused start costs ~90 s; a machine taken
# back during a call returns nothing and cost the twenty-sixth session 447 s). Record
# the calls as benchmarks/results/DATE-h200ae/README.md; merge autotuning dumps only
# where `autotune_picks.py compare` finds programs the committed picks lack.
#
# pure_llama (study_specs at 0554643) plans 151 prose pairs (BF16 and the paper recipe);
# paper s0-71 and BF16 s0-80, s84-89 are done. The twenty-sixth session's processes,
# start and handoff included (benchmarks/results/2026-12-03-h200ad): a paper batch of
# six 356 s on a fresh machine (batch 315 s) and 309 s (271 s) where an earlier call on
# the machine had compiled it (the compilation cache served its two programs); a BF16
# batch of three 146 s (115 s), of six 228 s (195 s, compiled afresh). A call's budget is
# at most 560 s. Call 1, on a fresh machine, runs a paper batch of six (~315 s
# estimated: estimates count a compilation; it runs from ~345 s left) and then fills
# BF16's hole s81-83 (~115 s, from ~145 s left). Calls 2 and 3 each run a paper batch
# of six (from the cache: ~309 s) and a BF16 batch of six (~195 s, from ~225 s left),
# or three of its seeds where the six do not fit; BF16 seeds that neither ran go to
# the next session. Call 3 gets `status` budget_left_s - 70, and 130 s less again where
# status says the machine is not warm, at most 560. Each process's log now also says
# how long the backend took to start and the corpus to load: record them with each
# batch's "outside its training wall" line (a process spent ~25 s before its first
# batch that no line accounted for).
case ${1:?call 1, 2 or 3} in
  1)  # prose paper s72-77; prose bf16 s81-83 (the twenty-sixth session's hole)
    bash benchmarks/gpu_studies_call.sh 560 \
      pure_llama:paper:prose:72,73,74,75,76,77:6 \
      pure_llama:bf16:prose:81,82,83:3 ;;
  2)  # prose paper s78-83; prose bf16 s90-95, or s90-92 where six do not fit
    bash benchmarks/gpu_studies_call.sh 560 \
      pure_llama:paper:prose:78,79,80,81,82,83:6 \
      pure_llama:bf16:prose:90,91,92,93,94,95:6 \
      pure_llama:bf16:prose:90,91,92:3 ;;
  3)  # prose paper s84-89 where it fits; prose bf16 s96-101, or s96-98 where six do not fit
    bash benchmarks/gpu_studies_call.sh "${2:?budget in seconds, at most 560}" \
      pure_llama:paper:prose:84,85,86,87,88,89:6 \
      pure_llama:bf16:prose:96,97,98,99,100,101:6 \
      pure_llama:bf16:prose:96,97,98:3 ;;
esac
