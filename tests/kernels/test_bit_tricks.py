"""The quantize kernels' in-kernel numerics (`pallas_kernels.bit_tricks`) in plain JAX."""

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax.numerics import random_bits, rounding
from fp4jax.numerics.constants import E2M1_VALUES
from pallas_kernels import bit_tricks as bits


def test_sr_is_unbiased_in_distribution():
    # The kernel's SR is the reference's bit for bit (kernel tests); check the rounding
    # helper is unbiased: E[round(v)] == v over many counters.
    v = jnp.full((1 << 16,), 0.3, jnp.float32)
    u24 = jax.random.randint(jax.random.key(0), v.shape, 0, 1 << 24).astype(jnp.uint32)
    codes = jax.jit(bits.nibble_stochastic)(v, jnp.float32(1.0), u24)
    vals = jnp.asarray(E2M1_VALUES)[codes]
    assert abs(float(vals.mean()) - 0.3) < 0.005


def test_nibble_nearest_matches_the_reference_code():
    """The magic-number E2M1 rounding equals `rounding.e2m1_code_nearest` with the sign."""
    v = jnp.concatenate([jnp.linspace(-7.0, 7.0, 4097), jnp.array([0.25, 0.75, 2.5, 5.0, -0.0])])
    want = rounding.e2m1_code_nearest(jnp.minimum(jnp.abs(v), 6.0)) | jnp.where(v < 0, 8, 0)
    np.testing.assert_array_equal(np.asarray(bits.nibble_nearest(v, jnp.float32(1.0))),
                                  np.asarray(want))


def test_hash_u24_is_the_reference_hash():
    key = jax.random.key(5)
    k0, k1, k2 = bits.sr_key_words(key)
    index = jnp.arange(1000, dtype=jnp.uint32)
    np.testing.assert_array_equal(np.asarray(bits.hash_u24(k0, k1, k2, index)),
                                  np.asarray(random_bits.hash_bits(k0, k1, index) >> 8))
