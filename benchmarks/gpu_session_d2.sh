# GPU session 2026-12-01, call 2: GPU==CPU tests (with the 4/6 rule), and the linear layer's
# where-the-time-goes at the compare.py model's shapes (32768 tokens; 768->2048, 2048->768),
# with its optimized HLO and a profiler trace, to map the step's extra XLA fusions.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q tests/test_gpu.py > $OUT/test_gpu.log 2>&1; echo "test_gpu rc=$?"; tail -2 $OUT/test_gpu.log
for s in "768 2048" "2048 768"; do set -- $s
  timeout 100 python3 benchmarks/layer_breakdown.py --tokens 32768 --d-in $1 --d-out $2 --iters 10 \
    --json $OUT/lb_$1_$2.json --hlo $OUT/lb_hlo_$1_$2.txt --trace $OUT/trace_$1_$2 > $OUT/lb_$1_$2.log 2>&1
  echo "breakdown $1->$2 rc=$?"; sed -n '/^| pass/,$p' $OUT/lb_$1_$2.log | head -40
done
