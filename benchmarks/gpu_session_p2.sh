# Eleventh session, call 2 (<= 9.5 min): issue 9 target 4 beside the all-NVFP4 figures:
# 1. the examples' training loop against its own jitted step (last measured 2026-11-30);
# 2. the dim-768 step with the paper's recipe (the last of 4 blocks in BF16: 21 of 29
#    layers NVFP4) beside BF16, in one process (the all-NVFP4 step was 1.37x, ninth session);
# 3. issue 12: `plan pure_llama` on the device (is the prose corpus under one epoch at 10
#    tokens/param there?).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 330 python3 benchmarks/train_loop.py --repeats 2 --steps 60 --no-breakdown \
  --out $L/train_loop.json 2>$L/train_loop_stderr.log > $L/train_loop.log
echo "train loop rc=$?"; tail -8 $L/train_loop.log; save
timeout 170 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --dim 768 --keep-last 1 --out $L/step768_keep1.json 2>$L/step768_keep1_stderr.log \
  > $L/step768_keep1.log
echo "step 768 keep-last 1 rc=$?"; grep -A4 "^| recipe" $L/step768_keep1.log; save
timeout 60 python3 studies/validation.py plan pure_llama 2>&1 | head -8 > $L/plan.log
cut -c1-200 $L/plan.log; save
