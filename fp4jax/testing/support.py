"""Shared helpers of `fp4jax.testing`: decoding an NVFP4Array on the host, format bounds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax import implementation
from fp4jax.numerics import hadamard, scales
from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.nvfp4_array import NVFP4Array

E4M3_MIN_NORMAL = 2.0**-6  # smallest normal float8_e4m3fn; below it steps are 2**-9
E4M3_HALF_SUBNORMAL_STEP = 2.0**-10  # largest rounding error of a subnormal E4M3 scale
FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal float32 (XLA:CPU flushes below)
SIGN_BIT = 8  # bit 3 of an E2M1 code


# A relative slack for float32 arithmetic (a few ulps of the scale products), far below
# any NVFP4 rounding step (>= 1/12 of the value in the top binade).
F32_SLACK = 2.0**-18


# ---------------------------------------------------------------- small helpers


def f64(a: Any) -> np.ndarray:
    return np.asarray(jnp.asarray(a).astype(jnp.float32), dtype=np.float64)


def bits(a: Any) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def block_of(idx: tuple[int, ...], q: NVFP4Array) -> tuple[int, ...]:
    """The block (1D) or tile (2D) index of element ``idx``: its scale's index."""
    b = list(idx)
    b[q.axis] //= BLOCK
    if q.block_2d:
        b[q.tile_axis] //= BLOCK
    return tuple(b)


class Decoded(NamedTuple):
    """Host copies of what the checks read from an `NVFP4Array`, in its logical shape."""

    values: np.ndarray  # float64: dequantize(q)
    scales: np.ndarray  # float64: each element's block decode scale s
    codes: np.ndarray  # uint8 E2M1 codes
    gds: float  # the global decode scale


def per_element(per_block: np.ndarray, q: NVFP4Array) -> np.ndarray:
    """Broadcasts an array shaped like ``q.scales`` to ``q.shape`` (one value per element)."""
    out = per_block
    for a in (q.axis, q.tile_axis):
        if a is not None:
            out = np.take(np.repeat(out, BLOCK, axis=a), np.arange(q.shape[a]), axis=a)
    return out


def decode(q: NVFP4Array) -> Decoded:
    """Codes and scales unpacked on the host (RECIPE.md §1 packing), values from
    `fp4jax.dequantize`."""
    data = np.moveaxis(np.asarray(q.data), q.axis, -1)
    codes = np.stack([data & 0xF, data >> 4], axis=-1).reshape(*data.shape[:-1], -1)
    codes = np.moveaxis(codes[..., : q.shape[q.axis]], -1, q.axis)
    scales = per_element(np.asarray(q.scales).astype(np.float64), q)
    values = np.asarray(implementation.dequantize(q), np.float64)
    return Decoded(values, scales, codes, float(global_decode_scale_jit(q.amax)))


# One compiled program instead of the division's many eager ops.
global_decode_scale_jit = jax.jit(scales.global_decode_scale)


rht_jit = jax.jit(hadamard.rht, static_argnums=(1, 2))


def reference_values(x: jax.Array, q: NVFP4Array, signs: Sequence[int] | None) -> np.ndarray:
    """The values ``q`` encodes, in float64: ``x``, or ``rht(x)`` for a rotated ``q``."""
    if q.hadamard:
        return f64(rht_jit(x, q.axis, None if signs is None else tuple(int(v) for v in signs)))
    return f64(x)


def quantize_options(x, q, axis, block_2d, hadamard, rounding, key, hadamard_signs):
    """``q``, or ``fp4jax.quantize(x, ...)``; checks that given options agree with ``q``."""
    if q is None:
        return implementation.quantize(
            x, axis=-1 if axis is None else axis, block_2d=bool(block_2d), rounding=rounding,
            key=key, hadamard=bool(hadamard), hadamard_signs=hadamard_signs)
    if not isinstance(q, NVFP4Array):
        raise TypeError(f"q must be an fp4jax.NVFP4Array, got {type(q).__name__}")
    if tuple(x.shape) != tuple(q.shape):
        raise ValueError(f"x has shape {x.shape} but q has shape {q.shape}")
    for name, given, actual in (("axis", axis, q.axis), ("block_2d", block_2d, q.block_2d),
                                ("hadamard", hadamard, q.hadamard)):
        if given is None:
            continue
        if name == "axis":
            given = int(given) % x.ndim
        if given != actual:
            raise ValueError(f"{name}={given!r} was given but q has {name}={actual!r}")
    return q


def grid_spacing(u: np.ndarray) -> np.ndarray:
    """Distance between the E2M1 grid neighbours of magnitudes ``u`` (0.5, 1 or 2)."""
    return np.where(u < 2.0, 0.5, np.where(u < 4.0, 1.0, 2.0))


def decode_steps(q: NVFP4Array) -> tuple[np.ndarray, np.ndarray, float]:
    """Per element: the block decode scale ``s`` and ``s · gds``; and ``gds``."""
    d = decode(q)
    return d.scales, d.scales * d.gds, d.gds


def describe(idx, q, extra: str = "") -> str:
    return f"element {idx} (block {block_of(idx, q)} along axis {q.axis}{extra})"


def first_difference(got, want) -> tuple[int, tuple[int, ...]] | None:
    got, want = np.asarray(got), np.asarray(want)
    both_nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    diff = (bits(got) != bits(want)) & ~both_nan
    if not diff.any():
        return None
    return int(diff.sum()), unravel(int(np.argmax(diff)), got.shape)
