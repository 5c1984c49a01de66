"""Operands of the GEMM kernels' benchmarks and tests: the training layouts
(`layout_operands`, and `views`, how each multiplies its stored operands), and data whose
GEMM sums are exact in float32 (`exact_sum_data`), so a kernel must match the reference bit
for bit whatever its summation order (`pallas_kernels.gemm` ``--mainloops``,
`pallas_kernels.gemm_skinny_bench`, the tests).

Example:
  >>> from pallas_kernels import gemm_data
  >>> x = gemm_data.exact_sum_data((32, 16), 0)
  >>> x.shape, float(abs(x).max()) in (6.0, 12.0)
  ((32, 16), True)
"""

from __future__ import annotations

from collections.abc import Callable

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


def views(layout: str, lhs, rhs):
    """``(lhs, rhs, kwargs)`` as ``fp4jax.matmul`` multiplies the *stored* operands of a
    training GEMM: dgrad takes ``W.mT``, wgrad ``X.mT`` with ``lhs_from_mT`` (``wgrad_plain``:
    without the flag), fprop both as stored. A timed program should take these views
    inside itself, as the training step does: there XLA folds them into the kernel's
    transpose back to the stored layout, while a view materialized outside is a
    transposed copy the kernel transposes again.

    Example:
      >>> import jax.numpy as jnp
      >>> a, b, kw = views("wgrad", jnp.zeros((48, 32)), jnp.zeros((48, 64)))
      >>> a.shape, b.shape, kw
      ((32, 48), (48, 64), {'lhs_from_mT': True})
    """
    if layout == "fprop":
        return lhs, rhs, {}
    if layout == "dgrad":
        return lhs, rhs.mT, {}
    if layout in ("wgrad", "wgrad_plain"):
        return lhs.mT, rhs, {"lhs_from_mT": True} if layout == "wgrad" else {}
    raise ValueError(f"layout must be fprop, dgrad, wgrad or wgrad_plain, got {layout!r}")


def layout_operands(quantize: Callable, layout: str, m: int, n: int, k: int, *, seed: int = 0,
                    data: Callable = exact_sum_data):
    """``(lhs, rhs, kwargs)`` of the ``layout`` GEMM with output ``(m, n)`` and contraction
    ``k``: `stored_operands` with `views` taken (outside any program: a benchmark should
    take the views inside the timed one, `views`).

    Example:
      >>> from fp4jax.reference.quantization import quantize
      >>> lhs, rhs, kw = layout_operands(quantize, "wgrad", 32, 64, 48)
      >>> lhs.shape, rhs.shape, kw
      ((32, 48), (48, 64), {'lhs_from_mT': True})
    """
    return views(layout, *stored_operands(quantize, layout, m, n, k, seed=seed, data=data))


def stored_operands(quantize: Callable, layout: str, m: int, n: int, k: int, *,
                    seed: int = 0, data: Callable = exact_sum_data):
    """The two operands of the ``layout`` GEMM with output ``(m, n)`` and contraction
    ``k`` as a training step stores them, from ``data(shape, seed)`` quantized by
    ``quantize`` (`fp4jax.quantize`'s signature; this module imports no quantizer, being
    below the reference in the layers):

    * ``fprop``: X ``(m, k)`` blocked along K, W ``(k, n)`` in 16×16 tiles (``X @ W``);
    * ``dgrad``: dY ``(m, k)``, W stored ``(n, k)`` in 16×16 tiles (``dY @ W.mT``);
    * ``wgrad``/``wgrad_plain``: X ``(k, m)`` and dY ``(k, n)`` blocked along the tokens
      (``X.mT @ dY``).

    Example:
      >>> from fp4jax.reference.quantization import quantize
      >>> x, w = stored_operands(quantize, "dgrad", 32, 64, 48)
      >>> x.shape, w.shape
      ((32, 48), (64, 48))
    """
    if layout == "fprop":
        return (quantize(data((m, k), seed)),
                quantize(data((k, n), seed + 1), axis=0, block_2d=True))
    if layout == "dgrad":
        return (quantize(data((m, k), seed)),
                quantize(data((n, k), seed + 1), axis=0, block_2d=True))
    if layout in ("wgrad", "wgrad_plain"):
        return quantize(data((k, m), seed), axis=0), quantize(data((k, n), seed + 1), axis=0)
    raise ValueError(f"layout must be fprop, dgrad, wgrad or wgrad_plain, got {layout!r}")
