# Twelfth session, call 1 (<= 9.5 min): the 10 skinny GEMM GPU cases that the eleventh
# session's 200-s cap cut off (the default kernel's bits after the decoder removal), then
# issue 12: pure_llama's four recipes not yet run (Python corpus, seeds 0-2, unbatched:
# checkpoints and per-layer diagnostics) for the rest of the call. Device tool:
# bash benchmarks/gpu_session_r1.sh, carry=["studies/handoff"] if it exists.
# Afterwards, here: python studies/validation.py unpack pure_llama --from FILES_AT; report.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 170 python3 -m pytest -q -m gpu tests/kernels/test_gemm_skinny.py 2>&1 | tail -4
echo "skinny GPU tests: $((SECONDS - T0)) s"
bash benchmarks/gpu_study_call.sh pure_llama paper_tail,four_over_six,four_over_six_tail,all_nvfp4 \
  python 0,1,2 0 $((540 - (SECONDS - T0)))
