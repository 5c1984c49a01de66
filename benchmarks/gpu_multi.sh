# Issue 11 on 2 H200s (device kind nvidia-h200-x2): ONE device call, <= LIMIT s (default 540),
# results in $OUT (multi_gpu.json, multi_gpu.log: the markdown tables are its last lines).
#   bash benchmarks/gpu_multi.sh
# compare.py's default model first, every part: data parallel tokens/s on 1 vs 2 GPUs (BF16,
# NVFP4), FSDP with the FP4 vs the BF16 all-gather (bytes per step from the compiled HLO, step
# time), 50-step loss curves 1 vs 2 GPUs; then the wide model (dim 2560, 317M parameters) as
# far as --budget-s allows (it skips and lists the parts that would not fit). Each model's
# programs compile 4 at a time (threads). Should that produce nothing (no JSON: e.g. a crash
# while compiling), the default model runs again, compiling one program at a time.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-540}
nvidia-smi -L; nvidia-smi topo -m > $OUT/topo.txt 2>&1
run() {  # run NAME ARGS...: SIGINT 25 s before LIMIT (the script then reports what it has)
  local name=$1; shift
  timeout -s INT -k 10 $((LIMIT - 25 - SECONDS)) python3 benchmarks/multi_gpu.py "$@" \
    --budget-s $((LIMIT - 45 - SECONDS)) --out $OUT/$name.json \
    2>$OUT/${name}_stderr.log | tee $OUT/$name.log
  echo "$name rc=${PIPESTATUS[0]} at ${SECONDS}s"
}
run multi_gpu --models default,wide --compile-workers 4
if [ ! -s $OUT/multi_gpu.json ] && [ $((LIMIT - SECONDS)) -gt 260 ]; then
  run multi_gpu_serial --models default --compile-workers 1
fi
