"""Counter-based random bits for stochastic rounding.

Each element's bits are a keyed hash of its position, so any implementation (the
pure-JAX reference, a Pallas kernel, a sharded program) that knows an element's
position draws the same bits for it: stochastic rounding is reproducible and
bit-identical across implementations.

Position: the row-major linear index of the element in the quantized tensor's own
layout, with the quantized axis zero-padded to a multiple of 16 (taken modulo 2**32).
Key: the two 32-bit words of ``jax.random.key_data(key)`` (threefry; for other key
implementations the first two words).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

_U32 = jnp.uint32


def mix32(x: jax.Array) -> jax.Array:
    """A bijective 32-bit avalanche mix (Wellons' "lowbias32")."""
    x = x ^ (x >> 16)
    x = x * _U32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * _U32(0x846CA68B)
    return x ^ (x >> 16)


def check_key(key: object, what: str = "key") -> jax.Array:
    """Validates a single ``jax.random`` key, typed (``jax.random.key``) or raw
    (``jax.random.PRNGKey``, uint32 key data), and returns it as an array.

    Raises `TypeError` for anything else (e.g. an int seed) and `ValueError` for a
    batch of keys, naming ``what``.

    Example:
      >>> import jax
      >>> check_key(jax.random.PRNGKey(0)).dtype
      dtype('uint32')
    """
    if isinstance(key, (int, float)) or not hasattr(key, "dtype"):
        raise TypeError(
            f"{what} must be a jax.random key (jax.random.key(seed) or jax.random.PRNGKey(seed)), "
            f"got {type(key).__name__} {key!r}"
        )
    key = jnp.asarray(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"{what} must be a single jax.random key, got a batch of shape {key.shape}")
    elif key.dtype == jnp.uint32:
        if key.ndim != 1 or key.shape[0] < 2:
            raise ValueError(
                f"{what} must be a single jax.random key, got key data of shape {key.shape}"
            )
    else:
        raise TypeError(f"{what} must be a jax.random key, got an array of dtype {key.dtype}")
    return key


def key_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two uint32 words from a typed or raw (uint32[2]) ``jax.random`` key (validated)."""
    key = check_key(key)
    words = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return words[0].astype(_U32), words[1].astype(_U32)


def hash_bits(k0: jax.Array, k1: jax.Array, index: jax.Array) -> jax.Array:
    """32 random bits for each uint32 ``index`` under key words ``(k0, k1)``."""
    h = mix32(index ^ k0)
    h = mix32(h + k1)
    return mix32(h ^ (k0 * _U32(0x9E3779B9)))


def uniform_bits24(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """uint32 values in ``[0, 2**24)``, one per element of ``shape`` (row-major index)."""
    k0, k1 = key_words(key)
    index = lax.iota(_U32, max(math.prod(shape), 1))[: math.prod(shape)].reshape(shape)
    return hash_bits(k0, k1, index) >> 8
