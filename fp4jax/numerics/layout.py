"""Axis and padding helpers shared by every implementation (one of each)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax.numerics.constants import BLOCK


def normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """Returns ``axis`` in ``[0, ndim)`` or raises `TypeError`/`ValueError` naming ``what``.

    Example:
      >>> normalize_axis(-1, 3)
      2
    """
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{what} must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}={axis} is out of range for an array of rank {ndim}")
    return int(axis) % ndim


def num_blocks(n: int) -> int:
    """Number of 16-element blocks covering ``n`` elements (the last may be partial)."""
    return -(-n // BLOCK)


def tile_axis_for(axis: int, ndim: int) -> int:
    """The second axis of a 2D (16×16) tile: the other of the array's last two axes."""
    if ndim < 2 or axis not in (ndim - 2, ndim - 1):
        raise ValueError(
            f"2D (16x16) blocks need the quantized axis to be one of the last two axes of an "
            f"array of rank >= 2; got axis={axis} for rank {ndim}"
        )
    return ndim - 1 if axis == ndim - 2 else ndim - 2


def pad_axis(x: jax.Array, axis: int, length: int) -> jax.Array:
    """Zero-pads ``axis`` of ``x`` at the end to ``length`` (no-op when already there)."""
    extra = length - x.shape[axis]
    if extra < 0:
        raise ValueError(f"cannot pad axis {axis} of shape {x.shape} down to {length}")
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def pad_to_block(x: jax.Array, axis: int) -> jax.Array:
    """Zero-pads ``axis`` to a multiple of 16 (zeros change no amax and no product)."""
    return pad_axis(x, axis, num_blocks(x.shape[axis]) * BLOCK)


def canonical_perm(ndim: int, axis: int, tile_axis: int | None) -> tuple[int, ...]:
    """The permutation moving ``axis`` last and, for 2D blocks, the tile axis just before."""
    tail = [axis] if tile_axis is None else [tile_axis, axis]
    return tuple(a for a in range(ndim) if a not in tail) + tuple(tail)


def repeat_each(x: jax.Array, times: int, axis: int) -> jax.Array:
    """``jnp.repeat(x, times, axis)`` written as a broadcast and a reshape.

    Same values; unlike ``jnp.repeat`` it needs no ``out_sharding`` under an explicit
    mesh (the result keeps ``x``'s sharding of ``axis``).

    Example:
      >>> import jax.numpy as jnp
      >>> repeat_each(jnp.array([[1, 2]]), 2, 1).tolist()
      [[1, 1, 2, 2]]
    """
    axis = normalize_axis(axis, x.ndim)
    y = jnp.expand_dims(x, axis + 1)
    y = jnp.broadcast_to(y, y.shape[: axis + 1] + (times,) + y.shape[axis + 2:])
    return y.reshape(x.shape[:axis] + (x.shape[axis] * times,) + x.shape[axis + 1:])


def whole_blocks_per_shard(x: jax.Array, axes: Iterable[int]) -> jax.Array:
    """``x`` with each of ``axes`` unsharded where its shards would split a 16-block.

    Under a mesh with explicit axes, an axis of length L sharded n ways can be cut into
    16-blocks in place only when every shard holds whole blocks (L a multiple of 16·n);
    otherwise that axis is gathered first (`jax.sharding.reshard`), so that blocks, and
    hence codes and scales, are the unsharded ones. Under auto axes (or no mesh) the
    type carries no sharding and ``x`` is returned as is: XLA moves the data itself.

    Example:
      >>> import jax.numpy as jnp
      >>> whole_blocks_per_shard(jnp.ones((4, 32)), [1]).shape  # unsharded: unchanged
      (4, 32)
    """
    sharding = jax.typeof(x).sharding
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    new = list(spec)
    for a in axes:
        names = () if spec[a] is None else (spec[a],) if isinstance(spec[a], str) else spec[a]
        n = math.prod(sharding.mesh.shape[name] for name in names)
        if n > 1 and x.shape[a] % (BLOCK * n):
            new[a] = None
    if new == list(spec):
        return x
    return jax.sharding.reshard(x, jax.sharding.PartitionSpec(*new))
