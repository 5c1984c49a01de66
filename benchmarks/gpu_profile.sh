# GPU session 2026-11-30b: Nsight Compute profile of the kernels and of one linear layer's
# fwd+bwd (where the time goes), then tiling sweeps of the quantize kernels. Logs to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU="ncu --clock-control none --profile-from-start off"
$NCU --version | tail -1
timeout 200 $NCU --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section InstructionStats --section SchedulerStats \
  --csv --page details --log-file $OUT/ncu_kernels.csv \
  python3 benchmarks/profile_kernels.py \
  --cases copy,amax,amax_rht,q_rne,q_sr,q_xla,q2_rne,q2_sr,gemm_pallas,gemm_xla,gemm_bf16 \
  > $OUT/profile_kernels.log 2>&1; echo "ncu kernels rc=$?"
timeout 150 $NCU --metrics gpu__time_duration.sum --csv --page raw \
  --log-file $OUT/ncu_layer.csv python3 benchmarks/profile_kernels.py \
  --cases layer_bf16,layer_auto > $OUT/profile_layer.log 2>&1; echo "ncu layer rc=$?"
timeout 200 python3 - > $OUT/quantize_sweeps.log 2>&1 <<'PY'
from pallas_kernels import quantize_single as kq, quantize_two_output as kq2
Q = kq.QuantizeConfig
kq.main(configs=[Q(), Q(block_rows=32, block_cols=512, stages=4, ctas_per_sm=2),
                 Q(block_rows=16, block_cols=1024, stages=4, ctas_per_sm=2),
                 Q(block_rows=64, block_cols=256, stages=3, ctas_per_sm=2),
                 Q(block_rows=16, block_cols=256, stages=8, ctas_per_sm=4),
                 Q(block_rows=32, block_cols=256, stages=6, ctas_per_sm=3)])
kq2.main(configs=[kq.TWO_OUTPUT_CONFIG, Q(block_rows=64, block_cols=256, stages=3, ctas_per_sm=1),
                  Q(block_rows=64, block_cols=128, stages=4, ctas_per_sm=3),
                  Q(block_rows=128, block_cols=128, stages=2, ctas_per_sm=1)])
PY
echo "sweeps rc=$?"; tail -40 $OUT/quantize_sweeps.log
