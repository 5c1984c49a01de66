# Twenty-eighth session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_ah.sh            (every call; the last one:)
#   bash benchmarks/gpu_session_ah.sh BUDGET     (status budget_left_s - 70, and 130 s less
#                                                 again where status says not warm; <= 560)
# No carry. How a call runs, hands off and records its autotuning picks:
# gpu_studies_call.sh's header. Unpack each call straight from the device tool's
# files_at folder (python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama;
# report). Call back to back: the machine is given back 30 s after a call (the
# twenty-seventh session's three calls each started a cold machine, one after a refused
# start that cost ~121 s). Record the calls as benchmarks/results/DATE-h200af/README.md;
# merge autotuning dumps only where `autotune_picks.py compare` finds programs the
# committed picks lack.
#
# pure_llama (study_specs at 0554643) plans 151 prose pairs (BF16 and the paper recipe);
# paper s0-89 and BF16 s0-92 are done (twenty-seventh session: benchmarks/results/
# 2026-12-03-h200ae). Every call asks for the same seed ranges: a batch takes the first
# seeds of its range that no finished unit holds, so a call picks up where the last one
# stopped and leaves no holes. Per call: one paper batch of six (~302-315 s and ~345 s
# for its process on a cold machine, which also builds the corpus cache; from the
# compilation cache of a warm machine's earlier call ~271 s), then a BF16 batch of six
# (~195 s; its process now loads the corpus from the cache in under a second, ~20 s less
# than before) or, where six do not fit, of three (~102-115 s). The ranges hold what a
# session can reach (three paper batches, three BF16 batches of six); the batches of a
# range that do not fit print a line each and wait (the logs under $OUT keep every line;
# the device tool's output shows each process's last ~3 kB).
# Each log says how long the backend took to start and the corpus to load ("from the cache"
# where the corpus cache served it): record them with each batch's line.
bash benchmarks/gpu_studies_call.sh "${1:-560}" \
  "pure_llama:paper:prose:$(seq -s, 90 107):6" \
  "pure_llama:bf16:prose:$(seq -s, 93 110):6" \
  "pure_llama:bf16:prose:$(seq -s, 93 110):3"
