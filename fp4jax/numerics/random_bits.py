"""Counter-based random bits for stochastic rounding (docs/RECIPE.md §5).

Every element's 8 random bits are a keyed hash of its position, so any implementation
(the pure-JAX reference, a Pallas kernel, a sharded program) that knows an element's
position draws the same bits for it: stochastic rounding is reproducible and
bit-identical across implementations.

The scheme: the 16-blocks of a tensor (1D blocks along the quantized axis, after
zero-padding it to a multiple of 16) are numbered row-major in the tensor's own
layout with that axis replaced by its block count — the layout of
``quantize(x).scales``. Block ``b`` draws four 32-bit words, ``hash_bits(k0, k1, 4·b + j)``
for ``j = 0..3``; element ``p`` of the block (``p = 4j + i``) takes byte ``i`` (bits
``8i .. 8i+7``) of word ``j``. So one hash serves four elements, as Blackwell's
``cvt.rs`` serves four E2M1 conversions from one 32-bit word. The counter ``4·b + j``
is a uint32: tensors of up to ``2**34`` padded elements are supported (larger ones are
rejected). Key: the first two 32-bit words of ``jax.random.key_data(key)``.
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
            raise ValueError(
                f"{what} must be a single jax.random key, got a batch of shape {key.shape}")
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


SR_BITS = 8
"""Random bits per element: rounding probabilities are resolved to ``2**-8``."""

MAX_BLOCKS = 2**30
"""Most 16-blocks a stochastically rounded tensor may have (the uint32 counter's range)."""


def block_index(block_grid: tuple[int, ...], perm: tuple[int, ...]) -> jax.Array:
    """Row-major block numbers of a 1D block grid, transposed by ``perm``.

    Args:
      block_grid: the tensor's shape with the quantized axis replaced by its block count.
      perm: a permutation of the grid's axes (the caller's working layout).

    Raises:
      ValueError: more than `MAX_BLOCKS` blocks.
    """
    n = math.prod(block_grid)
    if n > MAX_BLOCKS:
        raise ValueError(
            f"stochastic rounding numbers blocks with a uint32 counter: a tensor of "
            f"{n} 16-blocks (grid {block_grid}) exceeds the {MAX_BLOCKS} supported"
        )
    return jnp.transpose(lax.iota(_U32, max(n, 1))[:n].reshape(block_grid), perm)


def block_bytes(key: jax.Array, blocks: jax.Array) -> jax.Array:
    """The 16 random bytes of each block: uint32 in ``[0, 256)``, shape ``(*blocks.shape, 16)``.

    Element ``p = 4j + i`` of block ``b`` gets byte ``i`` of ``hash_bits(k0, k1, 4b + j)``.

    Args:
      key: a typed or raw ``jax.random`` key.
      blocks: uint32 block numbers (see `block_index`).
    """
    k0, k1 = key_words(key)
    words = hash_bits(k0, k1, (blocks[..., None] << 2) | lax.iota(_U32, 4))  # (..., 4)
    shifts = lax.iota(_U32, 4) * _U32(8)
    out = (words[..., None] >> shifts) & _U32(0xFF)  # (..., 4 words, 4 bytes)
    return out.reshape(*blocks.shape, 16)
