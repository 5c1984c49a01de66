# GPU session 2026-12-01 (ninth), call 3 (≤ 9.5 min): what the new defaults change elsewhere.
# 1. the general kernel's GPU tests (call 2 ran out of time after the pipelined and skinny
#    ones, all passed);
# 2. an A/B of the skinny M <= 16 default (256-wide K in two substeps, 4 deep) against the
#    old one (128-wide, 6 deep), alternating, 3 times each, fprop and dgrad M = 16: call 1's
#    sweep said 1.27x, call 2's table shows the kernel alone barely faster;
# 3. issue 9 t4: the jitted step, BF16 and NVFP4 auto in one process, dim 768 (the
#    compare.py model), last measured in the sixth session (1.34x);
# 4. issue 9 t5: the auto table's 16-token rows where the kernel was picked or within 1.3x.
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 140 python3 -m pytest -q -m gpu tests/kernels/test_gemm.py > $L/test_gemm_general_gpu.log 2>&1
echo "general GEMM GPU tests rc=$?"; tail -3 $L/test_gemm_general_gpu.log; save
timeout 90 python3 -c "
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm_skinny_bench as b
from pallas_kernels.gemm_config import SkinnyConfig, default_config
b._sweep(quantize, variants=[SkinnyConfig(tile_k=128, max_concurrent_steps=6, k_splits=4),
                             default_config(16, 8192, 8192)],
         cases=(('fprop', 16), ('dgrad', 16)), repeats=3)" > $L/skinny_ab.log 2>&1
echo "skinny A/B rc=$?"; tail -13 $L/skinny_ab.log; save
timeout 160 python3 benchmarks/train_step.py --recipes bf16,nvfp4 --impls auto --iters 3 \
  --dim 768 --out $L/step768.json 2>$L/step768_stderr.log > $L/step768.log
echo "step 768 rc=$?"; grep -A4 "^| recipe" $L/step768.log; save
timeout 130 python3 benchmarks/gemm_auto_table.py --layouts fprop,dgrad,wgrad --tokens 16 \
  --kernel-rows-of fp4jax/gemm_table.py --within 1.3 --keep-rows-of fp4jax/gemm_table.py \
  --json $L/table16.json --module $L/gemm_table16.py.txt > $L/table16.log 2>&1
echo "table rc=$?"; tail -8 $L/table16.log; save
