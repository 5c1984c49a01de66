# GPU session 2026-11-30b: the measured GEMM table of impl="auto" (both implementations per
# shape and layout), then per-kernel durations of one linear layer's fwd+bwd (Nsight Compute,
# for the where-the-time-goes table). Logs to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 400 python3 benchmarks/gemm_auto_table.py --json $OUT/gemm_auto_table.json \
  --module $OUT/gemm_table.py > $OUT/gemm_auto_table.log 2>&1; echo "gemm table rc=$?"
grep -v "does not take" $OUT/gemm_auto_table.log | tail -50
timeout 170 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
  --csv --page raw --log-file $OUT/ncu_layer.csv python3 benchmarks/profile_kernels.py \
  --cases layer_bf16,layer_auto > $OUT/profile_layer.log 2>&1; echo "ncu layer rc=$?"
