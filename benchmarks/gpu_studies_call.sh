# One device call of the validation study (issue 12) over several studies in turn, all in
# seed batches, sharing one budget: a short study fills what a long one leaves.
#   device tool: bash benchmarks/gpu_studies_call.sh BUDGET STUDY:VARIANTS:CORPORA:SEEDS:K:MIN:TPP ...
#   e.g. bash benchmarks/gpu_studies_call.sh 540 hybrid:bf16::0,1,2 long_data:::0,1,2:3:150:10
# Each study's fields (trailing ones may be left out, "" for all) are ':'-separated:
# VARIANTS, CORPORA, SEEDS, TPP (run lengths in tokens/param) restrict its units; K seeds
# per batch (default 3, >= 2: batches keep no checkpoints, so each study hands off one
# file); MIN: a batch that nothing timed yet (the first of its length and kind, BF16 or
# NVFP4) starts only with MIN seconds left; without MIN, only as the first study's first.
# Each study gets what the ones before it left of BUDGET seconds (skipped under 60 s) and
# hands its results off into $OUT/STUDY, without compilation-cache entries: the processes
# share JAX's persistent compilation cache in the study's ignored work folder
# (studies/results/STUDY/work/jax_cache), which the device tool keeps on a warm machine
# between calls, so a later call on it loads what an earlier one compiled: on the H200
# a paper batch of six that its machine had compiled in the call before took 271 s
# instead of 315 s, its first step 21 s instead of 50 s (benchmarks/results/
# 2026-12-03-h200ad). The XLA flags below are part of the cache key, so they name the
# same files in every call (the device's tree and $OUT keep their paths); such a
# process still dumps the picks it loaded, and `batch_plans.batch_wall_estimate`
# still counts a compilation for a fresh batch (a new machine has no cache).
# Each process writes the kernels XLA's autotuner picked to
# $OUT/autotune/N-STUDY.textproto.gz (N: the argument's place), for
# `benchmarks/autotune_picks.py` to compare across calls, and its log to
# $OUT/logs/N-STUDY.log as it runs: a call the device tool stops at its limit still
# brings back how far each process got.
# Each process loads the committed picks, studies/autotune_picks.textproto (where it is
# there): a program they cover gets the same kernels in every process and session, so
# that a run of one seed repeats bit for bit (shown on the H200 in
# benchmarks/results/2026-12-02-h200v); XLA tunes the programs they do not cover anew
# (merge those processes' dumps into it: `autotune_picks.py merge`, first pick kept).
# A process may run 60 s past what it was given before `timeout` stops it: it starts a
# batch where the batch's training wall fits its budget less a 30 s reserve, and then
# spends up to ~50 s more on the corpus, the BF16-forward evaluation and the handoff
# (benchmarks/results/2026-12-03-h200ab), so a call's BUDGET must leave 40 s or more of
# the device tool's 600 s call limit beyond it for the last process to hand off: the
# script refuses a BUDGET over 560 (a call at 596 ran into the limit during its last
# process's final handoff: benchmarks/results/2026-12-03-h200ac).
# Afterwards, here: python studies/validation.py unpack STUDY --from FILES_AT/STUDY; report.
export PYTHONPATH=. PYTHONUNBUFFERED=1
BUDGET=${1:?budget in seconds}; shift
CALL_LIMIT=600  # the device tool's limit on one command, in seconds
if ! [[ "$BUDGET" =~ ^[0-9]+$ ]] || [ "$BUDGET" -gt $((CALL_LIMIT - 40)) ]; then
  echo "BUDGET must be whole seconds, at most $((CALL_LIMIT - 40)) (40 s of the" \
    "${CALL_LIMIT} s call limit for the last process's handoff), got '$BUDGET'"
  exit 2
fi
T0=$SECONDS
LOAD=
if [ -f studies/autotune_picks.textproto ]; then
  LOAD="--xla_gpu_load_autotune_results_from=$PWD/studies/autotune_picks.textproto"
fi
N=0
for ARG in "$@"; do
  IFS=: read -r STUDY VARIANTS CORPORA SEEDS K MIN TPP <<< "$ARG"
  K=${K:-3}
  if [ "$K" -lt 2 ]; then echo "$STUDY: K must be >= 2 here, got $K"; exit 2; fi
  UNESTIMATED=()
  if [ -n "$MIN" ]; then UNESTIMATED=(--unestimated-min-s "$MIN")
  elif [ "$N" -gt 0 ]; then UNESTIMATED=(--unestimated-min-s 1e9); fi
  N=$((N + 1))
  LEFT=$((BUDGET - (SECONDS - T0)))
  if [ "$LEFT" -lt 60 ]; then echo "== $STUDY: ${LEFT}s left, skipped"; continue; fi
  PICKS="$OUT/autotune/$N-$STUDY.textproto"
  LOG="$OUT/logs/$N-$STUDY.log"
  mkdir -p "$OUT/autotune" "$OUT/logs"
  XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }${LOAD:+$LOAD }--xla_gpu_dump_autotune_results_to=$PICKS" \
  timeout $((LEFT + 60)) python3 studies/validation.py run "$STUDY" --budget-s "$LEFT" \
    --seed-batch "$K" --variants "$VARIANTS" --corpora "$CORPORA" --seeds "$SEEDS" \
    --tokens-per-param "$TPP" --handoff "$OUT/$STUDY" --no-cache-handoff --progress \
    "${UNESTIMATED[@]}" \
    > "$LOG" 2>&1
  RC=$?
  if [ -f "$PICKS" ]; then gzip -f "$PICKS"; fi
  echo "== $STUDY: rc=$RC, $((SECONDS - T0)) s into the call"
  tail -c $((10000 / $#)) "$LOG"
done
