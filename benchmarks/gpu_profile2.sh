# GPU session 2026-11-30b, call 2: GPU bit-exactness of the conversion-free SR rounding,
# Nsight Compute of the Mosaic kernels, occupancy sweeps of the quantize kernels. Logs to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --tb=short \
  tests/kernels/test_quantize_single.py tests/kernels/test_quantize_two_output.py \
  -k "sr or stochastic" > $OUT/test_quantize_sr_gpu.log 2>&1; echo "SR GPU tests rc=$?"
tail -3 $OUT/test_quantize_sr_gpu.log
NCU="ncu --clock-control none --profile-from-start off --kernel-name regex:mosaic"
timeout 150 $NCU --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis \
  --csv --page details --log-file $OUT/ncu_mosaic.csv \
  python3 benchmarks/profile_kernels.py --cases q_rne,q_sr,q2_rne,q2_sr,gemm_pallas \
  > $OUT/profile_mosaic.log 2>&1; echo "ncu mosaic rc=$?"
M=smsp__average_warps_issue_stalled_
timeout 100 $NCU --csv --page raw --log-file $OUT/ncu_mosaic_raw.csv --metrics \
sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,${M}long_scoreboard_per_issue_active.ratio,${M}short_scoreboard_per_issue_active.ratio,${M}wait_per_issue_active.ratio,${M}math_pipe_throttle_per_issue_active.ratio,${M}not_selected_per_issue_active.ratio,${M}barrier_per_issue_active.ratio,${M}lg_throttle_per_issue_active.ratio,${M}mio_throttle_per_issue_active.ratio,${M}selected_per_issue_active.ratio,${M}dispatch_stall_per_issue_active.ratio \
  python3 benchmarks/profile_kernels.py --cases q_rne,q_sr,q2_rne,q2_sr,gemm_pallas \
  > $OUT/profile_mosaic_raw.log 2>&1; echo "ncu raw rc=$?"
timeout 150 python3 - > $OUT/quantize_sweeps2.log 2>&1 <<'PY'
from pallas_kernels import quantize_single as kq, quantize_two_output as kq2
Q = kq.QuantizeConfig
kq.main(configs=[Q(), Q(block_rows=16, block_cols=256, stages=4, ctas_per_sm=6),
                 Q(block_rows=16, block_cols=512, stages=3, ctas_per_sm=4),
                 Q(block_rows=32, block_cols=256, stages=4, ctas_per_sm=4)])
kq2.main(configs=[kq.TWO_OUTPUT_CONFIG, Q(block_rows=64, block_cols=128, stages=2, ctas_per_sm=4)])
PY
echo "sweeps rc=$?"; grep -A30 "fraction of copy" $OUT/quantize_sweeps2.log | head -40
