"""Deterministic stochastic-rounding keys per step and per layer."""

from __future__ import annotations

import zlib

import jax


def layer_key(step_key: jax.Array, name: str) -> jax.Array:
    """The key for one layer at one step: ``fold_in(step_key, crc32(name))``.

    Layers are told apart by a stable hash of their name (e.g. the module path
    ``"blocks.3.mlp.up"``), so keys do not depend on call order and are the same on
    every host and every run.

    Args:
      step_key: a per-step key, e.g. ``jax.random.fold_in(run_key, step)``.
      name: the layer's unique name.

    Example:
      >>> import jax, fp4jax
      >>> k = fp4jax.layer_key(jax.random.key(0), "blocks.0.attn.q")
      >>> bool((jax.random.key_data(k) != jax.random.key_data(
      ...     fp4jax.layer_key(jax.random.key(0), "blocks.1.attn.q"))).any())
      True
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    return jax.random.fold_in(step_key, zlib.crc32(name.encode()) & 0x7FFFFFFF)
