"""Properties of fp4jax.quantize / dequantize (docs/RECIPE.md §1–§5)."""

import functools

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp4jax
from fp4jax.numerics import hadamard, nvfp4_array, random_bits, rounding
from tests import np_reference as npr

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def _data(key, shape, dtype=jnp.float32, scale=1.0):
    """Heavy-tailed test data with varied block magnitudes (never all zeros)."""
    k1, k2 = jax.random.split(jax.random.key(key))
    x = jax.random.normal(k1, shape) * jnp.exp(2.0 * jax.random.normal(k2, shape[:-1] + (1,)))
    return (x * scale).astype(dtype)


def _bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


# ---------------------------------------------------------------- the format itself


def test_e2m1_decode_table_matches_recipe():
    """Every 4-bit code decodes to RECIPE.md §1's value (including code 8 = -0)."""
    codes = jnp.arange(16, dtype=jnp.uint8)
    got = np.asarray(nvfp4_array.e2m1_to_f32(codes))
    np.testing.assert_array_equal(_bits(got), _bits(npr.E2M1))
    np.testing.assert_array_equal(
        np.asarray(nvfp4_array.e2m1_to_bf16(codes)).astype(np.float32), npr.E2M1
    )
    # jnp.float4_e2m1fn uses the same encoding
    via_ml_dtypes = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(via_ml_dtypes))


def test_e2m1_round_to_nearest_even_ties():
    """Ties round to the even code: .25→0, .75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4."""
    a = jnp.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2500001, 5.0000005, 6.0])
    want = [0, 2, 2, 4, 4, 6, 6, 1, 7, 7]
    np.testing.assert_array_equal(np.asarray(rounding.e2m1_code_nearest(a)), want)
    np.testing.assert_array_equal(npr.E2M1[want][:7], [0, 1, 1, 2, 2, 4, 4])


def test_pack_unpack_roundtrip_and_nibble_order():
    """Even elements go to the low nibble; unpack inverts pack along any axis."""
    codes = jax.random.randint(jax.random.key(0), (6, 8, 4), 0, 16).astype(jnp.uint8)
    for axis in range(3):
        packed = nvfp4_array.pack_codes(codes, axis)
        np.testing.assert_array_equal(nvfp4_array.unpack_codes(packed, axis), codes)
    p = nvfp4_array.pack_codes(jnp.array([[3, 12]], jnp.uint8), 1)
    assert int(p[0, 0]) == 3 | (12 << 4)


def test_e4m3_rounding_is_exact_cast_for_all_codes_and_midpoints():
    """round_to_e4m3 equals ml_dtypes' float8_e4m3fn cast on every value and midpoint."""
    vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    vals = np.unique(vals[np.isfinite(vals) & (vals >= 0)])
    mids = (vals[:-1] + vals[1:]) / 2
    probes = np.concatenate([vals, mids, np.nextafter(mids, 0), np.nextafter(mids, 1e9)])
    probes = probes[probes <= 448].astype(np.float32)
    got = np.asarray(jax.jit(rounding.round_to_e4m3)(probes))
    want = probes.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fn,dt", [(rounding.round_to_bf16, ml_dtypes.bfloat16),
                                   (rounding.round_to_f16, np.float16)])
def test_integer_roundings_match_numpy_casts(fn, dt):
    """The elision-proof BF16/F16 roundings equal NumPy's RNE casts bit for bit."""
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(4096).astype(np.float32) * 10.0 ** rng.integers(-8, 5, 4096),
        np.array([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e-8, -3e-6, np.inf, -np.inf], np.float32),
    ]).astype(np.float32)
    got = np.asarray(jax.jit(fn)(x))
    with np.errstate(over="ignore"):
        want = x.astype(dt).astype(np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(want))


# ---------------------------------------------------------------- bit-exactness


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_2d", [False, True])
def test_matches_numpy_transcription_bit_for_bit(dtype, block_2d):
    """Codes, E4M3 scale bits, amax and dequantized values equal the NumPy reference."""
    x = _data(1, (64, 96), dtype)
    q = jax.jit(lambda x: fp4jax.quantize(x, block_2d=block_2d))(x)
    codes, s, amax, deq = npr.quantize_2d_input(np.asarray(x.astype(jnp.float32)), block_2d)
    np.testing.assert_array_equal(np.asarray(q.codes()), codes)
    scales = np.asarray(q.block_scales())[:, ::16]
    np.testing.assert_array_equal(_bits(scales), _bits(s))
    assert np.float32(q.amax) == amax
    np.testing.assert_array_equal(_bits(fp4jax.dequantize(q)), _bits(deq))


def test_stochastic_matches_numpy_transcription_of_the_bits():
    """SR codes equal the NumPy transcription: its own hash of the block counters
    (docs/RECIPE.md §5) and its own rounding rule."""
    x = _data(2, (32, 64))
    key = jax.random.key(7)
    q = fp4jax.quantize(x, rounding="stochastic", key=key)
    words = tuple(int(w) for w in np.asarray(jax.random.key_data(key))[:2])
    codes, *_ = npr.quantize_2d_input(np.asarray(x), u8=npr.sr_bytes_rowwise(words, 32, 64))
    np.testing.assert_array_equal(np.asarray(q.codes()), codes)


def test_stochastic_bits_follow_the_block_layout_for_any_axis():
    """Quantizing along axis 0 draws block b's bytes from counters 4b..4b+3, with blocks
    numbered row-major over the (M/16, K) grid (the layout of q.scales)."""
    x = _data(3, (64, 48))
    key = jax.random.key(9)
    q = fp4jax.quantize(x, axis=0, rounding="stochastic", key=key)
    blocks = random_bits.block_index((4, 48), (1, 0))  # canonical (K, M/16)
    u8 = np.asarray(random_bits.block_bytes(key, blocks))  # (48, 4, 16)
    words = tuple(int(w) for w in np.asarray(jax.random.key_data(key))[:2])
    want = npr.sr_bytes_rowwise(words, 4 * 48, 16)  # 192 blocks of 16, row-major
    np.testing.assert_array_equal(u8.transpose(1, 0, 2).reshape(192, 16), want)
    codes, *_ = npr.quantize_2d_input(np.asarray(x).T, u8=u8.reshape(48, 64))
    np.testing.assert_array_equal(np.asarray(q.codes()), codes.T)


class JitEagerTest(chex.TestCase):
    """chex.variants: the same quantize under jit and eagerly gives the same bits."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_options(self):
        for dtype in (jnp.bfloat16,):
            x = _data(3, (48, 64), dtype)
            key = jax.random.key(5)

            @self.variant
            def f(x, key):
                outs = []
                for kw in (dict(), dict(block_2d=True), dict(axis=0, hadamard=True),
                           dict(rounding="stochastic", key=key)):
                    q = fp4jax.quantize(x, **kw)
                    d = fp4jax.dequantize(q)
                    outs.append((q.data, jax.lax.bitcast_convert_type(q.scales, jnp.uint8),
                                 q.amax, jax.lax.bitcast_convert_type(d, jnp.uint32)))
                return outs

            got = f(x, key)
            want = jax.tree.map(np.asarray, [
                (q.data, jax.lax.bitcast_convert_type(q.scales, jnp.uint8), q.amax,
                 jax.lax.bitcast_convert_type(fp4jax.dequantize(q), jnp.uint32))
                for q in (fp4jax.quantize(x), fp4jax.quantize(x, block_2d=True),
                          fp4jax.quantize(x, axis=0, hadamard=True),
                          fp4jax.quantize(x, rounding="stochastic", key=key))])
            jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got), want)


def test_op_by_op_equals_jit():
    """With jit disabled (every op executed on its own, no fusion), results are identical."""
    x = _data(31, (32, 48), jnp.bfloat16)
    key = jax.random.key(1)
    kws = (dict(), dict(block_2d=True), dict(axis=0, hadamard=True),
           dict(rounding="stochastic", key=key))
    jitted = [fp4jax.quantize(x, **kw) for kw in kws]
    with jax.disable_jit():
        eager = [fp4jax.quantize(x, **kw) for kw in kws]
        eager_deq = [np.asarray(fp4jax.dequantize(q)) for q in eager]
    for a, b, d in zip(jitted, eager, eager_deq):
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
        np.testing.assert_array_equal(_bits(a.scales), _bits(b.scales))
        np.testing.assert_array_equal(_bits(fp4jax.dequantize(a)), _bits(d))


def test_no_recompilation_on_second_call():
    """A jitted quantize+dequantize compiles once per shape/dtype."""
    f = jax.jit(lambda x: fp4jax.dequantize(fp4jax.quantize(x)))
    f(_data(4, (32, 32)))
    f(_data(5, (32, 32)))
    assert f._cache_size() == 1


# ---------------------------------------------------------------- numeric properties


def test_block_max_maps_to_six():
    """The element holding a block's amax quantizes to ±6 whenever its scale is exact."""
    x = np.asarray(_data(6, (64, 64)))
    q = fp4jax.quantize(x)
    codes = np.asarray(q.codes()).reshape(64, 4, 16)
    blocks = x.reshape(64, 4, 16)
    arg = np.abs(blocks).argmax(-1)
    top = np.take_along_axis(codes, arg[..., None], -1)[..., 0]
    assert np.all((top & 7) == 7), "block max must use the largest E2M1 code"
    assert np.all((top >> 3) == (np.take_along_axis(blocks, arg[..., None], -1)[..., 0] < 0))


def test_scales_lie_in_e4m3_range_and_global_max_is_448():
    """Block decode scales are finite E4M3 values in [0, 448]; the amax block gets 448."""
    x = _data(7, (128, 256)) * 1e3
    q = fp4jax.quantize(x)
    s = np.asarray(q.scales.astype(jnp.float32))
    assert np.all(np.isfinite(s)) and s.min() >= 0 and s.max() == 448.0


def test_quantize_dequantize_idempotent():
    """Requantizing a dequantized tensor reproduces its codes (−0 → 0) and scale bits.

    Values agree to a few float32 ulps only: the re-derived global amax
    ``fl(fl(448·amax)·fl(1/2688))·6`` can differ from ``amax`` in the last bit.
    """
    for kw in (dict(), dict(block_2d=True), dict(axis=0)):
        x = _data(8, (64, 64))
        q = fp4jax.quantize(x, **kw)
        y = fp4jax.dequantize(q)
        q2 = fp4jax.quantize(y, **kw)
        c1, c2 = np.asarray(q.codes()), np.asarray(q2.codes())
        np.testing.assert_array_equal(np.where(c1 == 8, 0, c1), c2)
        np.testing.assert_array_equal(_bits(q.scales), _bits(q2.scales))
        np.testing.assert_allclose(np.asarray(fp4jax.dequantize(q2)), np.asarray(y), rtol=1e-6)


def test_relative_error_within_nvfp4_bound():
    """Per-tensor relative RMS error of Gaussian data is ~9%, far below a 15% bound."""
    x = jax.random.normal(jax.random.key(9), (256, 256))
    err = jnp.linalg.norm(fp4jax.dequantize(fp4jax.quantize(x)) - x) / jnp.linalg.norm(x)
    assert 0.03 < float(err) < 0.15


def test_2d_blocks_are_transpose_invariant():
    """dequantize(quantize(W, 2D)).T == dequantize(quantize(W.T, 2D)) (docs/RECIPE.md §3)."""
    w = _data(10, (80, 48))  # 80 = 5 tiles, 48 = 3 tiles
    a = fp4jax.dequantize(fp4jax.quantize(w, axis=0, block_2d=True))
    b = fp4jax.dequantize(fp4jax.quantize(w.T, axis=1, block_2d=True))
    np.testing.assert_array_equal(np.asarray(a).T, np.asarray(b))
    c = fp4jax.dequantize(fp4jax.quantize(w, axis=1, block_2d=True))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


def test_2d_partial_tiles():
    """2D tiles at ragged edges behave like zero-padded tiles."""
    w = _data(11, (40, 24))
    q = fp4jax.quantize(w, axis=0, block_2d=True)
    assert q.scales.shape == (3, 2)
    wp = jnp.pad(w, ((0, 8), (0, 8)))
    qp = fp4jax.quantize(wp, axis=0, block_2d=True)
    np.testing.assert_array_equal(
        np.asarray(fp4jax.dequantize(q)), np.asarray(fp4jax.dequantize(qp))[:40, :24]
    )


def test_partial_last_block_is_zero_padded():
    """A length that is not a multiple of 16 behaves exactly like explicit zero padding."""
    x = _data(12, (5, 37))
    q = fp4jax.quantize(x)
    assert q.data.shape == (5, 24) and q.scales.shape == (5, 3) and q.shape == (5, 37)
    qp = fp4jax.quantize(jnp.pad(x, ((0, 0), (0, 11))))
    np.testing.assert_array_equal(np.asarray(q.data), np.asarray(qp.data))
    np.testing.assert_array_equal(
        np.asarray(fp4jax.dequantize(q)), np.asarray(fp4jax.dequantize(qp))[:, :37]
    )


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_any_rank_any_axis(axis):
    """Quantizing along any axis equals moving that axis last and quantizing there."""
    x = _data(13, (16, 32, 48))
    q = fp4jax.quantize(x, axis=axis)
    ref = fp4jax.quantize(jnp.moveaxis(x, axis, -1))
    np.testing.assert_array_equal(
        np.asarray(fp4jax.dequantize(q)),
        np.moveaxis(np.asarray(fp4jax.dequantize(ref)), -1, axis),
    )
    assert q.data.shape[axis] == x.shape[axis] // 2


def test_vmap():
    """vmap(quantize) quantizes each slice on its own (per-slice global amax)."""
    xs = _data(14, (3, 16, 32))
    got = jax.vmap(lambda x: fp4jax.dequantize(fp4jax.quantize(x)))(xs)
    want = jnp.stack([fp4jax.dequantize(fp4jax.quantize(x)) for x in xs])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_precomputed_amax():
    """amax= gives the same result as the computed amax when equal, and is used as given."""
    x = _data(15, (16, 64))
    q = fp4jax.quantize(x)
    q2 = fp4jax.quantize(x, amax=jnp.max(jnp.abs(x)))
    np.testing.assert_array_equal(np.asarray(q.data), np.asarray(q2.data))
    q3 = fp4jax.quantize(x, amax=2 * jnp.max(jnp.abs(x)))
    assert float(q3.amax) == 2 * float(q.amax)


def test_nbytes_is_4_5_bits_per_value():
    """Storage is 4 bits per value + 1 byte per 16 values + 4 bytes of amax."""
    q = fp4jax.quantize(_data(16, (64, 128)))
    assert q.nbytes == 64 * 128 // 2 + 64 * 128 // 16 + 4
    q2 = fp4jax.quantize(_data(16, (64, 128)), block_2d=True)
    assert q2.nbytes == 64 * 128 // 2 + (64 // 16) * (128 // 16) + 4


def test_transpose_view_keeps_values():
    """NVFP4Array.T / .mT permute the logical tensor without requantizing."""
    q = fp4jax.quantize(_data(17, (32, 48)), axis=0, block_2d=True)
    np.testing.assert_array_equal(
        np.asarray(fp4jax.dequantize(q.T)), np.asarray(fp4jax.dequantize(q)).T
    )
    q1 = fp4jax.quantize(_data(18, (2, 32, 48)), axis=1)
    np.testing.assert_array_equal(
        np.asarray(fp4jax.dequantize(q1.mT)), np.swapaxes(np.asarray(fp4jax.dequantize(q1)), 1, 2)
    )


# ---------------------------------------------------------------- Hadamard


def test_rht_is_orthogonal_and_matches_matrix():
    """T = diag(s) H16 / 4 is orthogonal; rht(x) equals x @ T (float32 inputs)."""
    t = hadamard.rht_matrix()
    np.testing.assert_allclose(t @ t.T, np.eye(16), atol=1e-7)
    x = _data(19, (8, 64))
    np.testing.assert_allclose(
        np.asarray(fp4jax.rht(x)), npr.rht_exact(np.asarray(x), fp4jax.DEFAULT_HADAMARD_SIGNS),
        rtol=1e-6, atol=1e-6,
    )


def test_rht_bf16_is_exact_sum_rounded_once():
    """For BF16 runs spanning < 2**12, the RHT is the exact sum rounded once to BF16."""
    x = (jax.random.uniform(jax.random.key(20), (64, 128), minval=1, maxval=4000)
         * jnp.sign(jax.random.normal(jax.random.key(21), (64, 128)))).astype(jnp.bfloat16)
    got = np.asarray(fp4jax.rht(x))
    exact = npr.rht_exact(np.asarray(x.astype(jnp.float32)), fp4jax.DEFAULT_HADAMARD_SIGNS)
    want = exact.astype(ml_dtypes.bfloat16).astype(np.float32)  # float64 -> bf16 once
    np.testing.assert_array_equal(got, want)


def test_wgrad_product_invariant_under_rht():
    """Rotating both operands along the contraction leaves X^T G unchanged."""
    x, g = _data(22, (64, 32)), _data(23, (64, 24))
    xr, gr = fp4jax.rht(x, axis=0), fp4jax.rht(g, axis=0)
    np.testing.assert_allclose(np.asarray(xr.T @ gr), np.asarray(x.T @ g), rtol=2e-5, atol=1e-3)


def test_hadamard_quantize_dequantizes_in_rotated_domain():
    """hadamard=True quantizes RHT(x): amax is the rotated tensor's, dequantize is rotated."""
    x = _data(24, (32, 48))
    q = fp4jax.quantize(x, axis=0, hadamard=True)
    xr = fp4jax.rht(x, axis=0)
    assert float(q.amax) == float(jnp.max(jnp.abs(xr)))
    ref = fp4jax.quantize(xr, axis=0)
    np.testing.assert_array_equal(np.asarray(q.data), np.asarray(ref.data))
    assert q.hadamard and not ref.hadamard


def test_custom_hadamard_signs():
    """A custom sign vector is used; a malformed one is rejected."""
    x = _data(25, (4, 32))
    signs = [1, -1] * 8
    q = fp4jax.quantize(x, hadamard=True, hadamard_signs=signs)
    ref = fp4jax.quantize(fp4jax.rht(x, signs=signs))
    np.testing.assert_array_equal(np.asarray(q.data), np.asarray(ref.data))
    with pytest.raises(ValueError, match="16 entries"):
        fp4jax.quantize(x, hadamard=True, hadamard_signs=[1] * 15)
    with pytest.raises(ValueError, match="16 entries"):
        fp4jax.quantize(x, hadamard=True, hadamard_signs=[2] * 16)


# ---------------------------------------------------------------- stochastic rounding


def test_stochastic_rounding_is_unbiased():
    """Mean of SR dequantizations over 2000 keys is within 5 standard errors of x."""
    x = jnp.concatenate([jnp.array([[6.0]]), jax.random.uniform(jax.random.key(26), (1, 15),
                                                                 minval=-6, maxval=6)], axis=1)
    keys = jax.random.split(jax.random.key(27), 2000)
    deq = jax.vmap(
        lambda k: fp4jax.dequantize(fp4jax.quantize(x, rounding="stochastic", key=k)))(keys)
    mean, std = deq.mean(0), deq.std(0)
    se = std / np.sqrt(keys.shape[0]) + 1e-6
    assert float(jnp.max(jnp.abs(mean - x) / se)) < 5.0
    # and it differs from RNE somewhere (it is actually stochastic)
    rne = fp4jax.dequantize(fp4jax.quantize(x))
    assert float(jnp.max(jnp.abs(deq[0] - rne))) > 0


def test_stochastic_rounding_reproducible_and_key_dependent():
    """The same key gives the same bits; different keys give different bits."""
    x = _data(28, (64, 64))
    a = fp4jax.quantize(x, rounding="stochastic", key=jax.random.key(1))
    b = fp4jax.quantize(x, rounding="stochastic", key=jax.random.key(1))
    c = fp4jax.quantize(x, rounding="stochastic", key=jax.random.key(2))
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    assert np.mean(np.asarray(a.data) != np.asarray(c.data)) > 0.1
    # raw uint32 keys work too and mean the same key
    d = fp4jax.quantize(x, rounding="stochastic", key=jax.random.key_data(jax.random.key(1)))
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(d.data))


def test_nearest_is_deterministic_and_ignores_key():
    x = _data(29, (16, 32))
    a = fp4jax.quantize(x)
    b = fp4jax.quantize(x, key=jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))


def test_random_bytes_are_uniform():
    """The SR bytes are uniform on [0, 256): every value's count is within 5 sigma of
    n/256 (n = 2**20), and neighbouring bytes of one word are uncorrelated."""
    u = np.asarray(random_bits.block_bytes(jax.random.key(0), jnp.arange(2**16, dtype=jnp.uint32)))
    counts = np.bincount(u.reshape(-1), minlength=256)
    n = u.size
    assert u.max() < 256 and counts.shape == (256,)
    assert np.all(np.abs(counts - n / 256) < 5 * np.sqrt(n / 256 * (1 - 1 / 256)))
    a, b = u[:, 0].astype(float), u[:, 1].astype(float)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(a.size)


def test_stochastic_rounding_bias_within_its_resolution():
    """With 8 random bits the expected rounding is f rounded to 1/256: |E[q] - x| <=
    h/512 exactly, and the rounding probability is that bound's only error. Checked by
    exhaustive enumeration of the 256 byte values (no sampling noise)."""
    a = jnp.linspace(0.0, 5.999, 4001, dtype=jnp.float32)
    u8 = jnp.arange(256, dtype=jnp.uint32)
    codes = jax.vmap(lambda u: rounding.e2m1_code_stochastic(a, jnp.full(a.shape, u)))(u8)
    mean = np.asarray(nvfp4_array.e2m1_to_f32(codes)).mean(0)
    h = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
    assert np.all(np.abs(mean - np.asarray(a)) <= h / 512 + 1e-7)


# ---------------------------------------------------------------- edge cases


def test_all_zero_tensor():
    """All zeros: amax 0, ges 1, scales 0, codes 0, dequantized zeros."""
    q = fp4jax.quantize(jnp.zeros((4, 32), jnp.bfloat16))
    assert float(q.amax) == 0
    assert not np.asarray(q.data).any() and not np.asarray(q.scales.astype(jnp.float32)).any()
    np.testing.assert_array_equal(np.asarray(fp4jax.dequantize(q)), np.zeros((4, 32)))
    assert float(fp4jax.global_encode_scale(0.0)) == 1.0


def test_negative_zero_and_tiny_negative_codes():
    """-0.0 gives code 0; a tiny negative that rounds to zero gives code 8 (-0)."""
    x = jnp.array([[6.0, -0.0, -1e-3, 1e-3] + [0.0] * 12])
    codes = np.asarray(fp4jax.quantize(x).codes())[0, :4]
    np.testing.assert_array_equal(codes, [7, 0, 8, 0])


def test_zero_scale_saturates_codes_but_dequantizes_to_zero():
    """A block whose scale rounds to 0 gets codes 7/15 (enc = FLT_MAX) and decodes to 0."""
    x = jnp.concatenate([jnp.full((1, 16), 1e30), jnp.full((1, 16), 1e-3)], axis=1)
    x = x.at[0, 17].set(-1e-3)
    q = fp4jax.quantize(x)
    assert float(q.scales.astype(jnp.float32)[0, 1]) == 0.0
    codes = np.asarray(q.codes())[0, 16:18]
    np.testing.assert_array_equal(codes, [7, 15])
    assert not np.asarray(fp4jax.dequantize(q))[0, 16:].any()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_poisons_the_whole_tensor(bad):
    """NaN/±inf input: amax is NaN and every dequantized value is NaN (never finite garbage)."""
    x = jnp.ones((4, 32)).at[1, 3].set(bad)
    q = jax.jit(fp4jax.quantize)(x)
    assert np.isnan(float(q.amax))
    assert np.all(np.isnan(np.asarray(fp4jax.dequantize(q))))


@pytest.mark.parametrize("mag", [1e-30, 1e-20, 1e-5, 1.0, 1e5, 1e20, 1e30])
def test_extreme_magnitudes(mag):
    """Relative error stays in the NVFP4 band from 1e-30 to 1e30 (float32 inputs)."""
    x = jax.random.normal(jax.random.key(30), (32, 64)) * mag
    y = np.asarray(fp4jax.dequantize(fp4jax.quantize(x)), np.float64)
    x = np.asarray(x, np.float64)
    assert np.all(np.isfinite(y))
    err = np.linalg.norm(y - x) / np.linalg.norm(x)
    assert 0.03 < err < 0.15, err


def test_bad_inputs_raise_clear_errors():
    x = jnp.ones((4, 32))
    with pytest.raises(TypeError, match="int32"):
        fp4jax.quantize(jnp.ones((4, 32), jnp.int32))
    with pytest.raises(ValueError, match="out of range"):
        fp4jax.quantize(x, axis=2)
    with pytest.raises(TypeError, match="axis"):
        fp4jax.quantize(x, axis=1.0)
    with pytest.raises(ValueError, match="scalar"):
        fp4jax.quantize(jnp.float32(1.0))
    with pytest.raises(ValueError, match="rounding"):
        fp4jax.quantize(x, rounding="up")
    with pytest.raises(ValueError, match="key"):
        fp4jax.quantize(x, rounding="stochastic")
    with pytest.raises(ValueError, match="multiple of 16"):
        fp4jax.quantize(jnp.ones((4, 20)), hadamard=True)
    with pytest.raises(ValueError, match="last two axes"):
        fp4jax.quantize(jnp.ones((16, 16, 16)), axis=0, block_2d=True)
    with pytest.raises(ValueError, match="2D"):
        fp4jax.quantize(jnp.ones(32), block_2d=True)
    with pytest.raises(ValueError, match="cannot be combined"):
        fp4jax.quantize(x, hadamard=True, block_2d=True)
    with pytest.raises(ValueError, match="amax must be a scalar"):
        fp4jax.quantize(x, amax=jnp.ones(2))
    with pytest.raises(ValueError, match="hadamard_signs"):
        fp4jax.quantize(x, hadamard_signs=[1] * 16)
    with pytest.raises(TypeError, match="NVFP4Array"):
        fp4jax.dequantize(x)
    with pytest.raises(TypeError, match="floating"):
        fp4jax.dequantize(fp4jax.quantize(x), jnp.int8)
    with pytest.raises(TypeError, match="jax.random key"):
        fp4jax.quantize(x, rounding="stochastic", key=jnp.zeros(2, jnp.float32))
    with pytest.raises(ValueError, match="impl must be one of"):
        fp4jax.quantize(x, impl="triton")


def test_huge_finite_inputs_decode_finite():
    """amax above FLT_MAX/448 (~7.6e35) still decodes finite (issue 10.7); below it the
    decode is Transformer Engine's formula bit for bit."""
    for v in (1e36, 3e38):
        x = jnp.full((1, 16), v, jnp.float32).at[0, 3].set(-v / 3)
        y = fp4jax.dequantize(fp4jax.quantize(x))
        assert bool(jnp.all(jnp.isfinite(y))), (v, y)
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=0.25)
    x = _data(40, (8, 64))
    q = fp4jax.quantize(x)
    te = (np.asarray(q.scales.astype(jnp.float32)) * np.float32(q.amax)).astype(np.float32) \
        * (np.float32(1) / np.float32(2688))
    want = np.asarray(nvfp4_array.e2m1_to_f32(q.codes())) * np.repeat(te, 16, axis=1)
    np.testing.assert_array_equal(_bits(fp4jax.dequantize(q)), _bits(want.astype(np.float32)))


def test_empty_and_bad_keys_raise_clear_errors():
    """An empty array and a non-key `key` get our errors, not raw internal ones (10.9)."""
    with pytest.raises(ValueError, match="non-empty array, got shape \\(0, 16\\)"):
        fp4jax.quantize(jnp.zeros((0, 16)))
    with pytest.raises(TypeError, match="jax.random key"):
        fp4jax.quantize(jnp.ones((4, 16)), rounding="stochastic", key=42)


# Jitted (one program each per case, as inside a GEMM), not op by op: eager dispatch of
# the decode's many small ops, each compiled on its own, cost ~5x the time.
@functools.partial(jax.jit, static_argnums=1)
def _scaled_codes_bf16(q, column_pairs):
    from fp4jax.reference.quantization import scaled_codes_bf16

    return scaled_codes_bf16(q, column_pairs=column_pairs)


@jax.jit
def _transcribed_decode(q):
    codes = nvfp4_array.unpack_codes(q.data, q.axis)
    want = nvfp4_array.e2m1_to_bf16(codes) * q.per_element(q.scales.astype(jnp.bfloat16))
    return jax.lax.slice_in_dim(want, 0, q.shape[q.axis], axis=q.axis)


@pytest.mark.parametrize("shape,kw", [
    ((48, 80), {}), ((3, 32, 40), {}), ((40, 64), {"block_2d": True}), ((48, 80), {"axis": 0}),
    ((64, 48), {"axis": 0, "block_2d": True}), ((2, 40, 32), {"axis": 1}),
    ((40, 48), {"axis": 0, "block_2d": True}), ((2, 3, 40, 16), {"axis": 1}),
    ((40, 7), {"axis": 0}), ((2, 48, 34), {"axis": 1})])
def test_scaled_codes_decode_is_code_times_block_scale(shape, kw):
    """The GEMM operand decode (code · s in BF16, no global scale), for codes packed along
    the last axis (bitcast-interleave path), the second-to-last (through .mT, or as
    pairs of columns) and a leading one, equals an independent
    transcription: unpack the nibbles, decode E2M1, multiply by the per-element E4M3
    scale — bit for bit, padding dropped."""
    q = fp4jax.quantize(jax.random.normal(jax.random.key(0), shape) * 3, **kw)
    want = _transcribed_decode(q)
    for pairs in (False, True):
        got = _scaled_codes_bf16(q, pairs)
        assert got.shape == want.shape == q.shape
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16),
                                      np.asarray(want).view(np.uint16))


def test_batched_output_scales_equal_one_pair_at_a_time():
    """`scales.output_scales` (the backward's two GEMMs in one pass of the divisions)
    gives each pair's `scales.output_scale` bit for bit: zero, subnormal, huge and NaN
    amaxes included."""
    from fp4jax.numerics import scales

    amaxes = np.array([0.0, 1e-40, 3.5, 2688.0, 3.0e38, np.nan, 7.25, 1e-3], np.float32)
    pairs = [(amaxes[i], amaxes[j]) for i in range(8) for j in (0, 3, 5, 7)]
    batched = np.asarray(jax.jit(scales.output_scales)(pairs))
    single = np.array([np.asarray(jax.jit(scales.output_scale)(a, b)) for a, b in pairs])
    np.testing.assert_array_equal(batched.view(np.uint32), single.view(np.uint32))
