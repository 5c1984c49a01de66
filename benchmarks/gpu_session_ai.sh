# Twenty-ninth session's device calls (issue 12; <= 10 min each). Device tool, every call
# with carry ["studies/handoff"] (the previous call's compilation cache, where unpacked):
#   bash benchmarks/gpu_session_ai.sh DONE          (every call; the last one:)
#   bash benchmarks/gpu_session_ai.sh DONE BUDGET   (status budget_left_s - 70, and 130 s
#                                                    less again where status says not warm;
#                                                    <= 560)
# DONE: the count of results `unpack` printed last ("N results in studies/results/
# pure_llama"; 410 before this session's first call). The call stops at once, before any
# training, where the tree holds another count of pure_llama results: a call over a tree
# without the last call's results would train its seeds again (the twenty-eighth session's
# call 2 did: 518 s that repeated call 1 bit for bit).
# How a call runs, hands off its results and compilation cache, and records its autotuning
# picks: gpu_studies_call.sh's header. Between calls, before the next one, always unpack
# the call just made: python studies/validation.py unpack pure_llama --from
# FILES_AT/pure_llama (results into studies/results/pure_llama, cache parts into
# studies/handoff); then report. Compare the picks: tar xf FILES_AT/autotune.tar -C DIR, then
# `autotune_picks.py compare studies/autotune_picks.textproto` on each dump; merge only
# where it finds programs the committed picks lack. Record the calls as
# benchmarks/results/DATE-h200ag/README.md, with each process's "compilation cache: N
# handed-off parts" line and its batches' cache hits (the unit JSON's
# seed_batch.compile_cache_hits).
#
# pure_llama (study_specs at 0554643) plans 151 prose pairs (BF16 and the paper recipe);
# paper s0-95 and BF16 s0-101, s108-110 are done (twenty-eighth session:
# benchmarks/results/2026-12-04-h200af). Every call asks for the same seed ranges: a batch
# takes the first seeds of its range that no finished unit holds, so a call picks up where
# the last one stopped. Per call: one paper batch of six (~304-328 s, ~341-376 s for its
# process on a machine with an empty compilation cache; from the cache ~271 s), then a
# BF16 batch of six (~195 s) or, where six do not fit, of three (~111-116 s; its process
# 118-126 s now that it loads the corpus from the corpus cache). The ranges hold what a
# session can reach; the batches of a range that do not fit print a line each and wait.
bash benchmarks/expect_results.sh pure_llama "${1:?the count of results unpack printed last}" \
  || exit
bash benchmarks/gpu_studies_call.sh "${2:-560}" \
  "pure_llama:paper:prose:$(seq -s, 96 113):6" \
  "pure_llama:bf16:prose:$(seq -s, 102 107),$(seq -s, 111 122):6" \
  "pure_llama:bf16:prose:$(seq -s, 102 107),$(seq -s, 111 122):3"
