"""The quantize kernels' in-kernel numerics (`pallas_kernels.bit_tricks`) in plain JAX."""

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax.numerics import random_bits, rounding
from fp4jax.numerics.constants import E2M1_VALUES
from pallas_kernels import bit_tricks as bits


def _values():
    """Magnitudes across [0, 7]: the E2M1 grid, its midpoints, values one float32 ulp on
    either side of both, random values, tiny values, and their negatives (and -0)."""
    grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    edges = np.concatenate([grid, mids])
    near = np.concatenate([np.nextafter(edges, np.float32(-1)), np.nextafter(edges, np.float32(9))])
    rand = np.random.default_rng(0).uniform(0, 7, 600).astype(np.float32)
    tiny = np.array([1e-30, 2.0**-126, 3e-8, 6.5, 7.0], np.float32)
    v = np.concatenate([edges, near, rand, tiny])
    return np.concatenate([v, -v, np.array([-0.0], np.float32)])


def test_nibble_stochastic_is_the_reference_rounding_for_every_byte():
    """For every random byte u8 (all 256) and values across the range, the kernel's code
    equals `rounding.e2m1_code_stochastic` with the sign bit: the same bits, not just
    the same distribution."""
    v = jnp.asarray(_values())
    u8 = jnp.arange(256, dtype=jnp.uint32)
    vv, uu = jnp.broadcast_arrays(v[:, None], u8[None, :])
    got = jax.jit(bits.nibble_stochastic)(vv, jnp.float32(1.0), uu)
    a = jnp.minimum(jnp.abs(vv), 6.0)
    want = rounding.e2m1_code_stochastic(a, uu) | jnp.where(vv < 0, 8, 0).astype(jnp.uint8)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_nibble_stochastic_is_the_reference_rounding_on_random_float32_bits():
    """Random float32 bit patterns over [0, 7] (every binade, subnormals included) and every
    rounding threshold, each
    with all 256 random bytes and an encode scale of 1 and of a non-power of two: the
    kernel's code equals `rounding.e2m1_code_stochastic` bit for bit."""
    rng = np.random.default_rng(1)
    pattern = rng.integers(0, np.float32(7.0).view(np.uint32), 6000, dtype=np.uint32)
    # Plus every rounding threshold lo + h * (2j + 1) / 512 (ties of the strict comparison).
    lo = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0], np.float32)
    h = np.array([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0], np.float32)
    ties = (lo[:, None] + h[:, None] * (2 * np.arange(256) + 1) / 512).astype(np.float32)
    v = np.concatenate([pattern.view(np.float32), ties.ravel()])
    v = v * np.where(rng.random(v.size) < 0.5, -1, 1).astype(np.float32)
    u8 = jnp.arange(256, dtype=jnp.uint32)
    for enc in (np.float32(1.0), np.float32(0.7371)):
        vv, uu = jnp.broadcast_arrays(jnp.asarray(v)[:, None], u8[None, :])
        got = jax.jit(bits.nibble_stochastic)(vv, jnp.float32(enc), uu)
        scaled = vv * jnp.float32(enc)
        a = jnp.minimum(jnp.abs(scaled), 6.0)
        want = rounding.e2m1_code_stochastic(a, uu) | jnp.where(scaled < 0, 8, 0).astype(
            jnp.uint8)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_sr_is_unbiased_to_its_resolution():
    """E[round(0.3)] over all 256 bytes is 0.3 to within h * 2**-9 (h = 0.5), exactly."""
    u8 = jnp.arange(256, dtype=jnp.uint32)
    codes = bits.nibble_stochastic(jnp.full((256,), 0.3, jnp.float32), jnp.float32(1.0), u8)
    mean = np.asarray(E2M1_VALUES, np.float64)[np.asarray(codes)].mean()
    assert abs(mean - 0.3) <= 0.5 * 2.0**-9


def test_nibble_nearest_matches_the_reference_code():
    """The magic-number E2M1 rounding equals `rounding.e2m1_code_nearest` with the sign."""
    v = jnp.concatenate([jnp.linspace(-7.0, 7.0, 4097), jnp.array([0.25, 0.75, 2.5, 5.0, -0.0])])
    want = rounding.e2m1_code_nearest(jnp.minimum(jnp.abs(v), 6.0)) | jnp.where(v < 0, 8, 0)
    np.testing.assert_array_equal(np.asarray(bits.nibble_nearest(v, jnp.float32(1.0))),
                                  np.asarray(want))


def test_hash32_is_the_reference_hash():
    key = jax.random.key(5)
    k0, k1, k2 = bits.sr_key_words(key)
    counter = jnp.concatenate([jnp.arange(1000, dtype=jnp.uint32),
                               jnp.array([2**32 - 1, 2**31, 4 * (2**30 - 1) + 3], jnp.uint32)])
    np.testing.assert_array_equal(np.asarray(bits.hash32(k0, k1, k2, counter)),
                                  np.asarray(random_bits.hash_bits(k0, k1, counter)))


def test_sr_byte_gives_the_reference_block_bytes():
    """Byte i of hash word j is the random byte of element 4j + i of the block, as
    `random_bits.block_bytes` draws them."""
    key = jax.random.key(3)
    k0, k1, k2 = bits.sr_key_words(key)
    blocks = jnp.array([0, 1, 77, 2**30 - 1], jnp.uint32)
    want = random_bits.block_bytes(key, blocks)  # (4, 16)
    for j in range(4):
        word = bits.hash32(k0, k1, k2, blocks * 4 + j)
        for i in range(4):
            np.testing.assert_array_equal(np.asarray(bits.sr_byte(word, i)),
                                          np.asarray(want[:, 4 * j + i]))


def test_hardware_16bit_rounding_is_the_integer_rounding():
    """`round_to_16bit(hardware=True)` (the conversion instruction the GPU kernels use)
    gives the bits of the integer `rne_to_16bit` for every non-NaN float32 class: ties of
    both parities, subnormal results, the overflow boundary, infinities and signed zeros.
    Run eagerly, so each cast is its own computation and cannot be elided."""
    rng = np.random.default_rng(3)
    words = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
                        0x7F7F8000, 0x7F7F7FFF, 0x477FEFFF, 0x477FF000, 0x477FF001,
                        0x38800000, 0x387FFFFF, 0x33800000, 0x33000000, 0x33000001,
                        0x3F808000, 0x3F818000, 0x00000001, 0x80400000], np.uint32)
    # Ties at bf16 precision with even and odd kept bits, across the exponent range.
    ties = (rng.integers(0, 2**16, 2000, dtype=np.uint32) << 16) | np.uint32(0x8000)
    y = np.concatenate([words, special, ties]).view(np.float32)
    y = y[~np.isnan(y)]
    for dtype in (jnp.bfloat16, jnp.float16):
        hw = np.asarray(bits.round_to_16bit(jnp.asarray(y), dtype, hardware=True))
        want = np.asarray(bits.rne_to_16bit(jnp.asarray(y), dtype))
        np.testing.assert_array_equal(hw.view(np.uint32), want.view(np.uint32),
                                      err_msg=str(jnp.dtype(dtype)))


def _signed_e2m1(codes: np.ndarray) -> np.ndarray:
    """The E2M1 value of each 4-bit code (code 8 is -0.0), float32."""
    mag = np.asarray(E2M1_VALUES, np.float32)[codes & 7]
    return np.where(codes & 8, -mag, mag).astype(np.float32)


def test_values_are_the_decoded_codes_bit_for_bit():
    """`value_nearest` / `value_stochastic` are the signed E2M1 values of `nibble_nearest` /
    `nibble_stochastic`'s codes, bit for bit (-0.0 included), for values across every
    binade and every rounding threshold, each random byte and two encode scales; and
    `values_pair` packs ``value · scale`` of two elements as bf16 halves of one word."""
    rng = np.random.default_rng(5)
    v = np.concatenate([_values(), rng.integers(0, np.float32(7.0).view(np.uint32), 1500,
                                                dtype=np.uint32).view(np.float32)])
    u8 = jnp.arange(256, dtype=jnp.uint32)
    vv, uu = jnp.broadcast_arrays(jnp.asarray(v)[:, None], u8[None, :])
    for enc in (jnp.float32(1.0), jnp.float32(0.7371)):
        for value, nibble, args in ((bits.value_nearest, bits.nibble_nearest, ()),
                                    (bits.value_stochastic, bits.nibble_stochastic, (uu,))):
            got = np.asarray(jax.jit(value)(vv, enc, *args))
            want = _signed_e2m1(np.asarray(jax.jit(nibble)(vv, enc, *args)))
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                          err_msg=value.__name__)
    ve, vo = _signed_e2m1(np.arange(16, dtype=np.uint32)), _signed_e2m1(
        np.arange(16, dtype=np.uint32)[::-1].copy())
    dec = np.float32(2.0**-9 * 3), np.float32(448.0)
    word = np.asarray(bits.values_pair(jnp.asarray(ve), jnp.asarray(vo), *map(jnp.float32, dec)))
    want = [(ve * dec[0]).astype(jnp.bfloat16), (vo * dec[1]).astype(jnp.bfloat16)]
    np.testing.assert_array_equal(word & 0xFFFF, want[0].view(np.uint16))
    np.testing.assert_array_equal(word >> 16, want[1].view(np.uint16))
