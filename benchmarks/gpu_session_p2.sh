# Eleventh session, call 2 (<= 9.5 min): issue 9 target 4's loop (the examples' training
# loop against its own jitted step; last measured 2026-11-30), then issue 12: pure_llama
# BF16 seeds 6-7 (python) as one seed batch (~100 s) if the time left fits it.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 330 python3 benchmarks/train_loop.py --repeats 2 --steps 60 --no-breakdown \
  --out $L/train_loop.json 2>$L/train_loop_stderr.log > $L/train_loop.log
echo "train loop rc=$?"; tail -8 $L/train_loop.log; save
timeout 60 python3 studies/validation.py plan pure_llama 2>&1 | head -8 > $L/plan.log; head -8 $L/plan.log
timeout 200 python3 studies/validation.py run pure_llama --budget-s 190 --seed-batch 2 \
  --variants bf16 --corpora python --seeds 6,7 --handoff /tmp/hand --compile-cache none \
  --progress > $L/study.log 2>&1
echo "study rc=$?"; grep -E "seed batch|finished|stopping|Error" $L/study.log; save
cp /tmp/hand/results-* $FINAL/ 2>/dev/null; ls $FINAL
