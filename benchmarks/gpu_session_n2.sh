# Next GPU session, call 2 (written 2026-12-01, ninth session; not yet run; <= 8.5 min):
# issue 9 t2: two skinny-kernel options, bitwise in interpret mode, never run on a GPU:
# SkinnyConfig.overlap_steps (a step waits only for its earlier parts' wgmma and releases
# its stage one step late, so the next step's decode overlaps the last part's multiply)
# and SkinnyConfig.decoders (2 or 4 decoder warpgroups decode the weight into shared
# memory, the consumers only multiply: more warps in flight for a latency-bound decode).
# 1. the skinny GPU bitwise tests (two overlap and two decoder configs among them);
# 2. an alternating A/B (2 repeats) at N = K = 8192: the default, two parts, two parts
#    overlapped, 256-wide steps in two parts overlapped, 2 and 4 decoders (two parts, 3
#    stages); fprop M = 16, 64, dgrad M = 16 (dgrad takes only the 256-wide variant: a
#    part must be whole 128-byte rows; the others print "failed").
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 130 python3 -m pytest -v -m gpu tests/kernels/test_gemm_skinny.py -k "bitwise_when" \
  > $L/test_skinny_bitwise.log 2>&1
echo "skinny bitwise GPU tests rc=$?"; tail -3 $L/test_skinny_bitwise.log; save
timeout 340 python3 -c "
import dataclasses
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm_skinny_bench as b
from pallas_kernels.gemm_config import default_config
base = default_config(16, 8192, 8192)
two = dataclasses.replace(base, k_substeps=2)
variants = [base, two, dataclasses.replace(two, overlap_steps=True),
            dataclasses.replace(two, tile_k=256, max_concurrent_steps=4, overlap_steps=True),
            dataclasses.replace(two, decoders=2, max_concurrent_steps=3),
            dataclasses.replace(two, decoders=4, max_concurrent_steps=3)]
b._sweep(quantize, variants=variants, repeats=2)" > $L/skinny_overlap_ab.log 2>&1
echo "skinny A/B rc=$?"; grep -v "^ *ms failed" $L/skinny_overlap_ab.log | tail -40; save
