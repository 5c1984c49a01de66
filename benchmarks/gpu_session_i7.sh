# GPU session 2026-12-01 (sixth), call 5 (carry=[".whl"]): qwix 0.1.8 nvfp4 layer beside BF16 (bench_nvfp4._qwix_layer).
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
timeout 150 python3 - <<'PY' 2>&1 | tail -8 | tee $OUT/qwix.log
import jax, jax.numpy as jnp, numpy as np
from benchmarks import bench_nvfp4 as b
from pallas_kernels.timing import time_fn
keys = jax.random.split(jax.random.key(7), 4)
x = jax.random.normal(keys[0], (8192, 8192), jnp.bfloat16)
w = (jax.random.normal(keys[1], (8192, 8192)) / np.sqrt(8192)).astype(jnp.bfloat16)
ct = jax.random.normal(keys[2], (8192, 8192), jnp.bfloat16)
def f(x, w, ct):
    y, vjp = jax.vjp(lambda x, w: jax.lax.dot_general(x, w, b.LINEAR), x, w)
    return y, *vjp(ct)
bf = 1e3 * time_fn(jax.jit(f), [(x, w, ct), (x * 0.5, w, ct)], iters=15)
q = b._qwix_layer(x, w, ct, 15)
print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}: layer 8192 tokens 8192->8192 fwd+bwd: "
      f"BF16 {bf:.3f} ms, qwix 0.1.8 nvfp4 {q:.3f} ms ({q / bf:.2f}x)")
PY
