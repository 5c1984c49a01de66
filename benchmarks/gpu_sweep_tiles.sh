export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 - 2>&1 <<'PY' | grep -A20 "fraction of copy"
from pallas_kernels import quantize_single as kq
Q = kq.QuantizeConfig
kq.main(configs=[Q(), Q(block_rows=16, block_cols=128, stages=6, ctas_per_sm=8),
                 Q(block_rows=16, block_cols=128, stages=4, ctas_per_sm=12),
                 Q(block_rows=32, block_cols=128, stages=4, ctas_per_sm=6),
                 Q(block_rows=64, block_cols=128, stages=3, ctas_per_sm=4)], reps=10)
PY
