"""Roundings that XLA cannot elide.

Under ``jit`` on the GPU, XLA's default ``xla_allow_excess_precision`` deletes
round trips such as ``x.astype(jnp.float8_e4m3fn).astype(jnp.float32)``: the
"rounded" value silently keeps full precision. Every rounding fp4jax needs is
therefore written with integer bit operations, comparisons and
``lax.round`` (round-half-to-even on an exact quotient by a power of two),
which no compiler may drop. All functions take and return float32 values; the
results are exactly representable in the target format.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

_U32 = jnp.uint32


def _bits(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(x, _U32)


def _from_bits(b: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(b.astype(_U32), jnp.float32)


def round_to_format(x: jax.Array, mantissa_bits: int, min_normal_exp: int) -> jax.Array:
    """Rounds float32 ``x`` to nearest-even in a binary format (no overflow handling).

    The format has ``mantissa_bits`` explicit significand bits, normal numbers down to
    ``2**min_normal_exp`` and subnormals below (spaced ``2**(min_normal_exp -
    mantissa_bits)``). The quantum of ``x`` is a power of two ``q``; ``x / q`` is exact,
    ``lax.round`` rounds it half-to-even, and ``* q`` is exact again.

    Requires ``min_normal_exp - mantissa_bits >= -126`` (``q`` must be a normal float32).

    Mathematically equivalent to::

      float(np.float32(x).astype(fmt))   # for |x| within the format's range
    """
    if min_normal_exp - mantissa_bits < -126:
        raise ValueError("quantum would be a float32 subnormal")
    x = x.astype(jnp.float32)
    exp = ((_bits(x) >> 23) & 0xFF).astype(jnp.int32) - 127
    e = jnp.maximum(exp, min_normal_exp)
    q = _from_bits(((e - mantissa_bits + 127) << 23).astype(_U32))
    return lax.round(x / q, lax.RoundingMethod.TO_NEAREST_EVEN) * q


def round_to_e4m3(x: jax.Array) -> jax.Array:
    """Rounds non-negative float32 values in ``[0, 448]`` to ``float8_e4m3fn`` (RNE).

    Subnormals (multiples of ``2**-9`` below ``2**-6``) are kept. The result is a
    float32 holding an exact E4M3 value.
    """
    return round_to_format(x, 3, -6)


def round_to_bf16(x: jax.Array) -> jax.Array:
    """Rounds float32 to bfloat16 (RNE; overflow goes to ±inf, NaN stays NaN).

    Uses the integer carry trick on the float32 bit pattern.
    """
    x = x.astype(jnp.float32)
    b = _bits(x)
    r = (b + _U32(0x7FFF) + ((b >> 16) & _U32(1))) & _U32(0xFFFF0000)
    return jnp.where(jnp.isnan(x), x, _from_bits(r))


def round_to_f16(x: jax.Array) -> jax.Array:
    """Rounds float32 to float16 (RNE, subnormals kept, overflow to ±inf)."""
    x = x.astype(jnp.float32)
    r = round_to_format(x, 10, -14)
    return jnp.where(jnp.abs(r) > 65504.0, jnp.copysign(jnp.inf, x), r)


def round_to_dtype(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Rounds float32 ``x`` to ``dtype``'s precision, returning float32 values."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float32:
        return x.astype(jnp.float32)
    if dtype == jnp.bfloat16:
        return round_to_bf16(x)
    if dtype == jnp.float16:
        return round_to_f16(x)
    raise TypeError(f"no elision-proof rounding to {dtype}")


def e2m1_code_nearest(a: jax.Array) -> jax.Array:
    """E2M1 magnitude code (0..7) of ``a = |v|`` in ``[0, 6]``, round-to-nearest-even.

    Ties: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4 (RECIPE.md §2.6). NaN
    maps to 0, as in Transformer Engine's reference.
    """
    m = (
        (a > 0.25).astype(jnp.uint8)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    )
    return m.astype(jnp.uint8)


def e2m1_code_of_grid_value(g: jax.Array) -> jax.Array:
    """E2M1 magnitude code (0..7) of a value ``g`` that lies on the E2M1 grid."""
    m = (
        (g >= 0.5).astype(jnp.uint8)
        + (g >= 1.0)
        + (g >= 1.5)
        + (g >= 2.0)
        + (g >= 3.0)
        + (g >= 4.0)
        + (g >= 6.0)
    )
    return m.astype(jnp.uint8)


def e2m1_code_stochastic(a: jax.Array, u24: jax.Array) -> jax.Array:
    """E2M1 magnitude code of ``a = |v|`` in ``[0, 6]`` by unbiased stochastic rounding.

    With grid neighbours ``lo <= a < hi`` (spacing ``h = hi - lo`` of 0.5, 1 or 2),
    rounds up iff ``u24 < (a - lo) / h * 2**24``: probability ``(a - lo) / h`` to
    within ``2**-24``. ``a - lo`` and the division by ``h`` are exact.

    Args:
      a: float32 magnitudes in ``[0, 6]``.
      u24: uint32 uniform random integers in ``[0, 2**24)``, one per element.
    """
    h = jnp.where(a < 2.0, 0.5, jnp.where(a < 4.0, 1.0, 2.0)).astype(jnp.float32)
    lo = jnp.floor(a / h) * h
    frac = (a - lo) / h
    up = u24.astype(jnp.float32) < frac * 16777216.0
    return e2m1_code_of_grid_value(jnp.where(up, lo + h, lo))
