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

from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

Rounding = Literal["nearest", "stochastic"]
"""E2M1 element rounding: round-to-nearest-even or unbiased stochastic rounding."""

ROUNDINGS: tuple[str, ...] = ("nearest", "stochastic")

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
    inv_q = _from_bits(((mantissa_bits - e + 127) << 23).astype(_U32))  # exact 1/q
    return lax.round(x * inv_q, lax.RoundingMethod.TO_NEAREST_EVEN) * q


def div_rn(a: jax.Array, b: jax.Array) -> jax.Array:
    """Correctly rounded float32 ``a / b`` for ``a >= 0``, ``b >= 0``, computed with integers.

    GPU compilers may lower float division to an approximate reciprocal (an ulp off),
    which flips E4M3 scale roundings. This division is exact to the last bit on every
    backend: significands are divided by 8-bit long division in uint32, then rounded to
    nearest-even (subnormal results and overflow to ``inf`` included). ``b == 0`` gives
    ``inf`` (``a > 0``); ``a == 0`` gives 0. Inputs must be finite and non-negative.

    Mathematically equivalent to::

      np.float32(a) / np.float32(b)
    """
    a = jnp.asarray(a, jnp.float32)
    b = jnp.asarray(b, jnp.float32)
    a, b = jnp.broadcast_arrays(a, b)
    i32 = jnp.int32

    def unpack(x):
        bits = _bits(x)
        e = ((bits >> 23) & 0xFF).astype(i32)
        m = bits & _U32(0x7FFFFF)
        # Normalize subnormals so the significand is in [2**23, 2**24).
        shift = jnp.where(e == 0, lax.clz(jnp.maximum(m, _U32(1))).astype(i32) - 8, 0)
        m = jnp.where(e == 0, m << shift.astype(_U32), m | _U32(0x800000))
        return jnp.where(e == 0, 1 - shift, e), m

    ea, ma = unpack(a)
    eb, mb = unpack(b)
    mb = jnp.maximum(mb, _U32(1))
    # Q = floor(ma * 2**25 / mb) by long division: 1 integer bit, then 8 + 8 + 8 + 1 bits.
    q = ma // mb
    r = ma - q * mb
    for width in (8, 8, 8, 1):
        r = r << width
        d = r // mb
        r = r - d * mb
        q = (q << width) | d
    sticky = r != 0
    big = q >= _U32(1 << 25)  # ma / mb in [1, 2)
    sig = jnp.where(big, q >> 2, q >> 1)  # 24 significant bits
    rb = jnp.where(big, (q >> 1) & 1, q & 1)
    sticky = sticky | (big & ((q & 1) != 0))
    e = ea - eb + 127 - jnp.where(big, 0, 1)  # biased exponent of the result

    # Normal result: round to nearest even.
    up = (rb == 1) & (sticky | ((sig & 1) == 1))
    sig_n = sig + up.astype(_U32)
    carry = sig_n >= _U32(1 << 24)
    e_n = e + carry.astype(i32)
    sig_n = jnp.where(carry, sig_n >> 1, sig_n)
    normal_bits = (jnp.clip(e_n, 1, 254).astype(_U32) << 23) | (sig_n & _U32(0x7FFFFF))
    normal_bits = jnp.where(e_n >= 255, _U32(0x7F800000), normal_bits)

    # Subnormal result: value = ext * 2**(e - 2 - 149 + 127 ...), i.e. shift ext right by 2 - e.
    ext = (sig << 1) | rb
    t = jnp.clip(2 - e, 1, 31).astype(_U32)
    kept = ext >> t
    rem = ext & ((_U32(1) << t) - 1)
    half = _U32(1) << (t - 1)
    sub_up = (rem > half) | ((rem == half) & (sticky | ((kept & 1) == 1)))
    sub_bits = jnp.where(2 - e >= 32, _U32(0), kept + sub_up.astype(_U32))

    bits = jnp.where(e >= 1, normal_bits, sub_bits)
    # Zero tests on the bits: XLA on CPU flushes subnormals to zero in float compares.
    bits = jnp.where((_bits(b) & _U32(0x7FFFFFFF)) == 0, _U32(0x7F800000), bits)
    bits = jnp.where((_bits(a) & _U32(0x7FFFFFFF)) == 0, _U32(0), bits)
    return _from_bits(bits)


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

    Ties: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4 (docs/RECIPE.md §2.6). NaN
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


def e2m1_code_stochastic(a: jax.Array, u8: jax.Array) -> jax.Array:
    """E2M1 magnitude code of ``a = |v|`` in ``[0, 6]`` by stochastic rounding, 8 random bits.

    With grid neighbours ``lo <= a < hi`` (spacing ``h`` of 0.5, 1 or 2) and
    ``f = (a - lo) / h``, rounds up iff ``2·u8 + 1 < 512·f``. Over ``u8`` uniform in
    ``[0, 256)`` the probability is ``f`` rounded to a multiple of ``2**-8``, so the
    expected result is within ``h · 2**-9`` of ``a`` (docs/RECIPE.md §5). Every step is
    exact: ``a - lo``, the scaling by ``1/h`` and by 512 are exact in float32.

    Args:
      a: float32 magnitudes in ``[0, 6]``.
      u8: uint32 uniform random integers in ``[0, 256)``, one per element.
    """
    h = jnp.where(a < 2.0, 0.5, jnp.where(a < 4.0, 1.0, 2.0)).astype(jnp.float32)
    inv_h = jnp.where(a < 2.0, 2.0, jnp.where(a < 4.0, 1.0, 0.5)).astype(jnp.float32)
    lo = jnp.floor(a * inv_h) * h  # products with powers of two: exact
    frac = (a - lo) * inv_h
    up = (u8 * jnp.uint32(2) + jnp.uint32(1)).astype(jnp.float32) < frac * 512.0
    return e2m1_code_of_grid_value(jnp.where(up, lo + h, lo))
