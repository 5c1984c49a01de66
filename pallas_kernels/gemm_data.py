"""Data of the GEMM kernels' benchmarks and tests whose GEMM sums are exact in float32,
so a kernel must match the reference bit for bit whatever its summation order
(`pallas_kernels.gemm` ``--mainloops``, `pallas_kernels.gemm_skinny_bench`, the tests).

Example:
  >>> from pallas_kernels import gemm_data
  >>> x = gemm_data.exact_sum_data((32, 16), 0)
  >>> x.shape, float(abs(x).max()) in (6.0, 12.0)
  ((32, 16), True)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def exact_sum_data(shape: tuple[int, int], seed: int) -> jax.Array:
    """E2M1-grid values times 2**t per 16×16 tile (t = 0 or 1), with a ±6·2**t in every
    16-block, float32 ``shape``: once quantized the codes are the grid values and the
    scales (224 or 448) differ from tile to tile, so a misplaced scale shows, and for
    K <= 512 every float32 sum of a GEMM of two such operands is exact: a multiple of
    49 · 2**e · 0.25 (E4M3's 448 = 7 · 2**6) of at most 512 · 36 · 4 · 4 units, and
    49 · 294912 < 2**24.
    """
    grid = jnp.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], jnp.float32)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x = grid[jax.random.randint(k1, shape, 0, 8)] * jnp.where(
        jax.random.bernoulli(k2, 0.5, shape), -1.0, 1.0)
    x = x.at[:, ::16].set(6.0).at[::16, :].set(-6.0)
    t = jax.random.randint(k3, (-(-shape[0] // 16), shape[1] // 16), 0, 2)
    return x * jnp.exp2(t.astype(jnp.float32)).repeat(16, 0)[:shape[0]].repeat(16, 1)
