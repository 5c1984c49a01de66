# GPU session 2026-12-01, call 4: the column-pairs decode (layer breakdown at the model's
# shapes, with a trace), and the Trainer step BF16 vs NVFP4 auto on compare.py's default
# model (dim 768) and a wider one (dim 2048), with traces. Results packed in one tarball.
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p /tmp/r
timeout 90 python3 benchmarks/layer_breakdown.py --tokens 32768 --d-in 768 --d-out 2048 --iters 10 \
  --json /tmp/r/lb_768_2048.json --trace /tmp/trace_768_2048 > /tmp/r/lb_768_2048.log 2>&1
echo "breakdown rc=$?"; sed -n '/^| pass/,$p' /tmp/r/lb_768_2048.log | head -24
for d in 768 2048; do
  timeout 240 python3 benchmarks/train_step.py --dim $d --tokens corpus --recipes bf16,nvfp4 --impls auto \
    --trace /tmp/st_$d --out /tmp/r/train_step_$d.json 2>/tmp/r/train_step_${d}_stderr.log > /tmp/r/train_step_$d.log
  echo "train_step dim $d rc=$?"; grep -A12 "^| recipe" /tmp/r/train_step_$d.log | head -14
done
tar czf $OUT/d4.tgz -C /tmp/r .
