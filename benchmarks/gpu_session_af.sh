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
# paper batch of six 355-366 s (batch 311-312 s, ~46 s of it compiling), a BF16 batch of
# six 221-234 s (194-198 s, ~10 s compiling). A call's budget is at most 560 s
# (gpu_studies_call.sh: 40 s of the 600 s limit for the last handoff). Each call asks
# for a paper batch of six (estimated ~312 s, so it runs from ~342 s), then a BF16
# batch of six (~194 s estimated, runs from ~224 s left), then three of those BF16
# seeds (~111 s, from ~141 s left), which run only where the six did not. A call on a
# machine that compiled a program in an earlier call of the session loads it from the
# compilation cache (new this session: gpu_studies_call.sh's header; two fresh
# processes lower the same NVFP4 program, tests/test_compile_cache_keys.py, but no
# H200 process has loaded one yet): expected, a paper process of ~320 s instead of
# ~360 s, which leaves the BF16 six their ~224 s in calls 2 and 3; after call 1's cold
# paper process only the three fit. Whether the cache served: the results'
# seed_batch.compile_cache_hits and compile_s (a few seconds, not ~46 s for paper);
# record it, and where each process's time beyond its training wall went (each batch's
# "outside its training wall" line). BF16 seeds that neither ran (s81-83 where call 1
# ran three) go to the next session. Call 3 gets `status` budget_left_s - 70, and 130 s
# less again where status says the machine is not warm, at most 560.
case ${1:?call 1, 2 or 3} in
  1)  # prose paper s60-65; prose bf16 s78-83, or s78-80 where six do not fit
    bash benchmarks/gpu_studies_call.sh 560 \
      pure_llama:paper:prose:60,61,62,63,64,65:6 \
      pure_llama:bf16:prose:78,79,80,81,82,83:6 \
      pure_llama:bf16:prose:78,79,80:3 ;;
  2)  # prose paper s66-71; prose bf16 s84-89, or s84-86 where six do not fit
    bash benchmarks/gpu_studies_call.sh 560 \
      pure_llama:paper:prose:66,67,68,69,70,71:6 \
      pure_llama:bf16:prose:84,85,86,87,88,89:6 \
      pure_llama:bf16:prose:84,85,86:3 ;;
  3)  # prose paper s72-77 where it fits; prose bf16 s90-95, or s90-92 where six do not fit
    bash benchmarks/gpu_studies_call.sh "${2:?budget in seconds, at most 560}" \
      pure_llama:paper:prose:72,73,74,75,76,77:6 \
      pure_llama:bf16:prose:90,91,92,93,94,95:6 \
      pure_llama:bf16:prose:90,91,92:3 ;;
esac
