"""4/6 adaptive block scaling (docs/RECIPE.md §2.8): bits, the error property, routing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fp4jax
from fp4jax import implementation
from fp4jax.reference import quantization as reference
from tests import np_reference as npr

FOUR_SIX = "four_over_six"


def _data(key, shape, dtype=jnp.float32):
    """Heavy-tailed data with block magnitudes spread over decades."""
    k1, k2 = jax.random.split(jax.random.key(key))
    x = jax.random.normal(k1, shape) * jnp.exp(2.0 * jax.random.normal(k2, shape[:-1] + (1,)))
    return x.astype(dtype)


def _bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


@jax.jit
def _quantize_1d(x):
    return fp4jax.quantize(x, scale_rule=FOUR_SIX)


@jax.jit
def _quantize_2d(x):
    return fp4jax.quantize(x, scale_rule=FOUR_SIX, block_2d=True)


def _assert_matches_numpy(x, block_2d):
    q = (_quantize_2d if block_2d else _quantize_1d)(x)
    codes, s, amax, deq = npr.quantize_2d_input_four_over_six(
        np.asarray(jnp.asarray(x).astype(jnp.float32)), block_2d)
    np.testing.assert_array_equal(np.asarray(q.codes()), codes)
    np.testing.assert_array_equal(_bits(np.asarray(q.block_scales())[:, ::16]), _bits(s))
    assert _bits(np.float32(q.amax)) == _bits(amax)
    np.testing.assert_array_equal(_bits(fp4jax.dequantize(q)), _bits(deq))
    return q


def _crafted():
    """Blocks at exact ties, all-zero blocks, one-element blocks and the tensor amax."""
    x = np.array(_data(3, (32, 64)))
    x[0, :16] = 12.0  # error 0 under both s6 = 2 and s4 = 3 (ges = 1 below): a tie
    x[1, :16] = 0.0  # all-zero block: s6 = s4 = 0, a tie
    x[2, 16:32] = np.where(np.arange(16) % 2, 8.0, -4.0)  # exact under s4 = 2, not s6
    x[3, :16] = 0.0
    x[3, 5] = -3.0  # a single nonzero element
    x[4, 32] = 2688.0  # tensor amax: ges = 1, both candidates clamp to s = 448
    return x


@pytest.mark.parametrize("block_2d", [False, True])
def test_matches_numpy_transcription_bit_for_bit(block_2d):
    """Codes, scale bits, amax and decoded values equal the independent NumPy transcription
    on random data (float32 and bfloat16) and on crafted blocks."""
    _assert_matches_numpy(_data(1, (32, 64)), block_2d)
    _assert_matches_numpy(_data(2, (32, 64), jnp.bfloat16), block_2d)
    q = _assert_matches_numpy(jnp.asarray(_crafted()), block_2d)
    if not block_2d:
        s = np.asarray(q.scales.astype(jnp.float32))
        assert s[0, 0] == 2.0  # exact tie keeps the 6 candidate
        assert s[1, 0] == 0.0
        assert s[2, 1] == 2.0  # the 4 candidate wins
        assert s[4, 2] == 448.0


def test_nan_poisons_amax_and_codes_come_from_finite_values():
    """A NaN input poisons only the stored amax; codes and scales are those of the input
    with the NaN read as 0 (docs/RECIPE.md §2.1)."""
    x = _crafted()
    x[7, 9] = np.nan
    q = _quantize_1d(jnp.asarray(x))
    clean = _quantize_1d(jnp.asarray(np.nan_to_num(x, nan=0.0)))
    assert np.isnan(q.amax)
    np.testing.assert_array_equal(np.asarray(q.data), np.asarray(clean.data))
    np.testing.assert_array_equal(_bits(q.scales), _bits(clean.scales))


def test_partial_blocks_along_axis_0():
    """A ragged block axis along axis 0 decodes like its zero-padded transpose
    quantized along the last axis (padding and axis handling as for the 6 rule)."""
    x = _data(4, (24, 32))
    q = fp4jax.quantize(x, axis=0, scale_rule=FOUR_SIX)  # blocks along the 24 rows
    ref = _quantize_1d(jnp.pad(x, ((0, 8), (0, 0))).T)  # (32, 32), blocks along the last axis
    np.testing.assert_array_equal(_bits(fp4jax.dequantize(q)),
                                  _bits(fp4jax.dequantize(ref)[:, :24].T))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.integers(-20, 20),
       block_2d=st.booleans())
def test_chosen_error_never_exceeds_the_six_rule(seed, log_scale, block_2d):
    """On every block (tile), the 4/6 result's squared error (§2.8's metric, computed in
    NumPy from the stored codes and scales) is at most that of the standard 6 rule."""
    x = np.asarray(_data(seed % 1000, (32, 32))) * np.float32(10.0**log_scale)
    rng = np.random.default_rng(seed)
    x[rng.integers(0, 32), :16] = 0.0
    q = (_quantize_2d if block_2d else _quantize_1d)(jnp.asarray(x))
    q6 = fp4jax.quantize(jnp.asarray(x), block_2d=block_2d)
    ges = np.float32(2688.0) / np.float32(np.abs(x).max())
    errs = [npr.four_over_six_errors(x, np.asarray(r.codes()),
                                     np.asarray(r.block_scales())[:, ::16], ges, block_2d)
            for r in (q, q6)]
    assert np.all(errs[0] <= errs[1])
    assert np.all(np.asarray(q.scales.astype(jnp.float32))
                  >= np.asarray(q6.scales.astype(jnp.float32)))


def test_default_scale_rule_is_unchanged():
    """The default is the 6 rule, bit for bit the TE transcription; presets other than
    `Recipe.nvfp4_four_over_six` use it on every operand."""
    x = _data(5, (32, 64))
    q, q6 = fp4jax.quantize(x), fp4jax.quantize(x, scale_rule="six")
    codes, s, _, _ = npr.quantize_2d_input(np.asarray(x))
    np.testing.assert_array_equal(np.asarray(q.codes()), codes)
    np.testing.assert_array_equal(_bits(np.asarray(q.block_scales())[:, ::16]), _bits(s))
    np.testing.assert_array_equal(np.asarray(q.data), np.asarray(q6.data))
    for r in (fp4jax.Recipe.nvfp4(), fp4jax.Recipe.nvfp4_no_rht(), fp4jax.Recipe.nvfp4_no_sr(),
              fp4jax.Recipe.nvfp4_no_2d()):
        assert all(o.scale_rule == "six" for _, o in r.operands())


def test_recipe_applies_four_over_six_to_the_forward_and_weights():
    """`Recipe.nvfp4_four_over_six`: the forward equals the GEMM of the 4/6-quantized X
    and W (the backward adds no 4/6 quantization: dgrad reuses the forward's W tiles)."""
    r = fp4jax.Recipe.nvfp4_four_over_six()
    assert r.dgrad_grad.rounding == "stochastic" and r.wgrad_lhs.scale_rule == "six"
    x, w = _data(6, (32, 64)), _data(7, (64, 48))
    dn = (((1,), (0,)), ((), ()))
    y = fp4jax.dot_general(x, w, dn, recipe=r)
    qx = fp4jax.quantize(x, scale_rule=FOUR_SIX)
    qw = fp4jax.quantize(w, axis=0, block_2d=True, scale_rule=FOUR_SIX)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(fp4jax.matmul(qx, qw)))


def test_refused_with_rht_or_stochastic_rounding_and_on_pallas():
    """4/6 with the RHT or SR raises a ValueError (quantize and Operand); an unknown rule
    too; impl='pallas' raises, impl='auto' takes the XLA path."""
    x = _data(8, (32, 32))
    with pytest.raises(ValueError, match="four_over_six"):
        fp4jax.quantize(x, scale_rule=FOUR_SIX, hadamard=True)
    with pytest.raises(ValueError, match="four_over_six"):
        reference.quantize(x, scale_rule=FOUR_SIX, rounding="stochastic", key=jax.random.key(0))
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        fp4jax.quantize(x, scale_rule="four")
    with pytest.raises(ValueError, match="four_over_six"):
        fp4jax.Operand(rounding="stochastic", scale_rule=FOUR_SIX)
    with pytest.raises(ValueError, match="four_over_six"):
        fp4jax.Operand(hadamard=True, scale_rule=FOUR_SIX)
    with pytest.raises(ValueError, match="only apply to format='nvfp4'"):
        fp4jax.Operand(format="unquantized", scale_rule=FOUR_SIX)
    with pytest.raises(ValueError, match="scale_rule='four_over_six' is implemented in XLA"):
        implementation.quantize(x, scale_rule=FOUR_SIX, impl="pallas")
    auto = implementation.quantize(x, scale_rule=FOUR_SIX, impl="auto")
    np.testing.assert_array_equal(np.asarray(auto.data),
                                  np.asarray(reference.quantize(x, scale_rule=FOUR_SIX).data))
