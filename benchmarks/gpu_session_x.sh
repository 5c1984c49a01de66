# Eighteenth session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_x.sh 1    (then 2, then 3 [BUDGET]), no carry.
# Afterwards, here, for each call: python studies/validation.py unpack pure_llama --from
# FILES_AT/pure_llama; report. Call 1's replay goes to a scratch folder, never into
# studies/results: unpack pure_llama --results /tmp/replay --from FILES_AT/replay.
# Record the calls as benchmarks/results/2026-12-0X-h200v/README.md with their autotune/
# dumps, and add the programs new to the committed picks (the committed file first, so
# that no program's pick changes):
#   python benchmarks/autotune_picks.py merge studies/autotune_picks.textproto \
#     studies/autotune_picks.textproto FILES_AT/autotune/*.textproto.gz
#
# Call 1 first replays prose BF16 s6-8 (the seventeenth session's call 4) with that
# process's own autotuning picks loaded, and says whether the replay repeats it bit for
# bit (`validation.py repeats`): whether the picks are the whole reason why runs of one
# seed part between sessions (benchmarks/results/2026-12-02-h200u). Then the paper
# recipe's BF16-forward-tail variant on Python s29-31, whose paper runs' picks
# studies/autotune_picks.textproto holds whole: if it trains as they did up to its switch,
# its difference from them is the tail's alone (as on prose: -1.10% [-1.15, -1.05]).
# Calls 1-2 bring the headline pair on Python to 38 seeds (the sd over 32 pairs, 0.88 pp,
# needs ~36 for a ±0.3 pp interval); call 2's paper batch also trains paper_tail on its
# seeds as a fork (`seed_batch.train_seeds`: the steps after the switch only). Call 3
# adds 4/6 seeds with 4/6-tail forked from them (the best variant so far, 3 seeds), then
# ablation seeds if time is left (at 3 seeds each they all sit below the full recipe,
# against the expectation, unresolved).
# Estimates (`batch_plans.batch_wall_estimate`, `fork_wall_estimate` on the committed
# results): paper_tail in three ~225 s, BF16 in three ~117 s, paper in six ~307 s and its
# fork ~150 s (less once call 1's tail has timed its switch), 4/6 in three ~330 s; the
# replay ~145 s.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case ${1:?call 1, 2 or 3} in
  1)  # replay, then Python paper_tail s29-31 (~220 s) and BF16 s32-34 (~120 s)
    mkdir -p "$OUT/autotune"
    gunzip -c benchmarks/results/2026-12-02-h200u/autotune/call4-1-pure_llama.textproto.gz \
      > /tmp/call4-1.textproto
    XLA_FLAGS="--xla_gpu_load_autotune_results_from=/tmp/call4-1.textproto \
--xla_gpu_dump_autotune_results_to=$OUT/autotune/0-replay.textproto" \
    timeout 220 python3 studies/validation.py run pure_llama --results /tmp/replay \
      --budget-s 190 --reserve-s 5 --seed-batch 3 --variants bf16 --corpora prose \
      --seeds 6,7,8 --handoff "$OUT/replay" --compile-cache none --progress \
      > /tmp/replay.log 2>&1
    echo "== replay: rc=$?, $SECONDS s into the call"
    tail -c 1200 /tmp/replay.log
    python3 studies/validation.py repeats pure_llama --results /tmp/replay
    PICKS="$OUT/autotune/0-replay.textproto"
    if [ -f "$PICKS" ]; then gzip -f "$PICKS"; fi
    bash benchmarks/gpu_studies_call.sh $((596 - SECONDS)) \
      pure_llama:paper_tail:python:29,30,31:3 pure_llama:bf16:python:32,33,34:3 ;;
  2)  # Python pairs to seed 37: paper s32-37 forking paper_tail, BF16 s35-37
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper,paper_tail:python:32,33,34,35,36,37:6 \
      pure_llama:bf16:python:35,36,37:3 ;;
  3)  # what call 2 left; 4/6 s3-5 forking 4/6-tail; no_2d s3-5 if it fits
    bash benchmarks/gpu_studies_call.sh "${2:-520}" pure_llama:bf16:python:35,36,37:3 \
      pure_llama:four_over_six,four_over_six_tail:python:3,4,5:3 \
      pure_llama:no_2d:python:3,4,5:3 ;;
esac
