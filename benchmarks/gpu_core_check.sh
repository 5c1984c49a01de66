# Core GPU checks for issue 2 (run on the GPU machine from the repo root; logs to $OUT).
set -o pipefail; export PYTHONPATH=.; export PYTHONUNBUFFERED=1
python3 -c "import jax, flax, optax, chex, orbax.checkpoint as oc; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'optax', optax.__version__, 'chex', chex.__version__, 'orbax', oc.__version__)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python3 benchmarks/diag_gpu_gemm.py 2>&1 | tee $OUT/diag.log | head -20
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -s 2>&1 | tee $OUT/test_gpu.log | grep -v "^E   " | tail -25
python3 benchmarks/xla_linear_layer.py --out $OUT/xla_linear_layer.json 2>&1 | tail -6
