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
import numpy as np
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


def _unpack_constant(a: float) -> tuple[int, np.uint32]:
    """`_unpack` of a concrete nonzero float32, at trace time."""
    bits = int(np.float32(a).view(np.uint32))
    e = (bits >> 23) & 0xFF
    m = (bits & 0x7FFFFF) | (0x800000 if e else 0)
    shift = 24 - m.bit_length()
    return max(e, 1) - shift, np.uint32(m << shift)


def _unpack(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(biased exponent, significand in [2**23, 2**24)) with ``x = m · 2**(e - 150)``
    for a finite non-negative float32 (subnormals normalized; 0 gives m = 2**23)."""
    bits = _bits(x)
    e = bits >> 23
    f = bits & _U32(0x7FFFFF)
    m = jnp.maximum(lax.select(e > 0, f | _U32(0x800000), f), _U32(1))
    shift = lax.clz(m) - _U32(8)  # 0 unless subnormal
    e = jnp.maximum(e, _U32(1)).astype(jnp.int32) - shift.astype(jnp.int32)
    return e, m << shift


def div_rn(a: jax.typing.ArrayLike, b: jax.typing.ArrayLike) -> jax.Array:
    """Correctly rounded float32 ``a / b`` for ``a >= 0``, ``b >= 0``, computed with integers.

    GPU compilers may lower float division to an approximate reciprocal (an ulp off),
    which flips E4M3 scale roundings. This division is exact to the last bit on every
    backend: the significands are divided by long division in uint32, whose digits are
    estimated in float32 and then corrected exactly, and the quotient is rounded to
    nearest-even (subnormal results and overflow to ``inf`` included). ``b == 0`` gives
    ``inf`` (``a > 0``); ``a == 0`` gives 0. Inputs must be finite and non-negative.

    It computes per-tensor scales, so every quantization and every GEMM runs it a few
    times, and its size is a large part of a quantized model's program: it is written
    for the compiler (docs/BENCHMARKS.md, "Compile time"). About 120 operations; a
    concrete ``a`` (e.g. ``np.float32(1.0)``) is unpacked at trace time. No divide:
    XLA starts a new fusion at every divide and recomputes the cheap operations upstream
    of it in each. Two digits: a bit-serial division's long dependency chain makes
    LLVM's CPU loop vectorizer run for minutes. Callers that feed a scalar result to a
    pass over a whole tensor put it behind ``lax.optimization_barrier`` (the quantizer,
    `fp4jax.numerics.scales.output_scale`): XLA would otherwise fuse the division into
    that pass, i.e. repeat it per element.

    Mathematically equivalent to::

      np.float32(a) / np.float32(b)

    Example:
      >>> import numpy as np
      >>> float(div_rn(np.float32(1.0), np.float32(3.0))) == float(np.float32(1) / np.float32(3))
      True
    """
    b = jnp.asarray(b, jnp.float32)
    concrete_a = np.ndim(a) == 0 and isinstance(a, (int, float, np.ndarray, np.generic))
    if concrete_a and np.float32(a) != 0:  # e.g. the scales' 2688 and 1
        ea, ma = _unpack_constant(float(a))
        shape = b.shape
    else:
        concrete_a = False
        a = jnp.asarray(a, jnp.float32)
        shape = jnp.broadcast_shapes(a.shape, b.shape)
        a = jnp.broadcast_to(a, shape)
        ea, ma = _unpack(a)
    b = jnp.broadcast_to(b, shape)
    eb, mb = _unpack(b)
    i32 = jnp.int32
    # Q = floor(ma · 2**25 / mb), in (2**24, 2**26), in two digits of 13 and 12 bits. Each
    # digit is estimated in float32 from an approximate reciprocal of mb (a linear guess
    # and three Newton steps: relative error ~2**-22, whatever the backend's rounding or
    # contraction of these float operations), so it is off by at most one (its estimate
    # is below 2**14); it is then corrected against the exact remainder, computed in
    # wrapping uint32 arithmetic: the true remainder lies in (-2**25, 2**25), so its
    # top bit is its sign.
    x = mb.astype(jnp.float32) * np.float32(2.0**-24)  # [1/2, 1)
    y = np.float32(48 / 17) - np.float32(32 / 17) * x  # ≈ 1/x, |relative error| <= 1/17
    for _ in range(3):
        y = y + y * (np.float32(1.0) - x * y)
    q = None
    r = ma
    for width in (13, 12):
        if isinstance(r, np.generic):  # the first digit of a concrete numerator
            rf, shifted = np.float32(r), np.uint32((int(r) << width) & 0xFFFFFFFF)
        else:
            rf, shifted = r.astype(jnp.float32), r << width
        # Non-negative: the conversion truncates, i.e. floors (no floor op: Mosaic GPU
        # kernels, which could compute the scales in-kernel, do not lower one).
        est = (rf * (y * np.float32(2.0 ** (width - 24)))).astype(_U32)
        rem = shifted - est * mb  # the remainder mod 2**32: exact, as |rem| < 2**25
        # Corrected with unsigned compares and selects only (no signed view of the bits,
        # no multiply by a wrapped -1): the same in XLA and in a Mosaic GPU kernel.
        low = rem >= _U32(2**31)  # the estimate was one too big: rem < 0
        high = (rem >= mb) & ~low  # one too small
        d = lax.select(low, est - _U32(1), lax.select(high, est + _U32(1), est))
        r = lax.select(low, rem + mb, lax.select(high, rem - mb, rem))
        q = d if q is None else (q << width) | d
    # q2 = (q << 1) | sticky holds the rounding information of the exact quotient.
    q2 = (q << 1) | (r != 0).astype(_U32)
    # a / b = Q · 2**(ea - eb - 25). A float32 with biased exponent E >= 1 and significand
    # M in [2**23, 2**24) (M < 2**23 for subnormals, E = 1) has the bits (E - 1) · 2**23 + M,
    # so a rounding carry out of M moves into the exponent (and 254 into inf) by itself.
    big = (q >> 25).astype(i32)  # Q has 25 + big bits
    e = (ea + 126) - eb + big  # E of the result if it is normal
    s = jnp.minimum(jnp.maximum(1 - e, 0) + big + 2, 31).astype(_U32)  # bits dropped
    half_m1 = (_U32(1) << (s - _U32(1))) - _U32(1)
    kept = (q2 + half_m1 + ((q2 >> s) & _U32(1))) >> s  # round half to even
    bits = ((jnp.maximum(e, 1) - 1).astype(_U32) << 23) + kept
    bits = lax.select(e >= 255, jnp.full(shape, 0x7F800000, _U32), bits)
    # Zero tests on the bits: XLA on CPU flushes subnormals to zero in float compares.
    bits = lax.select((_bits(b) & _U32(0x7FFFFFFF)) == 0, jnp.full(shape, 0x7F800000, _U32),
                      bits)
    if not concrete_a:
        bits = lax.select((_bits(a) & _U32(0x7FFFFFFF)) == 0, jnp.zeros(shape, _U32), bits)
    return lax.bitcast_convert_type(bits, jnp.float32)


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
