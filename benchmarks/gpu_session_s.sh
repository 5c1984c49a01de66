# Thirteenth session's device calls (issue 12; <= 9.5 min each): items 3 (hybrid) and 4
# (long data) at 3 seeds, neither run on a GPU before, then pure_llama's 4/6 variants.
# Device tool: bash benchmarks/gpu_session_s.sh 1 (then 2, then 3), no carry needed.
# Afterwards, here, for each STUDY folder the call returned:
#   python studies/validation.py unpack STUDY --from FILES_AT/STUDY; ... report
#
# A batch of a length and kind (BF16 or NVFP4) nothing has timed starts only with MIN
# seconds left. MIN is chosen so the batch ends inside the call when an NVFP4 batch takes
# at most 1.68x the BF16 one before it (the noise pilot's ratio on the H200): of the 510 s
# a study gets, the BF16 batch leaves >= MIN only if it took <= 510 - MIN, and
# 1.68 x (510 - 340) = 286 s < 340. On the CPU the hybrid's step costs 1.15x
# pure_llama's (batch 4) and it runs 2432 steps to pure_llama's 2121: ~1.3x its batches
# (121 s BF16, 203 s paper recipe), so both of its batches should fit in call 1.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case ${1:?call 1, 2 or 3} in
  1)  # the hybrid, BF16 then the paper recipe; long_data's BF16 at 10 tokens/param
    bash benchmarks/gpu_studies_call.sh 540 hybrid:::0,1,2:3:340 \
      long_data:bf16::0,1,2:3:120:10 ;;
  2)  # the hybrid's paper recipe where call 1 left it; long_data, length by length
    bash benchmarks/gpu_studies_call.sh 540 hybrid:paper::0,1,2 long_data:::0,1,2:3:300 ;;
  3)  # long_data's remaining batch (the paper recipe at 100 tokens/param), the 10 skinny
      # GEMM GPU cases unrecorded in the twelfth session, then pure_llama's 4/6 variants
    T0=$SECONDS
    bash benchmarks/gpu_studies_call.sh 400 long_data:::0,1,2:3:330
    T1=$SECONDS
    timeout 130 python3 -m pytest -q -p no:warnings -m gpu tests/kernels/test_gemm_skinny.py \
      > /tmp/skinny.log 2>&1
    echo "skinny GPU tests: rc=$?, $((SECONDS - T1)) s"; tail -3 /tmp/skinny.log
    LEFT=$((540 - (SECONDS - T0)))
    if [ "$LEFT" -gt 60 ]; then
      bash benchmarks/gpu_studies_call.sh "$LEFT" \
        pure_llama:four_over_six,four_over_six_tail:python:0,1,2
    fi ;;
esac
