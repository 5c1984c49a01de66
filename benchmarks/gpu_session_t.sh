# Fourteenth session's device calls (issue 12; <= 9.5 min each): seeds 3-5 of the hybrid
# and of long_data (six seeds each: the hybrid's gap and long_data's growth of the gap
# from 10 to 100 tokens/param resolved at the spreads seeds 0-2 showed; seed 3 samples
# per-layer diagnostics, item 5), then the skinny GEMM GPU tests where time is left.
# Device tool: bash benchmarks/gpu_session_t.sh 1 (then 2, then 3), no carry needed.
# Afterwards, here, for each STUDY folder the call returned:
#   python studies/validation.py unpack STUDY --from FILES_AT/STUDY; ... report
# and run the next call on the state the unpacked results leave (a batch that finished
# is not run again; one that was skipped runs in a later call).
#
# Times from the thirteenth session (H200, 3-seed batches, compilation included): hybrid
# BF16 219 s, paper 359 s; long_data BF16 44 s (10 tokens/param) and 157 s (100), paper
# 100 s and 234 s. A quantized batch whose seed 3 samples diagnostics has no estimate
# until one of its length has (the first sample compiles the diagnostics step: ~100 s
# for pure_llama's unbatched unit), so it runs first in its call or behind a MIN.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case ${1:?call 1, 2 or 3} in
  1)  # the hybrid's paper recipe (first: unestimated, ~470 s), long_data's BF16 if it fits
    bash benchmarks/gpu_studies_call.sh 545 hybrid:paper::3,4,5 long_data:bf16::3,4,5 ;;
  2)  # the hybrid's BF16, long_data's BF16, then its paper recipe at 10 tokens/param
    bash benchmarks/gpu_studies_call.sh 545 hybrid:bf16::3,4,5 long_data:bf16::3,4,5 \
      long_data:paper::3,4,5:3:160:10 ;;
  3)  # long_data's paper recipe at 10 tokens/param (call 2 had 122 s left for it, under
      # its MIN), then at 100 (~300 s), the skinny GEMM GPU cases (their pass count went
      # unrecorded in the twelfth session) if 140 s are left
    T0=$SECONDS
    bash benchmarks/gpu_studies_call.sh 540 long_data:paper::3,4,5:3:100:10 \
      long_data:paper::3,4,5:3:320:100
    LEFT=$((555 - (SECONDS - T0)))
    if [ "$LEFT" -ge 140 ]; then
      T1=$SECONDS
      timeout 130 python3 -m pytest -q -p no:warnings -m gpu tests/kernels/test_gemm_skinny.py \
        > /tmp/skinny.log 2>&1
      echo "skinny GPU tests: rc=$?, $((SECONDS - T1)) s"; tail -3 /tmp/skinny.log
    else
      echo "skinny GPU tests: ${LEFT}s left, not run"
    fi ;;
esac
