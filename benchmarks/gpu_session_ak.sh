# Thirty-first session's device calls (issue 12; <= 10 min each): the last 29 prose units.
# Device tool, every call with carry ["studies/handoff"] (the previous call's compilation
# cache, where unpacked; before call 1 there is none: 2e53b69 changed the XLA flags every
# process gets, which are part of the cache's key, so the parts handed off under the old
# flags could not be hit and were deleted):
#   bash benchmarks/gpu_session_ak.sh DONE          (every call; the last one:)
#   bash benchmarks/gpu_session_ak.sh DONE BUDGET   (status budget_left_s - 70, and 130 s
#                                                    less again where status says not warm;
#                                                    <= 560)
# DONE: the count of results `unpack` printed last ("N results in studies/results/
# pure_llama"; 482 before this session's first call). The call stops at once, before any
# training, where the tree holds another count of pure_llama results.
# Between calls, at once (the device tool keeps a machine 30 s after a call; a call that
# starts within them finds it warm, with its corpus and compilation caches, ~75 s less
# held time than a cold start): python studies/validation.py unpack pure_llama --from
# FILES_AT/pure_llama, then the next call; report, the autotuning comparison and the record
# afterwards (as benchmarks/results/2026-12-04-h200ah).
#
# pure_llama plans 151 prose pairs (BF16 and the paper recipe); paper s0-131 and BF16
# s0-140 are done (benchmarks/results/2026-12-04-h200ah). Left: paper s132-150 (19) and
# BF16 s141-150 (10). A seed left alone never runs in a seed-batch call
# (batch_plans.batch_plan leaves it out of the batches), so the last paper batch takes
# seven seeds and BF16 runs in two fives (the second of a process reuses the first's
# programs). Estimates the batches start by (the "needs ~N s"
# a skipped batch prints; the 30 s reserve and the process's start come on top): BF16
# five ~196 s, paper six ~295 s, paper seven ~380 s (its six scaled up, times 1.1; it
# should take ~340 s). Planned: call 1 (cold) BF16 s141-145 and paper s132-137; call 2
# BF16 s146-150 and paper s138-143; call 3 paper s144-150 (BUDGET >= 415). Every call asks
# for all three ranges: a batch takes the first seeds of its range that no finished unit
# holds, and a batch that does not fit prints a line and waits.
bash benchmarks/expect_results.sh pure_llama "${1:?the count of results unpack printed last}" \
  || exit
bash benchmarks/gpu_studies_call.sh "${2:-560}" \
  "pure_llama:bf16:prose:$(seq -s, 141 150):5" \
  "pure_llama:paper:prose:$(seq -s, 132 143):6" \
  "pure_llama:paper:prose:$(seq -s, 144 150):7"
