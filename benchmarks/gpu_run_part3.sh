# GPU session part 3: the remaining quantize-kernel GPU tests (two-output, 8192^2 SR) and the
# examples' training loop vs its jitted step. Logs to $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 230 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -s --tb=short tests/kernels/test_quantize_two_output.py "tests/kernels/test_quantize_single.py::test_gpu_columnwise_sr_report" tests/kernels/test_quantize_single.py -k "two_output or report or (8192 and sr)" > $OUT/test_quantize_kernels_gpu_part3.log 2>&1; echo "rc=$?"; grep -E "passed|failed|FAILED|differ" $OUT/test_quantize_kernels_gpu_part3.log | tail -12
timeout 320 python3 benchmarks/train_loop.py --repeats 2 --steps 60 --no-breakdown --out $OUT/train_loop.json 2>$OUT/train_loop_stderr.log | tee $OUT/train_loop.log
