"""Elementwise in-kernel numerics of the quantize kernels (bit tricks on uint32 words).

Every rounding here is done with integer/bit operations or exact float operations,
and the float operations are those of the reference (`fp4jax.reference.quantization`)
in the same order, so nothing can be elided or contracted into a different rounding:

* 16-bit inputs arrive as uint32 words holding two adjacent elements (even in the low
  half); `unpack_words` splits them into float32.
* `rne_to_16bit`: integer round-to-nearest-even to bf16/f16 precision (the RHT output);
  `round_to_16bit` picks it or the GPU's conversion instruction.
* `e4m3_block_scale`: the E4M3 block decode scale by the integer carry trick, and
  `encode_scale` / `mantissa_recips`: its reciprocal without an in-kernel float division
  (GPU float32 division is not correctly rounded).
* `nibble_nearest` / `nibble_stochastic`: the E2M1 code by a magic-number addition
  whose result bits are the code; stochastic rounding from 8 random bits per element.
  `value_nearest` / `value_stochastic`: the same roundings' signed values, and
  `values_pair`: two of them times their block scales as a bf16x2 word (decoded copies).
* `hash32` / `sr_key_words` / `sr_byte`: the counter-based stochastic-rounding bits of
  `fp4jax.numerics.random_bits` (one 32-bit hash per 4 elements, one byte each).
* `rht16_butterfly`: the 16-point fast Walsh-Hadamard butterfly of
  `fp4jax.numerics.hadamard.rht`, over 16 separate register arrays.

All functions work on jnp arrays inside a kernel and in plain JAX.

Example:
  >>> import jax.numpy as jnp
  >>> from pallas_kernels import bit_tricks
  >>> codes = bit_tricks.nibble_nearest(jnp.array([0.5, -6.0, 2.6]), jnp.float32(1.0))
  >>> [int(c) for c in codes]  # 0.5 -> 1, -6 -> 8 | 7, 2.6 -> 3.0 (code 5)
  [1, 15, 5]
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax.numerics import random_bits, scales
from fp4jax.numerics.constants import BLOCK, E2M1_MAX, E4M3_MAX, FLT_MAX

_U32 = jnp.uint32
_F32 = jnp.float32


def _f32(u):
    return lax.bitcast_convert_type(u, _F32)


def _u32(f):
    return lax.bitcast_convert_type(f, _U32)


def unpack_words(w: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """(even, odd) float32 elements of uint32 words holding two 16-bit values."""
    if dtype == jnp.bfloat16:
        return _f32(w << 16), _f32(w & _U32(0xFFFF0000))
    lo = lax.bitcast_convert_type((w & _U32(0xFFFF)).astype(jnp.uint16), jnp.float16)
    hi = lax.bitcast_convert_type((w >> 16).astype(jnp.uint16), jnp.float16)
    return lo.astype(_F32), hi.astype(_F32)


def rne_to_16bit(y: jax.Array, dtype) -> jax.Array:
    """RNE of float32 ``y`` to bf16/f16 precision with integer ops (NaN not preserved).

    Same results as `fp4jax.numerics.rounding.round_to_dtype` for every non-NaN input;
    callers handle NaN at block level.
    """
    b = _u32(y)
    if dtype == jnp.bfloat16:
        return _f32((b + _U32(0x7FFF) + ((b >> 16) & _U32(1))) & _U32(0xFFFF0000))
    sign = b & _U32(0x80000000)
    mag = b & _U32(0x7FFFFFFF)
    normal = (mag + _U32(0xFFF) + ((mag >> 13) & _U32(1))) & _U32(0xFFFFE000)
    # Below 2**-14 the quantum is 2**-24: |y| + 0.5 rounds at exactly that spacing and
    # its low bits count the quanta (no add-then-subtract, which XLA would fold).
    sub = _u32((_u32(_f32(mag) + 0.5) - _U32(0x3F000000)).astype(_F32) * np.float32(2.0**-24))
    r = jnp.where(mag < _U32(0x38800000), sub, normal)
    r = jnp.where(_f32(r) > 65504.0, _U32(0x7F800000), r)  # float16's largest finite
    return _f32(r | sign)


def round_to_16bit(y: jax.Array, dtype, *, hardware: bool) -> jax.Array:
    """RNE of float32 ``y`` to bf16/f16 precision, as float32 (NaN not preserved).

    ``hardware=True`` converts with the GPU's instruction (``cvt.rn`` to bf16/f16 and
    back: the IEEE round-to-nearest-even of `rne_to_16bit`, overflow to inf included) at
    ~1.5 ALU instructions per element instead of 4 (bf16) or ~12 (f16); the quantize
    kernels are ALU-bound (docs/BENCHMARKS.md). Inside a Mosaic GPU kernel nothing
    removes the round trip (LLVM keeps ``fpext(fptrunc(y))``). In interpret mode the
    kernel is an XLA program, whose simplifier may delete it, so there
    ``hardware=False``: the integer form.
    """
    if hardware:
        return y.astype(dtype).astype(_F32)
    return rne_to_16bit(y, dtype)


def round_block_max(m: jax.Array, dtype) -> jax.Array:
    """Rounds a non-negative max to ``dtype``, keeping NaN."""
    return jnp.where(m != m, m, rne_to_16bit(m, dtype))  # noqa: PLR0124 - a NaN test


def finite_or_zero(x: jax.Array) -> jax.Array:
    """``x`` with NaN/±inf replaced by 0 (the reference ignores non-finite values)."""
    return jnp.where(jnp.abs(x) < np.float32(np.inf), x, 0.0)


OVERFLOW = {jnp.dtype(jnp.bfloat16): np.float32(np.uint32(0x7F7F8000).view(np.float32)),
            jnp.dtype(jnp.float16): np.float32(65520.0)}
"""Smallest float32 magnitude that rounds to inf in each 16-bit dtype."""


def mantissa_recips(gds: jax.Array) -> jax.Array:
    """``fl(1 / fl((1 + m/8) · gds))`` for ``m = 0..7`` along a new last axis, correctly
    rounded: float32[8] for a scalar ``gds``, ``gds.shape[:-1] + (8,)`` for ``(..., 1)``.

    Computed outside the kernel (`fp4jax.numerics.scales.block_encode_scale`, an integer
    division exact on every backend); `encode_scale` scales them by powers of two.
    """
    mant = np.float32(1.0) + jnp.arange(8, dtype=_F32) * np.float32(0.125)
    return scales.block_encode_scale(mant, gds)


EXACT_FROM = np.float32(2.0**-125)
"""`encode_scale` is division-free where ``gds`` and ``fl(s · gds)`` are at least this..."""

EXACT_TO = np.float32(2.0**117)
"""...and ``gds`` at most this (any gds of a float32 amax is: gds <= FLT_MAX / 2688)."""


def encode_scale(s: jax.Array, gds, recips) -> jax.Array:
    """The block encode scale ``min(fl(1 / fl(s · gds)), FLT_MAX)`` of the reference, exactly.

    GPU float32 division is not correctly rounded: XLA sets LLVM's NVPTX division to
    ``div.full.f32`` (up to 2 ulp off) process-wide, and Mosaic GPU compiles in the same
    process. So the quotient is not divided here. An E4M3 value is ``s = 2**E (1 + m/8)``
    (a normal float32, E4M3 subnormals included); while ``fl((1 + m/8) gds)`` and ``fl(s
    gds)`` are normal floats, ``fl(s gds) = 2**E fl((1 + m/8) gds)`` and its correctly
    rounded reciprocal is ``2**-E · recips[m]`` (scaling by a power of two is exact in the
    normal range; the reciprocal is at most ``2**125``: no clamp). Both hold when ``gds``
    and ``fl(s gds)`` are at least `EXACT_FROM` and ``gds`` at most `EXACT_TO`: for every
    block of absolute max above ~1e-37. Elsewhere (``s = 0``, or blocks near float32's
    subnormal range) the float division remains: exact on the CPU, and ``1 / 0 = inf``
    clamps to ``FLT_MAX`` on every backend.

    Args:
      s: float32 holding exact non-negative E4M3 values; gds: the global decode scale.
      recips: the 8 values of `mantissa_recips(gds)` (a sequence of scalars).
    """
    sb = _u32(s)
    m = (sb >> 20) & _U32(7)
    pick = [(m & _U32(bit)) != _U32(0) for bit in (1, 2, 4)]
    r = [jnp.where(pick[0], recips[2 * i + 1], recips[2 * i]) for i in range(4)]
    r = [jnp.where(pick[1], r[2 * i + 1], r[2 * i]) for i in range(2)]
    r = jnp.where(pick[2], r[1], r[0])
    inv_pow2 = _f32(_U32(254 << 23) - (sb & _U32(0x7F800000)))  # 2**-E, exact (s >= 2**-9)
    y = s * gds
    exact = (y >= EXACT_FROM) & (gds >= EXACT_FROM) & (gds <= EXACT_TO)
    return jnp.minimum(jnp.where(exact, r * inv_pow2, 1.0 / y), FLT_MAX)


def e4m3_block_scale(bamax: jax.Array, gds, mult, recips):
    """Block scales from block amaxes (docs/RECIPE.md §2.4-2.5).

    Args:
      bamax: float32 block amaxes.
      gds: the global decode scale ``fl(1 / ges)``.
      mult: ``fl(ges · fl(1/6))``.
      recips: `mantissa_recips(gds)`, for `encode_scale`.

    Returns:
      (enc, code, dec): float32 per-block encode scale, uint32 E4M3 bit pattern of the
      decode scale, and that decode scale as float32 (NaN for NaN blocks, whose codes
      are 0: what `values_pair` multiplies).
    """
    d = jnp.minimum(bamax * mult, E4M3_MAX)
    dbits = _u32(d)
    s_norm = (dbits + _U32(0x7FFFF) + ((dbits >> 20) & _U32(1))) & _U32(0xFFF00000)
    # Below 2**-6 (E4M3 subnormals) the quantum is 2**-9: d + 2**14 rounds at exactly
    # that spacing and its low bits count the quanta (= the E4M3 code).
    code_sub = _u32(d + 16384.0) - _U32(0x46800000)
    small = d < np.float32(2.0**-6)
    s = jnp.where(small, code_sub.astype(_F32) * np.float32(2.0**-9), _f32(s_norm))
    code_norm = (((s_norm >> 23) - _U32(120)) << 3) | ((s_norm >> 20) & _U32(7))
    ok = d == d  # noqa: PLR0124 - False for NaN
    code = jnp.where(ok, jnp.where(small, code_sub, code_norm), _U32(0x7F))
    return encode_scale(s, gds, recips), code, jnp.where(ok, s, np.float32(np.nan))


def values_pair(even: jax.Array, odd: jax.Array, dec: jax.Array,
                dec_odd: jax.Array | None = None) -> jax.Array:
    """Two signed E2M1 values (`value_nearest` / `value_stochastic`) times their blocks'
    decode scales (``dec``, and ``dec_odd`` for the odd element when its block differs), as
    the uint32 word of two bfloat16 values (the even element in the low half): the
    dequantized operand an emulated GEMM multiplies, bit for bit
    `fp4jax.reference.quantization.scaled_codes_bf16` (docs/RECIPE.md §9).

    E2M1 × E4M3 has at most 6 significant bits, so each float32 product's top 16 bits are
    its exact bfloat16 (NaN for a NaN block's scale, -0 for a negative value rounded to 0,
    as the reference decodes code 8).
    """
    lo = _u32(even * dec) >> 16
    hi = _u32(odd * (dec if dec_odd is None else dec_odd)) & _U32(0xFFFF0000)
    return lo | hi


def nibble_nearest(x: jax.Array, enc: jax.Array) -> jax.Array:
    """E2M1 code (uint32, 0..15) of ``x * enc`` by round-to-nearest-even.

    ``a = min(|v|, 6)``; adding ``C = 2**22, 2**23 + 2, 2**24 + 8`` for ``a`` in
    ``[0, 2), [2, 4), [4, 6]`` rounds ``a`` to the E2M1 grid (the float addition is RNE
    at exactly the grid spacing) and leaves the code in the low 3 bits of the sum.
    """
    v, total, _ = _magic_sum(x, enc)
    return (_u32(total) & _U32(7)) | jnp.where(v < 0, _U32(8), _U32(0))


def _magic_sum(x: jax.Array, enc: jax.Array):
    """``(v, a + C, C)`` of `nibble_nearest`: ``v = x * enc``, ``a = min(|v|, 6)`` and the
    magic constant ``C`` of ``a``'s range; the sum is ``C`` plus ``a`` rounded to the grid."""
    v = x * enc
    a = jnp.minimum(jnp.abs(v), E2M1_MAX)
    e = jnp.maximum(_u32(a) >> 23, _U32(127))
    c = _f32(e * _U32(0x800002) + _U32((0x4A800000 - 127 * 0x800002) & 0xFFFFFFFF))
    return v, a + c, c


def nibble_stochastic(x: jax.Array, enc: jax.Array, u8: jax.Array) -> jax.Array:
    """E2M1 code of ``x * enc`` by the reference's stochastic rounding (8 random bits).

    The rule of `fp4jax.numerics.rounding.e2m1_code_stochastic`: with grid neighbours
    ``lo <= a < lo + h`` of ``a = min(|x * enc|, 6)`` and ``frac = (a - lo) / h``, round up
    iff ``2 * u8 + 1 < 512 * frac``, i.e. iff ``a > lo + h (2 u8 + 1) / 512``. Computed
    without any int/float conversion (a quarter-rate instruction on the GPU) and with
    every float operation exact:

    * ``a >= 1``: the spacing is half the binade, so the code is the float's exponent and
      top mantissa bit, ``(bits(a) >> 22) - 252``, and ``frac * 2**22`` is the 22 mantissa
      bits below. Adding ``2**22 - 1 - ((2 * u8 + 1) << 13)`` carries into bit 22 exactly
      when ``(2 * u8 + 1) << 13`` is below those bits, i.e. when rounding up.
    * ``a < 1``: the spacing is 0.5 and ``lo`` is 0 or 0.5, so the threshold is
      ``lo + (2 u8 + 1) / 1024``: ``float(2**23 + 2 u8 + 1)`` from its bits, times
      ``2**-10``, plus ``lo - 8192`` (a product by a power of two and a sum whose exact
      result is a float: exact, fused into one multiply-add or not), compared with ``a``.

    Args:
      x: float32 values; enc: their float32 encode scales.
      u8: uint32 random bytes in ``[0, 256)``, one per element (`sr_byte`).
    """
    v, at_least_one, carried, half, above = _stochastic_steps(x, enc, u8)
    big = (carried - _U32(252 << 22)) >> 22
    small = jnp.where(half, _U32(1), _U32(0)) + jnp.where(above, _U32(1), _U32(0))
    return jnp.where(at_least_one, big, small) | jnp.where(v < 0, _U32(8), _U32(0))


def _stochastic_steps(x: jax.Array, enc: jax.Array, u8: jax.Array):
    """The decisions of `nibble_stochastic`: ``(v, a >= 1, carried, a >= 0.5, a above the
    random threshold)``, with ``v = x * enc``, ``a = min(|v|, 6)`` and ``carried`` the bits
    of ``a`` plus ``2**22 - 1 - ((2 u8 + 1) << 13)`` (for ``a >= 1`` its top 10 bits are the
    rounded value's)."""
    v = x * enc
    a = jnp.minimum(jnp.abs(v), E2M1_MAX)
    b = _u32(a)
    carried = b - (u8 << 14) + _U32(0x3FDFFF)
    half = a >= np.float32(0.5)
    threshold = (_f32((u8 << 1) | _U32(0x4B000001)) * np.float32(2.0**-10)
                 + jnp.where(half, np.float32(-8191.5), np.float32(-8192.0)))
    return v, b >= _U32(0x3F800000), carried, half, a > threshold


def value_nearest(x: jax.Array, enc: jax.Array) -> jax.Array:
    """``e2m1(nibble_nearest(x, enc))`` as a signed float32, without forming the code.

    The magic addition of `nibble_nearest` rounds ``a`` to ``r`` on the E2M1 grid:
    ``a + C = C + r`` exactly, so ``(a + C) - C = r`` exactly (both operands share a
    binade). A value the code would mark negative (``v < 0``) is ``-r``, so a negative
    value rounded to 0 is -0, the reference's decode of code 8. Two float additions
    replace the code's integer masking, sign select and the decode's integer ops: the
    kernels that write decoded copies are ALU-bound (docs/BENCHMARKS.md).
    """
    v, total, c = _magic_sum(x, enc)
    r = total - c
    return jnp.where(v < 0, -r, r)


def value_stochastic(x: jax.Array, enc: jax.Array, u8: jax.Array) -> jax.Array:
    """``e2m1(nibble_stochastic(x, enc, u8))`` as a signed float32, without forming the code.

    The same rounding decisions as `nibble_stochastic`: for ``a >= 1`` the carry that
    makes the code ``(bits >> 22) - 252`` leaves the rounded value's float32 bits in the
    top 10 bits, so masking the low 22 bits is the value; below 1 the value is 0.5 per
    step taken (``a >= 0.5``, and ``a`` above the random threshold).
    """
    v, at_least_one, carried, half, above = _stochastic_steps(x, enc, u8)
    big = _f32(carried & _U32(0xFFC00000))
    small = (jnp.where(half, np.float32(0.5), np.float32(0.0))
             + jnp.where(above, np.float32(0.5), np.float32(0.0)))
    r = jnp.where(at_least_one, big, small)
    return jnp.where(v < 0, -r, r)


def hash32(k0, k1, k2, counter):
    """`fp4jax.numerics.random_bits.hash_bits` of a uint32 counter, with ``k2 = k0 * 0x9E3779B9``
    precomputed (`sr_key_words`): the 32 random bits of four elements."""
    h = random_bits.mix32(counter ^ k0)
    h = random_bits.mix32(h + k1)
    return random_bits.mix32(h ^ k2)


def sr_byte(word: jax.Array, i: int) -> jax.Array:
    """Byte ``i`` (0..3, static) of uint32 words: element ``4j + i``'s bits in word ``j``."""
    if i == 3:
        return word >> 24
    return (word >> (8 * i) if i else word) & _U32(0xFF)


def sr_key_words(key) -> jax.Array:
    """``(k0, k1, k0 * 0x9E3779B9)`` of a key as uint32[3] (zeros for None): `hash32`'s keys."""
    if key is None:
        return jnp.zeros((3,), _U32)
    k0, k1 = random_bits.key_words(key)
    return jnp.stack([k0, k1, k0 * _U32(0x9E3779B9)])


def rht16_butterfly(vals: Sequence[jax.Array], signs: Sequence[int]) -> list[jax.Array]:
    """The 16-point butterfly of `fp4jax.numerics.hadamard.rht` (without the final * 0.25)."""
    y = [v if s > 0 else -v for v, s in zip(vals, signs)]
    h = 1
    while h < BLOCK:
        nxt = list(y)
        for start in range(0, BLOCK, 2 * h):
            for i in range(start, start + h):
                a, b = y[i], y[i + h]
                nxt[i], nxt[i + h] = a + b, a - b
        y = nxt
        h *= 2
    return y
