# One device call of the validation study (issue 12; <= 9.5 min): trains the study's
# unfinished units, restricted as the arguments say, in the study's order until the
# budget is spent; a unit cut off by the budget resumes from the carried studies/handoff
# when its checkpoint fits the handoff, else restarts. Results (after every seed batch,
# and at the end), checkpoints and compilation-cache entries come back in $OUT; the
# log's last 11000 characters are the call's output.
#   device tool: bash benchmarks/gpu_study_call.sh STUDY [VARIANTS [CORPORA [SEEDS [K]]]]
#   with carry=["studies/handoff"]; VARIANTS etc. comma-separated, "" for all; K > 1
#   trains K seeds of a variant as one program (no checkpoints, no per-layer diagnostics).
# Afterwards, here: python studies/validation.py unpack STUDY --from FILES_AT; report.
export PYTHONPATH=. PYTHONUNBUFFERED=1
STUDY=${1:?study name}; VARIANTS=${2:-}; CORPORA=${3:-}; SEEDS=${4:-}; K=${5:-0}
RESUME=(); [ -d studies/handoff ] && RESUME=(--resume-from studies/handoff)
timeout 570 python3 studies/validation.py run "$STUDY" --budget-s 540 --seed-batch "$K" \
  --variants "$VARIANTS" --corpora "$CORPORA" --seeds "$SEEDS" --handoff "$OUT" \
  "${RESUME[@]}" --progress > /tmp/study.log 2>&1
echo "study rc=$?"  # the log's end is the call's output (the handoff may use all 8 files)
tail -c 11000 /tmp/study.log
