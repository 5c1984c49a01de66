"""fp4jax.testing: every assertion passes on correct input and fails on a planted violation."""

import functools
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
import fp4jax.testing as fpt
from fp4jax import implementation

LINEAR = (((1,), (0,)), ((), ()))


def _x(shape=(4, 64), dtype=jnp.float32, seed=0, spread=0.0):
    """Normal data; ``spread`` > 0 scales each 16-block by up to ``10**spread``."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(k1, shape)
    if spread:
        blocks = jax.random.uniform(k2, shape[:-1] + (shape[-1] // 16, 1), minval=-spread,
                                    maxval=0.0)
        x = (x.reshape(*shape[:-1], -1, 16) * 10.0**blocks).reshape(shape)
    return x.astype(dtype)


def _with(q: fp4jax.NVFP4Array, **fields) -> fp4jax.NVFP4Array:
    return fp4jax.NVFP4Array(**{**vars(q), **fields})


# ---------------------------------------------------------------- error bound


# Blocks spanning 8 decades (normal, E4M3-subnormal and zero block scales), ±0, a tiny
# negative that rounds to −0 and a float32 subnormal; shared so compiled programs are reused.
X = _x((32, 64), spread=8.0).at[0, :4].set(jnp.array([0.0, -0.0, -1e-30, 1e-40]))
LAYOUTS = [{}, {"axis": 0, "block_2d": True}, {"hadamard": True}]


@pytest.mark.parametrize("opts", LAYOUTS)
def test_error_bound_holds_for_correct_quantization(opts):
    """Every layout stays within the bound."""
    fpt.assert_quantization_error_bounded(X, **opts)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_error_bound_holds_for_half_precision_inputs(dtype):
    """bfloat16 and float16 inputs (float16 over its narrower range)."""
    x = _x((32, 64), spread=8.0 if dtype == jnp.bfloat16 else 3.0).astype(dtype)
    fpt.assert_quantization_error_bounded(x, axis=0)


def test_error_bound_catches_a_corrupted_code():
    """A code changed in one element is reported with that element and its block."""
    x = _x()
    q = fp4jax.quantize(x)
    codes = np.asarray(q.data).copy()
    codes[2, 9] ^= 0x06  # element (2, 18): flip two magnitude bits of the low nibble
    with pytest.raises(AssertionError, match=r"worst: element \(2, 18\) \(block \(2, 1\)"):
        fpt.assert_quantization_error_bounded(x, _with(q, data=jnp.asarray(codes)))


def test_error_bound_catches_a_too_small_scale():
    """A block scale halved saturates its block: reported with the block and a hint."""
    x = _x()
    q = fp4jax.quantize(x)
    scales = q.scales.astype(jnp.float32).at[1, 2].multiply(0.5).astype(jnp.float8_e4m3fn)
    with pytest.raises(AssertionError, match=r"block \(1, 2\).*block scale is too small"):
        fpt.assert_quantization_error_bounded(x, _with(q, scales=scales))


def test_error_bound_distinguishes_nearest_from_stochastic():
    """Stochastic rounding is within the SR bound but not the round-to-nearest one."""
    x = _x((8, 64))
    q = fp4jax.quantize(x, rounding="stochastic", key=jax.random.key(3))
    fpt.assert_quantization_error_bounded(x, q, rounding="stochastic")
    with pytest.raises(AssertionError, match="rounding='nearest'"):
        fpt.assert_quantization_error_bounded(x, q)


def test_error_bound_non_finite_inputs_must_poison_the_tensor():
    """NaN/inf input: passes when every decoded value is NaN; a finite amax fails."""
    x = _x().at[1, 3].set(jnp.inf)
    q = fp4jax.quantize(x)
    fpt.assert_quantization_error_bounded(x, q)
    with pytest.raises(AssertionError, match=r"non-finite.*first at \(1, 3\)"):
        fpt.assert_quantization_error_bounded(x, _with(q, amax=jnp.float32(4.0)))


def test_error_bound_allowances_are_where_the_format_needs_them():
    """The bound is half an E2M1 step of s·gds; a zero/subnormal-scale block gets the
    E4M3 underflow allowance 6·2⁻¹⁰·gds (its elements can exceed the block's range)."""
    x = jnp.concatenate([jnp.full((1, 16), 448.0 * 6), jnp.full((1, 16), 1e-4)], axis=1)
    q = fp4jax.quantize(x)
    bound = fpt.quantization_error_bound(x, q)
    gds = float(fp4jax.global_decode_scale(q.amax))
    np.testing.assert_allclose(bound[0, 0], 1.0 * 448 * gds, rtol=1e-4)  # |v| = 6: half of 2
    assert float(q.scales.astype(jnp.float32)[0, 1]) == 0.0  # 1e-4 / 2688 underflows E4M3
    np.testing.assert_allclose(bound[0, 16], 6 * 2.0**-10 * gds, rtol=1e-4)
    fpt.assert_quantization_error_bounded(x, q)


def test_error_bound_rejects_mismatched_options():
    """Given options must agree with the given NVFP4Array."""
    x = _x()
    with pytest.raises(ValueError, match="axis=0 was given but q has axis=1"):
        fpt.assert_quantization_error_bounded(x, fp4jax.quantize(x), axis=0)


# ---------------------------------------------------------------- round trip, sign


@pytest.mark.parametrize("opts", LAYOUTS)
def test_roundtrip_idempotent_holds(opts):
    """RNE-quantized tensors, including −0 codes and zero/subnormal-scale blocks."""
    fpt.assert_roundtrip_idempotent(fp4jax.quantize(X, **opts))


def test_roundtrip_catches_a_block_whose_largest_code_is_not_six():
    """Round-to-nearest always rounds a block's largest element to ±6: lowering it breaks
    the round trip (the requantized scale shrinks), reported with the block."""
    x = jnp.linspace(0.1, 1.0, 32).at[31].set(10.0).reshape(1, 32)
    q = fp4jax.quantize(x)
    data = np.asarray(q.data).copy()
    assert data[0, 15] >> 4 == 7  # element 31, the largest of block 1, has code 7 (6.0)
    data[0, 15] = (data[0, 15] & 0x0F) | (6 << 4)
    with pytest.raises(AssertionError, match=r"block \(0, 1\).*largest code magnitude is 6"):
        fpt.assert_roundtrip_idempotent(_with(q, data=jnp.asarray(data)))


@pytest.mark.parametrize("opts", [*LAYOUTS, {"rounding": "stochastic", "key": jax.random.key(0)}])
def test_sign_symmetry_holds(opts):
    """Including ±0, tiny values that round to ±0 and float32 subnormals."""
    fpt.assert_sign_symmetric(X, **opts)


def test_sign_symmetry_catches_an_asymmetric_quantizer(monkeypatch):
    """A quantizer that rounds negative values away from zero is caught at an element."""
    real = fp4jax.quantize

    def asymmetric(x, **kw):  # small negative values scaled up: amax and scales unchanged
        return real(jnp.where((x < 0) & (x > -4), x * 1.2, x), **kw)

    x = _x().at[:, ::16].set(10.0).at[:, 1::16].set(-10.0)  # every block's amax is 10
    monkeypatch.setattr(implementation, "quantize", asymmetric)
    with pytest.raises(AssertionError, match=r"sign symmetry broken .* first: element"):
        fpt.assert_sign_symmetric(x)


# ---------------------------------------------------------------- stochastic rounding


def test_sample_size_formula():
    """n = ceil(((z_a + z_b) / 2δ)²), z_a Bonferroni over N elements: 4x for half δ."""
    z = statistics.NormalDist().inv_cdf
    n = fpt.unbiasedness_sample_size(0.1, 64, false_alarm_rate=1e-3, power=0.99)
    assert n == int(np.ceil(((z(1 - 1e-3 / 128) + z(0.99)) / 0.2) ** 2))
    n2 = fpt.unbiasedness_sample_size(0.05, 64, false_alarm_rate=1e-3, power=0.99)
    assert 4 * n - 4 <= n2 <= 4 * n
    with pytest.raises(ValueError, match="detectable_bias"):
        fpt.unbiasedness_sample_size(0.0, 64)


X_SR = _x((2, 32), seed=5)
SR_TARGET = fpt.stochastic_rounding_target(X_SR)
SAMPLER = functools.partial(jax.random.fold_in, jax.random.key(11))


def _sr(k):
    return fp4jax.dequantize(fp4jax.quantize(X_SR, rounding="stochastic", key=k))


def test_stochastic_rounding_unbiased_passes_for_fp4jax():
    """fp4jax's SR passes with the sample size the formula gives."""
    expected, step = SR_TARGET
    n = fpt.assert_stochastic_rounding_unbiased(_sr, SAMPLER, expected=expected, step=step,
                                                detectable_bias=0.15)
    assert n >= fpt.unbiasedness_sample_size(0.15, X_SR.size)


def test_stochastic_rounding_catches_a_biased_rounding():
    """Rounding up with probability p + 0.15 (a bias of 0.15 steps) is detected."""
    expected, step = SR_TARGET
    lo = jnp.floor(expected / step) * step

    def biased(k):
        p = (expected - lo) / step
        return jnp.where(jax.random.uniform(k, expected.shape) < p + 0.15, lo + step, lo)

    with pytest.raises(AssertionError, match=r"biased: element \(\d, \d+\) averages \+0\.1"):
        fpt.assert_stochastic_rounding_unbiased(biased, SAMPLER, expected=expected, step=step,
                                                detectable_bias=0.15)


def test_stochastic_rounding_catches_round_to_nearest():
    """Deterministic round-to-nearest is biased per element (up to half a step)."""
    expected, step = SR_TARGET
    with pytest.raises(AssertionError, match="biased"):
        fpt.assert_stochastic_rounding_unbiased(
            lambda k: fp4jax.dequantize(fp4jax.quantize(X_SR)), SAMPLER, expected=expected,
            step=step, detectable_bias=0.15)


def test_stochastic_rounding_exact_elements_must_not_move():
    """An element with step 0 must always equal its expected value."""
    expected = jnp.zeros((4,))
    with pytest.raises(AssertionError, match=r"element \(2,\) has rounding step 0"):
        fpt.assert_stochastic_rounding_unbiased(
            lambda k: jnp.zeros(4).at[2].set(jax.random.uniform(k)), SAMPLER,
            expected=expected, step=0.0, detectable_bias=0.2)


# ---------------------------------------------------------------- recipe conformance

X_DOT = _x((32, 48), jnp.bfloat16, seed=1)
W_DOT = _x((48, 16), jnp.bfloat16, seed=2)
KEY = jax.random.key(2)


def test_conforms_to_recipe_passes_for_dot_general():
    """fp4jax.dot_general follows Recipe.nvfp4() in all three GEMMs."""
    fpt.assert_conforms_to_recipe(X_DOT, W_DOT, LINEAR, fp4jax.Recipe.nvfp4(), KEY)


def test_conforms_to_recipe_catches_a_recipe_mismatch():
    """A layer that rounds gradients to nearest is not Recipe.nvfp4(): dgrad is named."""
    fn = functools.partial(fp4jax.dot_general, recipe=fp4jax.Recipe.nvfp4_no_sr(), key=KEY)
    with pytest.raises(AssertionError, match=r"dgrad .* dgrad_grad=Operand\(.*stochastic"):
        fpt.assert_conforms_to_recipe(X_DOT, W_DOT, LINEAR, fp4jax.Recipe.nvfp4(), KEY, fn=fn)


def test_conforms_to_recipe_bf16_forward():
    """The end-of-training recipe (BF16 fprop, NVFP4 backward) is rebuilt too."""
    r = fp4jax.Recipe.nvfp4().with_bf16_forward()
    fpt.assert_conforms_to_recipe(X_DOT, W_DOT, LINEAR, r, KEY)


# ---------------------------------------------------------------- model-level checks

P = {"layer1": {"w": _x((16, 8), seed=3)}, "layer2": {"w": _x((8, 4), seed=4)}}
BATCH = _x((32, 16), seed=5)


def _loss(params, x, *, scale2=1.0, noise=0.0):
    """A two-layer model; ``scale2``/``noise`` change only layer 2's gradient, not the loss."""
    h = jnp.tanh(x @ params["layer1"]["w"])
    w2 = params["layer2"]["w"]
    sg = jax.lax.stop_gradient
    w2 = w2 + (scale2 - 1) * (w2 - sg(w2))  # gradient scaled by scale2
    w2 = w2 + noise * (jnp.sin(37.0 * w2) - sg(jnp.sin(37.0 * w2)))  # and turned
    return jnp.mean((h @ w2) ** 2)


def test_gradients_close_passes_and_reports_per_leaf():
    """Gradients of a slightly perturbed model pass; the stats name every leaf."""
    stats = fpt.assert_gradients_close_to_unquantized(
        functools.partial(_loss, scale2=1.01), _loss, P, BATCH, max_relative_error=0.1,
        min_cosine=0.99)
    assert sorted(stats) == ["layer1.w", "layer2.w"]
    assert all(rel < 0.05 and cos > 0.999 for rel, cos in stats.values())


def test_gradients_close_names_the_layer_out_of_bounds():
    """Scaling one layer's weights by 1.5 is reported for that layer, with the error."""
    with pytest.raises(AssertionError, match=r"1 of 2 parameters:\n  layer2\.w: relative "):
        fpt.assert_gradients_close_to_unquantized(
            functools.partial(_loss, scale2=1.5), _loss, P, BATCH, max_relative_error=0.3)


def test_gradients_close_checks_the_cosine_and_non_finite_leaves():
    """A direction change beyond min_cosine fails; so does a NaN gradient."""
    noisy = functools.partial(_loss, noise=0.3)
    stats = fpt.assert_gradients_close_to_unquantized(noisy, _loss, P, BATCH,
                                                      max_relative_error=10.0)
    _, cos = stats["layer2.w"]
    with pytest.raises(AssertionError, match=r"layer2\.w: cosine similarity"):
        fpt.assert_gradients_close_to_unquantized(noisy, _loss, P, BATCH,
                                                  max_relative_error=10.0,
                                                  min_cosine=(cos + 1) / 2)
    with pytest.raises(AssertionError, match=r"layer1\.w: non-finite gradient"):
        fpt.assert_gradients_close_to_unquantized(
            lambda p, x: _loss(p, x) + jnp.sqrt(-jnp.sum(p["layer1"]["w"] ** 2)), _loss, P,
            BATCH, max_relative_error=0.1)


def test_bitwise_equal_across_passes_and_skips_missing_backends():
    """fp4jax SR quantize→dequantize is bit-identical with and without jit; a backend that
    is not present is skipped with a warning; op_by_op adds the disable_jit variant."""
    # The input is an argument, not a closure constant: XLA folds a computation over
    # constants at compile time and may then reassociate scalar products (an ulp off).
    def sr_of(key, x):
        return fp4jax.dequantize(fp4jax.quantize(x, rounding="stochastic", key=key))

    names = fpt.assert_bitwise_equal_across(sr_of, jax.random.key(0), X_SR, backends=("cpu",))
    assert names == ("without_jit@cpu", "with_jit@cpu")
    with pytest.warns(UserWarning, match="backend 'no_such_backend' is not present; skipped"):
        fpt.assert_bitwise_equal_across(jnp.sin, X_SR, backends=("cpu", "no_such_backend"),
                                        op_by_op=True)


def test_bitwise_equal_across_catches_a_function_that_differs_under_jit():
    """A function whose result depends on being traced is reported with both bit patterns."""
    def fn(x):
        return x + (2.0**-20 if isinstance(x, jax.core.Tracer) else 0.0)

    with pytest.raises(AssertionError, match=r"with_jit@cpu differs from without_jit@cpu .* "
                                             r"first at \(0, 0\).*bits 0x"):
        fpt.assert_bitwise_equal_across(fn, jnp.ones((2, 3)), backends=("cpu",))
    fpt.assert_bitwise_equal_across(lambda x: x * jnp.nan, jnp.ones(3), backends=("cpu",))
