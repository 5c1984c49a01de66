# One device call that trains committed units of a study again, into a scratch folder,
# and says whether each repeats its committed run bit for bit (issue 12).
#   device tool: bash benchmarks/gpu_replay_call.sh BUDGET STUDY CORPUS K VARIANT:SEEDS ...
#   e.g. bash benchmarks/gpu_replay_call.sh 400 pure_llama prose 3 paper:190,191,192
# Each VARIANT:SEEDS trains those seeds of the variant on CORPUS again in seed batches of
# K (`validation.py run --seed-batch K`), with the flags a study call gives its processes
# (the committed autotuning picks loaded, the picks dumped where `gpu_studies_call.sh`
# dumps them, so the study's compilation cache on a warm machine serves it too), in
# $TMPDIR/replay (/tmp/replay): a copy of the committed results less the replayed units, so nothing under
# studies/results changes and the runner trains exactly those units. Then `validation.py
# repeats` compares the replayed units with the committed ones and prints a line per unit
# and the count that repeat. A replay in batches of another size or at other positions
# than the committed runs asks whether a seed's run depends on its batch at all (the
# twentieth session's replay kept both: benchmarks/results/2026-12-02-h200x).
# Each replay gets what the ones before it left of BUDGET (skipped under 60 s); the
# replayed units come back as $OUT/replay/results-STUDY.tar.gz (every result in the
# scratch folder), the logs as $OUT/logs/replay-N.log and the autotuner's picks each
# process dumped as $OUT/logs/replay-N.textproto.gz (for `autotune_picks.py compare`: a
# program the committed picks lack was tuned anew): one file plus two a replay.
# Afterwards, here, never into studies/results:
#   python studies/validation.py unpack STUDY --results /tmp/replay --from FILES_AT/replay
export PYTHONPATH=. PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/study_call_lib.sh"
BUDGET=${1:?budget in seconds}
STUDY=${2:?the study}
CORPUS=${3:?the corpus}
K=${4:?seeds per batch}
shift 4
check_call_budget "$BUDGET"
if [ "$#" -eq 0 ]; then echo "name one or more VARIANT:SEEDS to replay"; exit 2; fi
T0=$SECONDS
COMMITTED=studies/results/$STUDY
SCRATCH=${TMPDIR:-/tmp}/replay
REPLAYED=${TMPDIR:-/tmp}/replayed
rm -rf "$SCRATCH" "$REPLAYED"
mkdir -p "$SCRATCH" "$REPLAYED" "$OUT/logs"
cp "$COMMITTED"/*.json "$SCRATCH/"
PICKS_DIR="$PWD/$COMMITTED/work/autotune"
mkdir -p "$PICKS_DIR"
N=0
for ARG in "$@"; do
  N=$((N + 1))
  VARIANT=${ARG%%:*}
  SEEDS=${ARG#*:}
  if [ -z "$VARIANT" ] || [ "$SEEDS" = "$ARG" ] || ! [[ "$SEEDS" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    echo "a replay is VARIANT:SEEDS (seeds comma-separated), got '$ARG'"
    exit 2
  fi
  UNITS=()
  for S in ${SEEDS//,/ }; do
    # The tokens/param of the study's default run length is in the unit's file name.
    FOUND=("$SCRATCH/$CORPUS"-tpp*-"$VARIANT-s$S.json")
    if [ ! -f "${FOUND[0]}" ]; then
      echo "no committed $STUDY unit $CORPUS $VARIANT s$S to replay"
      exit 2
    fi
    UNITS+=("${FOUND[@]##*/}")
  done
  LEFT=$((BUDGET - (SECONDS - T0)))
  if [ "$LEFT" -lt 60 ]; then echo "== replay $ARG: ${LEFT}s left, skipped"; continue; fi
  for U in "${UNITS[@]}"; do rm "$SCRATCH/$U"; done
  XLA_FLAGS="$(study_xla_flags "$PICKS_DIR/picks.textproto")" \
  timeout $((LEFT + 60)) python3 studies/validation.py run "$STUDY" --results "$SCRATCH" \
    --budget-s "$LEFT" --seed-batch "$K" --variants "$VARIANT" --corpora "$CORPUS" \
    --seeds "$SEEDS" --handoff "$OUT/replay" --no-cache-handoff \
    --compile-cache "$COMMITTED/work/jax_cache" --unestimated-min-s 0 --progress \
    > "$OUT/logs/replay-$N.log" 2>&1
  echo "== replay $ARG: rc=$?, $((SECONDS - T0)) s into the call"
  if [ -f "$PICKS_DIR/picks.textproto" ]; then
    gzip -c "$PICKS_DIR/picks.textproto" > "$OUT/logs/replay-$N.textproto.gz"
    rm "$PICKS_DIR/picks.textproto"
  fi
  tail -c 3000 "$OUT/logs/replay-$N.log"
  for U in "${UNITS[@]}"; do
    if [ -f "$SCRATCH/$U" ]; then cp "$SCRATCH/$U" "$REPLAYED/"; fi
  done
done
python3 studies/validation.py repeats "$STUDY" --results "$REPLAYED" --against "$COMMITTED"
