"""Deterministic random keys per step, per layer and for the model's own randomness.

Every key of a training step derives from the step key ``fold_in(run_key, step)``:

* `layer_key`: a quantized layer's stochastic-rounding key, ``fold_in(step_key, h)``
  with ``h = crc32(name) mod 2**31`` (`layer_keys`: several layers' at once);
* `model_key`: the key of the model's own randomness (dropout, ...), ``fold_in(step_key,
  2**31)``: the fold-in value is outside every `layer_key`'s range, so the two never
  coincide.

Both accept typed keys (``jax.random.key``) and raw ``uint32`` keys
(``jax.random.PRNGKey``), as ``jax.random`` does.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_MODEL_TAG = 2**31
"""`model_key`'s fold-in value; `layer_key` folds in values below 2**31."""


def check_key(key: Any, what: str = "key") -> jax.Array:
    """Returns ``key`` if it is one ``jax.random`` key, typed or raw; raises otherwise.

    Args:
      key: a typed key (``jax.random.key(0)``, shape ``()``) or a raw one
        (``jax.random.PRNGKey(0)``: a ``uint32`` array of the default implementation's
        key shape, e.g. ``(2,)``).
      what: how the error message names the argument.

    Raises:
      TypeError: for anything else (an int seed, a float array, ...).
      ValueError: for an array of several keys.

    Example:
      >>> import jax
      >>> from fp4jax.keys import check_key
      >>> check_key(jax.random.PRNGKey(0)).shape
      (2,)
      >>> check_key(0)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      TypeError: key must be a jax.random key (...), got int 0
    """
    if isinstance(key, np.ndarray):
        key = jnp.asarray(key)
    if not isinstance(key, jax.Array):
        raise TypeError(
            f"{what} must be a jax.random key (jax.random.key(seed) or "
            f"jax.random.PRNGKey(seed)), got {type(key).__name__} {key!r}"
        )
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"{what} must be a single key, got a key array of shape {key.shape}")
        return key
    raw_shape = jax.random.key_data(jax.random.key(0)).shape
    if key.dtype != jnp.uint32:
        raise TypeError(
            f"{what} must be a jax.random key (jax.random.key(seed) or "
            f"jax.random.PRNGKey(seed)), got an array of dtype {key.dtype}"
        )
    if key.shape != raw_shape:
        raise ValueError(
            f"{what}: a raw uint32 key has shape {raw_shape}, got {key.shape} "
            "(a batch of keys? pass one)"
        )
    return key


def typed_key(key: Any, what: str = "key") -> jax.Array:
    """`check_key`, then a raw key wrapped as a typed key (default implementation)."""
    key = check_key(key, what)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    return jax.random.wrap_key_data(key)


def layer_key(step_key: jax.Array, name: str) -> jax.Array:
    """The key for one layer at one step: ``fold_in(step_key, crc32(name) mod 2**31)``.

    Layers are told apart by a stable hash of their name (e.g. the module path
    ``"blocks.3.mlp.up"``), so keys do not depend on call order and are the same on
    every host and every run.

    Args:
      step_key: a per-step key, e.g. ``jax.random.fold_in(run_key, step)``; typed or raw.
      name: the layer's unique name.

    Raises:
      TypeError: if ``step_key`` is not a ``jax.random`` key or ``name`` not a str.

    Example:
      >>> import jax, fp4jax
      >>> k = fp4jax.layer_key(jax.random.key(0), "blocks.0.attn.q")
      >>> bool((jax.random.key_data(k) != jax.random.key_data(
      ...     fp4jax.layer_key(jax.random.key(0), "blocks.1.attn.q"))).any())
      True
    """
    step_key = check_key(step_key, "step_key")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    return jax.random.fold_in(step_key, _name_hash(name))


def _name_hash(name: str) -> int:
    """The value `layer_key` folds in for ``name``: ``crc32(name) mod 2**31``."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def layer_keys(step_key: jax.Array, names: Sequence[str]) -> jax.Array:
    """`layer_key` of several layers, bit for bit, from one batched ``fold_in``.

    Each ``fold_in`` is a threefry hash that the compiler handles as a unit of its own:
    deriving a step's layer keys one by one puts one per layer in the program, this
    function one for all of them.

    Args:
      step_key: a per-step key; typed or raw.
      names: the layers' names (a non-empty sequence of str).

    Returns:
      The keys stacked along a new leading axis: ``layer_keys(k, names)[i]`` is
      ``layer_key(k, names[i])`` (typed keys: shape ``(len(names),)``; raw keys: the key
      data of each, ``(len(names), 2)``).

    Raises:
      TypeError: if ``step_key`` is not a ``jax.random`` key or ``names`` not a sequence
        of str.
      ValueError: if ``names`` is empty.

    Example:
      >>> import jax
      >>> from fp4jax.keys import layer_key, layer_keys
      >>> k = jax.random.key(0)
      >>> ks = layer_keys(k, ["blocks.0.attn.q", "blocks.0.mlp.up"])
      >>> ks.shape
      (2,)
      >>> bool((jax.random.key_data(ks[1]) == jax.random.key_data(
      ...     layer_key(k, "blocks.0.mlp.up"))).all())
      True
    """
    step_key = check_key(step_key, "step_key")
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"names must be a sequence of str, got {type(names).__name__}")
    if not names:
        raise ValueError("names must name at least one layer, got an empty sequence")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"names must be str, got {type(name).__name__} {name!r}")
    hashes = jnp.asarray([_name_hash(n) for n in names], jnp.uint32)
    return jax.vmap(lambda h: jax.random.fold_in(step_key, h))(hashes)


def model_key(step_key: jax.Array) -> jax.Array:
    """The key for a model's own randomness (dropout, ...) at one step.

    `fp4jax.train` hands it to stateful loss functions; it never equals a
    `layer_key` of the same step.

    Example:
      >>> import jax
      >>> from fp4jax.keys import layer_key, model_key
      >>> k = jax.random.key(0)
      >>> bool((jax.random.key_data(model_key(k)) != jax.random.key_data(layer_key(k, "a"))).any())
      True
    """
    return jax.random.fold_in(check_key(step_key, "step_key"), _MODEL_TAG)
