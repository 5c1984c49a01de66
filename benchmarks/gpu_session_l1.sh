# Next GPU session, call 1 (written 2026-12-01, seventh session; not yet run; ≤ 9.5 min):
# 1. issue 9 t1: where the pipelined GEMM's warps wait. Nsight Compute's per-instruction
#    warp-state sampling (SourceCounters) of the 8192³ fprop: the seventh session saw the
#    L1TEX scoreboard as the largest stall (37%) with no global loads in the main loop;
#    candidates: mbarrier try-waits (the per-substep exchange of decoded rhs halves between
#    the two consumer warpgroups) or generic (not LDS) shared-memory loads.
# 2. issue 9 t2: Nsight Compute of the skinny kernel (16 × 8192², fprop) and its BF16 dot.
# 3. issue 9 t2/t5: the skinny bench and the dgrad table rows with dgrad's W.mT inside the
#    timed program (the seventh session's dgrad rows timed a transposed copy).
# Logs: one tarball, rewritten after each step (the device tool returns at most 8 files).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
NCU="ncu --clock-control none --profile-from-start off"
timeout 150 $NCU -k regex:gemm_pipelined -c 1 --section SourceCounters --section WarpStateStats \
  --page source --print-source sass --csv --log-file $L/ncu_pipelined_source.csv \
  python3 benchmarks/profile_kernels.py --cases gemm_pallas > $L/ncu_pipelined_source.log 2>&1
echo "ncu source rc=$?"; head -c 600 $L/ncu_pipelined_source.csv; echo; save
timeout 100 $NCU --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  --section LaunchStats --csv --page details --log-file $L/ncu_skinny.csv \
  python3 benchmarks/profile_kernels.py --cases gemm_skinny,gemm_skinny_bf16 > $L/ncu_skinny.log 2>&1
echo "ncu skinny rc=$?"; grep -i "Duration\|Throughput\|Issue Slots" $L/ncu_skinny.csv | cut -c1-200 | head -16; save
timeout 130 python3 -c "from pallas_kernels import gemm_skinny_bench as b; b.main([], sizes=(8192,), ms=(16, 64))" \
  > $L/skinny_bench.log 2>&1
echo "skinny bench rc=$?"; tail -8 $L/skinny_bench.log; save
timeout 160 python3 benchmarks/gemm_auto_table.py --layouts dgrad --tokens 16,128,1024 \
  --keep-rows-of fp4jax/gemm_table.py --json $L/table_dgrad.json --module $L/gemm_table_dgrad.py.txt \
  > $L/table_dgrad.log 2>&1
echo "table rc=$?"; tail -13 $L/table_dgrad.log; save
