# GPU session 2026-12-01 (fifth), call 4: Nsight Compute profile of the two-output quantize
# kernels (RHT+SR and RHT RNE, amaxes given, TWO_OUTPUT_CONFIG), the RHT amax pass and the
# copy, on an 8192 x 8192 BF16 input (the same element count as 32768 x 2048): which pipe
# limits them (ALU, FMA, LSU), issue-slot use, occupancy and the warps' stall reasons.
# Call 4 ran it without the XLA_FLAGS line: q2 cases were not profiled (see above).
# The report is read back into a raw (every metric) and a details (sections) CSV.
export PYTHONPATH=. PYTHONUNBUFFERED=1
# XLA launches the two-output kernels' jitted calls as CUDA graphs with conditional nodes,
# which ncu does not profile kernel by kernel: command buffers off. Without preallocation
# ncu's kernel replay saves and restores little device memory.
export XLA_FLAGS=--xla_gpu_enable_command_buffer= XLA_PYTHON_CLIENT_PREALLOCATE=false
NCU="ncu --clock-control none --profile-from-start off"
$NCU --version | tail -1
timeout 300 $NCU --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section InstructionStats --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  -f --export /tmp/q2 python3 benchmarks/profile_kernels.py --cases ${CASES:-copy,amax_rht,q2_rne,q2_sr} \
  > $OUT/profile_q2.log 2>&1; echo "ncu rc=$?"
ncu --import /tmp/q2.ncu-rep --csv --page raw > $OUT/ncu_q2_raw.csv 2>&1
ncu --import /tmp/q2.ncu-rep --csv --page details > $OUT/ncu_q2_details.csv 2>&1
wc -c $OUT/*.csv
python3 - <<'PY'
import csv, os
rows = list(csv.reader(open(os.environ["OUT"] + "/ncu_q2_raw.csv")))
head, units, data = rows[0], rows[1], rows[2:]
want = ["Kernel Name", "gpu__time_duration.sum", "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active",
        "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__issue_active.avg.pct_of_peak_sustained_active",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed"]
for r in data:
    print(" | ".join(f"{w.split('.')[0][-28:]}={r[head.index(w)][:40]}" for w in want if w in head))
PY
