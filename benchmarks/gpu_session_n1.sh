# Next GPU session, call 1 (written 2026-12-01, ninth session; not yet run; <= 9.5 min):
# issue 9 t1: the pipelined GEMM's rhs decoder warpgroup (TuningConfig.rhs_decoder_registers),
# first GPU run. A fourth warpgroup decodes the rhs tile; the consumers only decode their
# lhs rows and multiply (bitwise in interpret mode, lowers for CUDA, never compiled by ptxas).
# 1. the pipelined kernel's config GPU tests (5 decoder configs among them);
# 2. the general kernel's sweep at 8192^3 (one decoder with 40/56/72/88 registers, two with
#    40/56, two that decode the lhs into shared memory too (lhs_in_smem, 64/88), 2 or 3
#    buffers, 4 stages), dumping every kernel's PTX;
# 3. ptxas -v on each dumped PTX: spills and the C75xx notes (wgmma serialization) that
#    Mosaic's own report drops; the PTX comes back (gzip) for SASS work on the CPU host;
# 4. Nsight Compute of two decoder kernels at 8192^3 (one decoder of 56 registers; two of 64
#    with lhs_in_smem): tensor pipe, issue, stalls.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
FINAL=$OUT; L=/tmp/logs; mkdir -p $L; D=/tmp/ptx; mkdir -p $D
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 130 python3 -m pytest -v -m gpu tests/kernels/test_gemm_pipelined.py -k "configs" \
  > $L/test_pipelined_configs.log 2>&1
echo "pipelined config GPU tests rc=$?"; tail -3 $L/test_pipelined_configs.log; save
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$D timeout 270 python3 -c "
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm
gemm._sweep(quantize, shapes=[(8192, 8192, 8192)])" > $L/sweep_general.log 2>&1
echo "general sweep rc=$?"; grep "sweep" $L/sweep_general.log | cut -c1-60,150-400; save
for p in $D/fp4jax_gemm_pipelined*.ptx; do
  b=$(basename ${p%.ptx}); gzip -c $p > $L/$b.ptx.gz
  timeout 30 ptxas -arch=sm_90a -v "$p" -o /tmp/$b.cubin > $L/$b.ptxas_stderr.txt 2>&1
  echo "== $b: $(grep -h 'C75\|Used\|spill' $L/$b.ptxas_stderr.txt | tr '\n' ' ' | cut -c1-300)"
done; save
NCU="ncu --clock-control none --profile-from-start off"
timeout 120 $NCU -k regex:gemm_pipelined -c 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats --csv --page details \
  --log-file $L/ncu_decoder_details.csv python3 benchmarks/profile_kernels.py \
  --cases gemm_pallas_decoder,gemm_pallas_lhs_in_smem \
  > $L/ncu_decoder_details.log 2>&1
echo "ncu decoder rc=$?"; grep -i "Duration\|Tensor\|Issue Slots\|Executed Ipc" $L/ncu_decoder_details.csv | cut -c1-220 | head; save
