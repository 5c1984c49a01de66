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
# hands its results off into $OUT/STUDY as each batch finishes. Its processes share JAX's
# persistent compilation cache in the study's ignored work folder
# (studies/results/STUDY/work/jax_cache): on the H200 a paper batch of six whose programs
# the cache held took 271 s instead of 315 s, its first step 21 s instead of 50 s
# (benchmarks/results/2026-12-03-h200ad). The device tool gives a machine back 30 s after
# a call; a call that starts within them finds the last one's machine with its ignored
# work folders, cache included (benchmarks/results/2026-12-04-h200ag), one that does not
# starts bare. So after its last process the call hands off the cache entries that save
# the most compile time (the compile seconds JAX records in each), at most CACHE_MIB
# and the files $OUT has left (`validation.py hand-off-cache`, 15 s at most; skipped
# where the last process ran past BUDGET + 20 s); `unpack` here puts them in
# studies/handoff, and the next call, carrying studies/handoff (device tool: carry
# ["studies/handoff"]), restores them in its first process of the study (`run
# --resume-from`; a copy cut short is ignored). CACHE_MIB keeps the carried parts and
# the repository (~20 MB tracked) inside the tool's 64 MiB tree
# (tests/test_study_call_scripts.py checks the margin). The XLA
# flags (`study_xla_flags`, study_call_lib.sh) are part of the cache key (JAX hashes
# XLA_FLAGS), so every process of a
# study gets the same ones, in every call and whatever its argument's place: each dumps
# the autotuner's picks to studies/results/STUDY/work/autotune/picks.textproto, which the
# script then gzips to N-STUDY.textproto.gz (N: the argument's place) beside it. (Named by
# the place in the flag itself, a batch missed the cache written by the same batch at
# another place: benchmarks/results/2026-12-04-h200ah.) The call archives the dumps as
# $OUT/autotune.tar at its end, for
# `benchmarks/autotune_picks.py` to compare; a process that loads its programs from the
# cache still dumps the picks it loaded, and `batch_plans.batch_wall_estimate` still
# counts a compilation for a fresh batch. Each process's log goes to $OUT/logs/N-STUDY.log
# as it runs: a call the device tool stops at its limit still brings back how far each
# process got. $OUT holds at most 8 files: the logs, autotune.tar, each study's results
# archive, then the cache parts.
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
source "$(dirname "${BASH_SOURCE[0]}")/study_call_lib.sh"
BUDGET=${1:?budget in seconds}; shift
check_call_budget "$BUDGET"
T0=$SECONDS
CACHE_MIB=38  # carried beside the repository in the device tool's 64 MiB working tree
CARRIED=studies/handoff
N=0
RUN=()  # the studies that ran, in order, once each
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
  PICKS_DIR="$PWD/studies/results/$STUDY/work/autotune"
  RESUME=()
  if [[ " ${RUN[*]} " != *" $STUDY "* ]]; then
    RUN+=("$STUDY")
    rm -rf "$PICKS_DIR"  # a warm machine's earlier call's picks: not this call's
    if [ -d "$CARRIED" ]; then RESUME=(--resume-from "$CARRIED"); fi
  fi
  PICKS="$PICKS_DIR/picks.textproto"
  LOG="$OUT/logs/$N-$STUDY.log"
  mkdir -p "$PICKS_DIR" "$OUT/logs"
  XLA_FLAGS="$(study_xla_flags "$PICKS")" \
  timeout $((LEFT + 60)) python3 studies/validation.py run "$STUDY" --budget-s "$LEFT" \
    --seed-batch "$K" --variants "$VARIANTS" --corpora "$CORPORA" --seeds "$SEEDS" \
    --tokens-per-param "$TPP" --handoff "$OUT/$STUDY" --no-cache-handoff --progress \
    "${RESUME[@]}" "${UNESTIMATED[@]}" \
    > "$LOG" 2>&1
  RC=$?
  if [ -f "$PICKS" ]; then gzip -c "$PICKS" > "$PICKS_DIR/$N-$STUDY.textproto.gz" && rm "$PICKS"; fi
  echo "== $STUDY: rc=$RC, $((SECONDS - T0)) s into the call"
  tail -c $((10000 / $#)) "$LOG"
done
DUMPS=()
for STUDY in "${RUN[@]}"; do
  for F in studies/results/"$STUDY"/work/autotune/*.textproto.gz; do
    if [ -f "$F" ]; then DUMPS+=("${F#studies/results/}"); fi
  done
done
if [ "${#DUMPS[@]}" -gt 0 ]; then tar -cf "$OUT/autotune.tar" -C studies/results "${DUMPS[@]}"; fi
for STUDY in "${RUN[@]}"; do
  if [ $((SECONDS - T0)) -gt $((BUDGET + 20)) ]; then
    echo "== $STUDY: $((SECONDS - T0)) s into the call: no time to hand off its cache"
    continue
  fi
  timeout 15 python3 studies/validation.py hand-off-cache "$STUDY" --out "$OUT" \
    --max-mib "$CACHE_MIB"
done
