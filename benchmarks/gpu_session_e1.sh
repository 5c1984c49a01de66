# GPU session 2026-12-01 (e), call 1: the in-kernel scale math on the H200 (bit-exactness,
# then the Trainer step's compile and step time with the scale math in XLA vs in kernels),
# and where the two-output RHT+SR kernel's time goes (benchmarks/sr_cost.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_scale_kernels.py > $OUT/test_scale_kernels_gpu.log 2>&1
echo "scale kernel tests rc=$?"; tail -3 $OUT/test_scale_kernels_gpu.log
timeout 150 python3 benchmarks/sr_cost.py --out $OUT/sr_cost.json > $OUT/sr_cost.log 2>&1
echo "sr_cost rc=$?"; grep "^|" $OUT/sr_cost.log
for where in kernel xla; do
  timeout 200 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
    --scales-in $where --out $OUT/train_step_768_$where.json \
    2>$OUT/train_step_768_${where}_stderr.log > $OUT/train_step_768_$where.log
  echo "train_step scales in $where rc=$?"; grep -A4 "^| recipe" $OUT/train_step_768_$where.log
done
