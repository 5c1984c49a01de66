# GPU session 2026-12-01 (f), call 1: the dim-768 NVFP4 step's optimized HLO beside its
# trace, to identify the one-launch "loop_or_fusion" kernels (~4x their bytes' floor).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/train_step.py --recipes nvfp4 --impls auto --iters 2 \
  --trace /tmp/st --hlo $OUT --out $OUT/train_step_768_hlo.json \
  2>$OUT/train_step_768_stderr.log > $OUT/train_step_768_hlo.log
echo "train_step 768 rc=$?"; grep -A3 "^| recipe" $OUT/train_step_768_hlo.log
