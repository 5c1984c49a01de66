"""The compiler-friendly formulations compute exactly what their plain definitions do.

`fp4jax.numerics.rounding.div_rn` (long division with float-estimated digits),
`fp4jax.numerics.hadamard.rht` (one fused pass per butterfly) and
`fp4jax.quantized_dot.role_keys` (one batched ``fold_in``) are written for compile time
(docs/BENCHMARKS.md, "Compile time"); here they are checked bit for bit against NumPy's
float32 division, a NumPy butterfly in the same summation order, and `role_key`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax import Recipe
from fp4jax import quantized_dot as qd
from fp4jax.numerics import hadamard, rounding


def _finite_nonnegative(rng, n):
    """float32 bit patterns: a mix of normals, subnormals, zeros and near-powers of two."""
    kind = rng.integers(0, 5, n)
    bits = rng.integers(0, 0x7F800000, n, dtype=np.uint32)
    bits = np.where(kind == 0, rng.integers(0, 0x800000, n, dtype=np.uint32), bits)
    bits = np.where(kind == 1, np.uint32(0), bits)
    near_pow2 = (rng.integers(90, 170, n).astype(np.uint32) << 23) | rng.integers(0, 8, n,
                                                                                   np.uint32)
    bits = np.where(kind == 2, near_pow2, bits)
    return bits.view(np.float32)


def _numpy_div(a, b):
    with np.errstate(all="ignore"):
        q = (a / b).astype(np.float32)
    return np.where(a == 0, np.float32(0.0), q).view(np.uint32)  # div_rn: 0 / 0 = 0


def test_div_rn_is_numpys_float32_division_bit_for_bit():
    """Random operands over float32's whole range (subnormals, zeros, overflow and
    underflow of the quotient), exact subnormal ties, and concrete numerators (the
    trace-time path): every quotient has NumPy's bits. Sensitive: with one Newton step
    fewer than needed for the digit estimates, ~5% of these quotients differ."""
    rng = np.random.default_rng(0)
    n = 200_000
    a, b = _finite_nonnegative(rng, n), _finite_nonnegative(rng, n)
    ties = np.arange(1, 4096, dtype=np.uint32).view(np.float32)  # k·2**-149 / 2**j: ties
    a = np.concatenate([a, np.tile(ties, 4)])
    b = np.concatenate([b, np.repeat(np.float32([2.0, 4.0, 8.0, 3.0]), ties.size)])
    got = np.asarray(jax.jit(rounding.div_rn)(a, b)).view(np.uint32)
    np.testing.assert_array_equal(got, _numpy_div(a, b))
    for c in (1.0, 2688.0, 3.0, 1e-40, 0.0):
        got = np.asarray(jax.jit(lambda b, c=c: rounding.div_rn(np.float32(c), b))(b))
        np.testing.assert_array_equal(got.view(np.uint32),
                                      _numpy_div(np.full_like(b, c), b))


def _numpy_butterfly(x, signs):
    """RHT along the last axis in float32 NumPy, in `hadamard.rht`'s summation order."""
    y = (x.astype(np.float32).reshape(*x.shape[:-1], -1, 16)
         * np.asarray(signs, np.float32)).astype(np.float32)
    h = 1
    while h < 16:
        g = y.reshape(*y.shape[:-1], 16 // (2 * h), 2, h)
        a, b = g[..., 0, :], g[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2).reshape(y.shape)
        h *= 2
    return (y * np.float32(0.25)).reshape(x.shape)


@pytest.mark.parametrize("axis", [0, 1])
def test_rht_is_the_butterfly_bit_for_bit(axis):
    """Data spanning 60 binades (so partial sums round): `rht` in float32 equals the
    NumPy butterfly bit for bit, along either axis, eagerly and jitted, for the default
    and a random sign vector. (A 16×16 matmul instead differs in ~40% of elements.)"""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 48)) * 2.0 ** rng.integers(-30, 30, (64, 48)))
    x = x.astype(np.float32)
    for signs in (hadamard.DEFAULT_SIGNS, tuple(rng.choice([-1, 1], 16).tolist())):
        want = np.moveaxis(_numpy_butterfly(np.moveaxis(x, axis, -1), signs), -1, axis)
        for fn in (hadamard.rht, jax.jit(hadamard.rht, static_argnums=(1, 2))):
            got = np.asarray(fn(jnp.asarray(x), axis, signs))
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("key", [jax.random.key(3), jax.random.PRNGKey(3)])
def test_role_keys_are_role_key(key):
    """The batched derivation gives each operand `role_key`'s key (typed and raw keys)."""
    r = Recipe.nvfp4()
    pairs = ((r.dgrad_grad, "dgrad_grad"), (r.fprop_lhs, "fprop_lhs"), (r.wgrad_grad,
                                                                         "wgrad_grad"))
    got = qd.role_keys(key, *pairs)
    data = lambda k: jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) \
        else k  # noqa: E731
    for g, (op, role) in zip(got, pairs, strict=True):
        want = qd.role_key(key, op, role)
        if want is None:
            assert g is None
        else:
            np.testing.assert_array_equal(data(g), data(want))
