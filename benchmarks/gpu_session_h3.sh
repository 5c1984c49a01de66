# GPU session 2026-12-01 (fifth), call 3: the training step with the two-output kernels'
# new grid (2 stages, 8 CTAs/SM), and with XLA allowed to fuse the operands' E2M1 decode
# into Triton GEMMs (--xla_gpu_triton_gemm_any=true: XLA otherwise materializes every
# decoded operand in HBM for cuBLAS). The flag applies to both recipes of a process.
export PYTHONPATH=. PYTHONUNBUFFERED=1
run() {  # name, extra XLA flags, extra arguments
  XLA_FLAGS="$2" timeout 200 python3 benchmarks/train_step.py --recipes bf16,nvfp4 \
    --impls auto --iters 3 --out $OUT/$1.json ${@:3} 2>$OUT/$1_stderr.log > $OUT/$1.log
  echo "$1 rc=$?"; grep -A4 "^| recipe" $OUT/$1.log
}
run step768 ""
run step768_triton_any "--xla_gpu_triton_gemm_any=true" --trace /tmp/tr768
run step2048_triton_any "--xla_gpu_triton_gemm_any=true" --dim 2048
