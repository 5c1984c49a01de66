"""The 16×16 random Hadamard transform (RHT) used on wgrad operands (docs/RECIPE.md §4)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax.numerics import layout, rounding
from fp4jax.numerics.constants import BLOCK

DEFAULT_SIGNS: tuple[int, ...] = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
"""Transformer Engine's fixed wgrad sign vector, shared by all layers for the whole run."""


def check_signs(signs: Sequence[int] | None) -> tuple[int, ...]:
    """Validates a sign vector (16 entries of ±1); None gives `DEFAULT_SIGNS`."""
    if signs is None:
        return DEFAULT_SIGNS
    try:
        signs = tuple(int(s) for s in np.asarray(signs).reshape(-1))
    except (TypeError, ValueError) as e:
        raise TypeError(f"hadamard_signs must be 16 integers ±1, got {signs!r}") from e
    if len(signs) != BLOCK or any(s not in (-1, 1) for s in signs):
        raise ValueError(f"hadamard_signs must be 16 entries of +1/-1, got {signs}")
    return signs


def sylvester_hadamard(n: int = BLOCK) -> np.ndarray:
    """The ``n×n`` Sylvester Hadamard matrix (entries ±1), ``n`` a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = np.ones((1, 1), dtype=np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_matrix(signs: Sequence[int] | None = None) -> np.ndarray:
    """``T = diag(signs) @ H16 / 4`` as a float32 numpy array (orthogonal)."""
    s = np.asarray(check_signs(signs), dtype=np.float32)
    return (s[:, None] * sylvester_hadamard()) / 4.0


def rht(
    x: jax.Array,
    axis: int = -1,
    signs: Sequence[int] | None = None,
    *,
    round_to: jnp.dtype | None = None,
) -> jax.Array:
    """Applies the random Hadamard transform to every 16-run along ``axis``.

    Each contiguous run ``r`` of 16 elements becomes ``r @ T`` with
    ``T = diag(signs) @ H16 / 4``. The sum is formed in float32 by a fixed
    fast-Walsh-Hadamard butterfly (4 stages of pairwise ``a+b, a-b``), identical in
    every fp4jax implementation, then rounded once to ``round_to`` (default: ``x``'s
    dtype) with an elision-proof rounding. The float32 partial sums are exact, so
    the result is the exact sum rounded once, when the largest and smallest binades of a
    16-run differ by at most ``20 - p`` (``p`` the input's significand bits: 12 binades
    for bfloat16, 9 for float16; docs/RECIPE.md §4); beyond that they may round first.

    Args:
      x: float array; ``x.shape[axis]`` must be a multiple of 16.
      axis: the axis along which runs are taken.
      signs: 16 entries of ±1 (default `DEFAULT_SIGNS`).
      round_to: dtype whose precision the result is rounded to.

    Returns:
      float32 array of ``x``'s shape holding the rotated values.

    Mathematically equivalent to::

      (x.reshape(..., n // 16, 16) @ rht_matrix(signs)).reshape(x.shape)

    Example:
      >>> import jax.numpy as jnp
      >>> from fp4jax.numerics.hadamard import rht
      >>> y = rht(jnp.eye(16))
      >>> bool(jnp.allclose(y @ y.T, jnp.eye(16)))
      True
    """
    x = jnp.asarray(x)
    round_to = x.dtype if round_to is None else jnp.dtype(round_to)
    y = butterfly_sums(x, axis, signs)
    return rounding.round_to_dtype(y * 0.25, round_to)


def butterfly_sums(x: jax.Array, axis: int = -1, signs: Sequence[int] | None = None
                   ) -> jax.Array:
    """The float32 butterfly sums of `rht` before its ``* 0.25`` and rounding: each
    16-run ``r`` along ``axis`` becomes ``r @ diag(signs) @ H16``, summed in `rht`'s order.

    Example:
      >>> import jax.numpy as jnp
      >>> butterfly_sums(jnp.ones(16), signs=[1] * 16)[:2].tolist()
      [16.0, 0.0]
    """
    x = jnp.asarray(x)
    axis = layout.normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    if n % BLOCK:
        raise ValueError(
            f"the Hadamard transform needs the length of axis {axis} to be a multiple of 16; "
            f"got shape {x.shape}"
        )
    s = jnp.asarray(check_signs(signs), dtype=jnp.float32)
    # The butterfly runs in place along `axis` (no transposes): the axis is split into
    # (runs, 16), and each stage is elementwise on the whole tensor: an element reads its
    # pair partner p through a reversal of the pair axis and keeps p + (±1)·y, i.e. a + b
    # for the first of the pair and a - b for the second (the same floats: addition
    # commutes and p - y is p + (-y)). XLA fuses the four stages, signs and scaling into
    # one pass; stacking the halves instead makes each stage a pass of its own.
    before, after = x.shape[:axis], x.shape[axis + 1:]
    runs = n // BLOCK
    y = x.astype(jnp.float32).reshape(*before, runs, BLOCK, *after)
    y = y * s.reshape((BLOCK,) + (1,) * len(after))
    plus_minus = np.array([1.0, -1.0], np.float32).reshape((2, 1) + (1,) * len(after))
    h = 1
    while h < BLOCK:
        # Pairs (i, i + h) within each group of 2h: Sylvester order, H = [[H, H], [H, -H]].
        g = y.reshape(*before, runs, BLOCK // (2 * h), 2, h, *after)
        y = (lax.rev(g, (axis + 2,)) + g * plus_minus).reshape(*before, runs, BLOCK, *after)
        h *= 2
    return y.reshape(x.shape)
