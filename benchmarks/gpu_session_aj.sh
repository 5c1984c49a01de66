# Thirtieth session's device calls (issue 12; <= 10 min each). Device tool, every call
# with carry ["studies/handoff"] (the previous call's compilation cache, where unpacked):
#   bash benchmarks/gpu_session_aj.sh DONE          (every call; the last one:)
#   bash benchmarks/gpu_session_aj.sh DONE BUDGET   (status budget_left_s - 70, and 130 s
#                                                    less again where status says not warm;
#                                                    <= 560)
# DONE: the count of results `unpack` printed last ("N results in studies/results/
# pure_llama"; 449 before this session's first call). The call stops at once, before any
# training, where the tree holds another count of pure_llama results: a call over a tree
# without the last call's results would train its seeds again.
# Between calls, at once (the device tool keeps a machine 30 s after a call; a call that
# starts within them finds it warm, with its work folders: the corpus and compilation
# caches, ~70 s less held time a call than a cold start; benchmarks/results/
# 2026-12-04-h200ag): copy FILES_AT aside, then python studies/validation.py unpack
# pure_llama --from FILES_AT/pure_llama (results into studies/results/pure_llama, cache
# parts into studies/handoff), then the next call; report, the autotuning comparison
# (tar xf FILES_AT/autotune.tar -C DIR; `autotune_picks.py compare
# studies/autotune_picks.textproto` on each dump) and the record afterwards. Record the
# calls as benchmarks/results/DATE-h200ah/README.md with each process's "compilation cache:
# N handed-off parts" line, the hand-off-cache lines (what it left out, with sizes and
# compile seconds) and each batch's cache hits (the unit JSON's
# seed_batch.compile_cache_hits) and first step (compile_s).
#
# pure_llama (study_specs at 0554643) plans 151 prose pairs (BF16 and the paper recipe);
# paper s0-113 and BF16 s0-125 are done (twenty-ninth session:
# benchmarks/results/2026-12-04-h200ag). Every call asks for the same seed ranges: a batch
# takes the first seeds of its range that no finished unit holds, so a call picks up where
# the last one stopped. Per call: paper batches of six (295 s for a process's first on a
# machine with an empty compilation cache, 266 s from the cache, 242 s for its second),
# then BF16 batches of six (196 s, 179 s from the cache, 177 s for a second) or, where six
# do not fit, of three (106 s). The ranges hold what a session can reach; the batches of
# a range that do not fit print a line each and wait. Where the session's last minutes
# fit only a smaller batch than these ranges' next, call gpu_studies_call.sh directly
# with that batch's seeds (as the twenty-ninth session did for BF16 s123-125). A batch
# starts only where BUDGET covers its estimate (the "needs ~N s" a skipped batch prints:
# paper six ~255 s, BF16 six ~184 s, BF16 three ~113 s) plus ~31 s (the 30 s reserve and
# the process's start): a BF16 three needs BUDGET >= 145 (140 fitted nothing, h200ag).
bash benchmarks/expect_results.sh pure_llama "${1:?the count of results unpack printed last}" \
  || exit
bash benchmarks/gpu_studies_call.sh "${2:-560}" \
  "pure_llama:paper:prose:$(seq -s, 114 150):6" \
  "pure_llama:bf16:prose:$(seq -s, 126 150):6" \
  "pure_llama:bf16:prose:$(seq -s, 126 150):3"
