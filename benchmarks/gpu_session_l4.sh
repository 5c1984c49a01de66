# GPU session 2026-12-01 (eighth), call 4 (≤ 5 min):
# 1. the serial kernel's GPU tests (call 3 ran out of time after the pipelined and skinny
#    kernels' 40 and 8 of these 28);
# 2. issue 9 t1: Nsight Compute per-instruction stall sampling of the pipelined 8192³
#    fprop now that its wgmma are no longer serialized (0.78× BF16 in call 3).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_gemm.py > $L/test_gemm_serial_gpu.log 2>&1
echo "serial GEMM GPU tests rc=$?"; tail -3 $L/test_gemm_serial_gpu.log; save
NCU="ncu --clock-control none --profile-from-start off"
timeout 120 $NCU -k regex:gemm_pipelined -c 1 --section SourceCounters --section WarpStateStats \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
  --page source --print-source sass --csv --log-file $L/ncu_pipelined_source.csv \
  python3 benchmarks/profile_kernels.py --cases gemm_pallas > $L/ncu_pipelined_source.log 2>&1
echo "ncu source rc=$?"; save
timeout 60 $NCU -k regex:gemm_pipelined -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats --csv --page details \
  --log-file $L/ncu_pipelined_details.csv python3 benchmarks/profile_kernels.py --cases gemm_pallas \
  > $L/ncu_pipelined_details.log 2>&1
echo "ncu details rc=$?"; grep -i "Duration\|Tensor\|Issue Slots\|Executed Ipc" $L/ncu_pipelined_details.csv | cut -c1-220 | head; save
