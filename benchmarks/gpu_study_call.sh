# One device call of the validation study (issue 12; <= 9.5 min): trains the study's
# unfinished units, restricted as the arguments say, in the study's order until the
# budget is spent; a unit cut off by the budget resumes from the carried studies/handoff
# when its checkpoint fits the handoff, else restarts. Results (after every seed batch,
# and at the end), checkpoints and compilation-cache entries come back in $OUT; the
# log's last 11000 characters are the call's output.
#   device tool: bash benchmarks/gpu_study_call.sh STUDY [VARIANTS [CORPORA [SEEDS [K [S]]]]]
#   with carry=["studies/handoff"]; VARIANTS etc. comma-separated, "" for all; K > 1
#   trains K seeds of a variant as one program (no checkpoints);
#   S is the budget in seconds (default 540: the call's 600 less a margin).
# Afterwards, here: python studies/validation.py unpack STUDY --from FILES_AT; report.
#
# On a machine of several GPUs (nvidia-h200-x2) with VARIANTS given, the variants are
# dealt round-robin to one process per GPU, each handing off into $OUT/gpuI (unpack each
# folder). Those processes neither resume checkpoints nor share a compilation cache: use
# it for studies whose checkpoints do not travel anyway (pure_llama, hybrid).
export PYTHONPATH=. PYTHONUNBUFFERED=1
STUDY=${1:?study name}; VARIANTS=${2:-}; CORPORA=${3:-}; SEEDS=${4:-}; K=${5:-0}
BUDGET=${6:-540}
run() {  # run EXTRA_ARGS...: the study's run command with this call's restrictions
  timeout $((BUDGET + 30)) python3 studies/validation.py run "$STUDY" --budget-s "$BUDGET" \
    --seed-batch "$K" --corpora "$CORPORA" --seeds "$SEEDS" --progress "$@"
}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
if [ "$NGPU" -gt 1 ] && [ -n "$VARIANTS" ]; then
  IFS=, read -ra ALL <<< "$VARIANTS"
  PIDS=()
  for ((g = 0; g < NGPU && g < ${#ALL[@]}; g++)); do
    GROUP=$(for ((i = g; i < ${#ALL[@]}; i += NGPU)); do printf '%s,' "${ALL[$i]}"; done)
    CUDA_VISIBLE_DEVICES=$g run --variants "${GROUP%,}" --handoff "$OUT/gpu$g" \
      --compile-cache none > /tmp/study$g.log 2>&1 &
    PIDS+=($!)
  done
  for g in "${!PIDS[@]}"; do
    wait "${PIDS[$g]}"; echo "== GPU $g: study rc=$?"; tail -c $((11000 / NGPU)) /tmp/study$g.log
  done
else
  RESUME=(); [ -d studies/handoff ] && RESUME=(--resume-from studies/handoff)
  run --variants "$VARIANTS" --handoff "$OUT" "${RESUME[@]}" > /tmp/study.log 2>&1
  echo "study rc=$?"  # the log's end is the call's output (the handoff may use all 8 files)
  tail -c 11000 /tmp/study.log
fi
