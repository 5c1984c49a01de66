"""Stage-by-stage GPU vs CPU comparison of the emulated NVFP4 GEMM (diagnostic)."""

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax
from fp4jax.reference import quantization as Q

GPU, CPU = jax.devices("gpu")[0], jax.devices("cpu")[0]


def data(shape, dtype, seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(k1, shape) * jnp.exp(3.0 * jax.random.normal(k2, shape[:-1] + (1,)))
    return x.astype(dtype)


def both(f, *args):
    f = jax.jit(f)
    return [jax.tree.map(np.asarray, f(*jax.device_put(args, d))) for d in (GPU, CPU)]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


x = data((512, 256), jnp.bfloat16, 1) * 0.01
w = data((256, 320), jnp.bfloat16, 2)
qx_g, qx_c = both(lambda x: fp4jax.quantize(x), x)
qw_g, qw_c = both(lambda w: fp4jax.quantize(w, axis=0, block_2d=True), w)
for name, g, c in (("qx", qx_g, qx_c), ("qw", qw_g, qw_c)):
    print(name, "data equal", np.array_equal(g.data, c.data),
          "scales equal", np.array_equal(g.scales.view(np.uint8), c.scales.view(np.uint8)),
          "amax", float(g.amax), float(c.amax))
a_g, a_c = both(Q.scaled_codes_bf16, qx_c)
b_g, b_c = both(Q.scaled_codes_bf16, qw_c)
print("scaled codes equal", np.array_equal(a_g.view(np.uint16), a_c.view(np.uint16)),
      np.array_equal(b_g.view(np.uint16), b_c.view(np.uint16)))
a, b = jnp.asarray(a_c), jnp.asarray(b_c)
exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
for prec in (None, "highest"):
    d_g, d_c = both(lambda a, b, prec=prec: jnp.dot(
        a, b, precision=prec, preferred_element_type=jnp.float32), a, b)
    print("dot precision", prec, "gpu vs exact", rel(d_g, exact), "cpu vs exact", rel(d_c, exact))
m_g, m_c = both(lambda qa, qb: fp4jax.matmul(qa, qb), qx_c, qw_c)
print("fp4jax.matmul gpu vs cpu", rel(m_g, m_c))
y_g, y_c = both(lambda x, w: fp4jax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                                preferred_element_type=jnp.float32,
                                                recipe=fp4jax.Recipe.nvfp4_no_sr()), x, w)
print("dot_general fwd gpu vs cpu", rel(y_g, y_c), "cpu matmul vs cpu dot_general", rel(m_c, y_c))

sub = np.array([1e-40, 8.2e-39, 1.5e-38], np.float32)
g, c = both(lambda x: (x * 2, x == 0), sub)
print("subnormals on GPU: x*2 =", g[0], "x==0:", g[1], "| CPU:", c[0], c[1])
ra = np.abs(np.random.default_rng(0).standard_normal(100000)).astype(np.float32) + 0.1
rb = np.abs(np.random.default_rng(1).standard_normal(100000)).astype(np.float32) + 0.1
g, c = both(lambda a, b: a / b, ra, rb)
print("plain float division GPU==CPU bitwise:",
      np.array_equal(g.view(np.uint32), c.view(np.uint32)), "mismatches",
      int(np.sum(g.view(np.uint32) != c.view(np.uint32))))
