# Thirteenth session's device calls (issue 12; <= 9.5 min each): items 3 (hybrid) and 4
# (long data) at 3 seeds, neither run on a GPU before, so each kind's first batch (BF16
# or NVFP4, per length) runs where it has a call's time before it. Device tool:
#   bash benchmarks/gpu_session_s.sh 1   (then 2, then 3), no carry needed.
# Afterwards, here, for each STUDY folder the call returned:
#   python studies/validation.py unpack STUDY --from FILES_AT/STUDY; ... report
export PYTHONPATH=. PYTHONUNBUFFERED=1
case ${1:?call 1, 2 or 3} in
  1)  # the hybrid's BF16 batch first (its time unknown), then long_data's BF16 batches
      # (10 tokens/param with 120 s or more left, 100 tokens/param with 250 s)
    bash benchmarks/gpu_studies_call.sh 540 hybrid:bf16::0,1,2 \
      long_data:bf16::0,1,2:3:120:10 long_data:bf16::0,1,2:3:250:100 ;;
  2)  # the hybrid's paper-recipe batch alone first, then long_data's at 10 tokens/param
    bash benchmarks/gpu_studies_call.sh 540 hybrid:paper::0,1,2 \
      long_data:paper::0,1,2:3:150:10 ;;
  3)  # long_data's paper recipe at 100 tokens/param (10 first where call 2 left it), the
      # 10 skinny GEMM GPU cases unrecorded in the twelfth session, then pure_llama's 4/6
    T0=$SECONDS
    bash benchmarks/gpu_studies_call.sh 400 long_data:paper::0,1,2:3:120:10 \
      long_data:paper::0,1,2:3:330:100
    T1=$SECONDS
    timeout 130 python3 -m pytest -q -p no:warnings -m gpu tests/kernels/test_gemm_skinny.py \
      > /tmp/skinny.log 2>&1
    echo "skinny GPU tests: rc=$?, $((SECONDS - T1)) s"; tail -3 /tmp/skinny.log
    LEFT=$((540 - (SECONDS - T0)))
    if [ "$LEFT" -gt 60 ]; then
      bash benchmarks/gpu_studies_call.sh "$LEFT" pure_llama:four_over_six:python:0,1,2
    fi ;;
esac
