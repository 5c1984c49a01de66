# Tenth session, call 4 (<= 3.5 min): issue 9 t2, the skinny kernel's 256-wide overlapped K
# steps against the default, the kernel alone (prepared operands, no XLA passes), five
# repeats in alternating order at N = K = 8192, fprop M = 16 and 64 (call 3's as-called A/B
# had a +-30% spread: it could not decide).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
FINAL=$OUT; L=/tmp/logs; mkdir -p $L
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 170 python3 -c "
import dataclasses, jax, jax.numpy as jnp
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm_skinny_bench as b, timing
from pallas_kernels.gemm_config import default_config
nk = 8192
copies = timing.sets_to_defeat_l2(nk * nk // 2)
qw = [quantize(jax.random.normal(jax.random.key(i), (nk, nk), jnp.bfloat16), axis=0,
               block_2d=True) for i in range(copies)]
for m in (16, 64):
    base = default_config(m, nk, nk)
    ovl = dataclasses.replace(base, tile_k=256, k_substeps=2, max_concurrent_steps=4,
                              overlap_steps=True)
    ops = [(quantize(jax.random.normal(jax.random.key(100 + i), (m, nk))), w)
           for i, w in enumerate(qw)]
    runs = {n: b._kernel_only(ops, c, False) for n, c in (('default', base), ('overlap256', ovl))}
    for r in range(5):
        for n, (f, args) in runs.items():
            print(f'kernel alone M={m:>3} {n:>10} {b._ms(f, args, False):8.4f} ms', flush=True)
    print(base, ovl, flush=True)
" > $L/skinny_kernel_ab.log 2>&1
echo "rc=$?"; cut -c1-200 $L/skinny_kernel_ab.log | tail -24; save
