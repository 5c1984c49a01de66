"""Property-based tests (hypothesis) of every fp4jax primitive, via `fp4jax.testing`.

Inputs are drawn over shapes (rank 1–4, lengths that are not multiples of 16, size-1
axes), dtypes (float32, bfloat16, float16), magnitudes (1e-30…1e30, blocks spanning
many decades), placements of ±0, float32 subnormals, NaN and ±inf, and the recipe
presets. Shapes come from small fixed buckets so that compiled programs are reused:
XLA compilation, not the checks, is what these tests spend their time on.

Profiles (tests/conftest.py): ``ci`` (default; derandomized, fixed budget) and ``dev``
(``HYPOTHESIS_PROFILE=dev``, many more examples).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fp4jax
import fp4jax.testing as fpt

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# Decimal exponent range of a tensor's magnitude per dtype (float16 tops out at 65504;
# its RHT may grow a 16-run's values up to 4x).
EXPONENTS = {jnp.float32: (-30, 30), jnp.bfloat16: (-30, 30), jnp.float16: (-3, 2)}
SHAPES = ((7,), (16,), (1, 16), (3, 17), (17, 1), (2, 32), (2, 1, 48), (2, 1, 3, 32))
RECIPES = ("nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_no_2d")
LINEAR = (((1,), (0,)), ((), ()))


def budget(fraction: float):
    """This test's share of the profile's example budget (expensive tests get fewer)."""
    return settings(max_examples=max(2, round(settings.default.max_examples * fraction)))


@st.composite
def tensors(draw, shape, dtype, *, specials=True, nonfinite=True):
    """An array of ``shape``/``dtype`` with magnitudes 10**e, e drawn in the dtype's range.

    Elements are normal samples scaled log-uniformly over ``spread`` decades below the
    tensor's magnitude (so blocks range from full to underflowing E4M3 scales), then
    optionally overwritten at drawn positions by ±0, a float32 subnormal, NaN or ±inf.
    """
    lo, hi = EXPONENTS[dtype]
    kind = draw(st.sampled_from(("random", "random", "random", "zeros", "constant")))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if kind == "zeros":
        x = np.zeros(shape)
    elif kind == "constant":
        x = np.full(shape, draw(st.sampled_from((-1.0, 0.5, 3.0))) * 10.0 ** draw(
            st.integers(lo, hi)))
    else:
        e = draw(st.integers(lo, hi))
        spread = draw(st.sampled_from((0, 3, 12)))
        x = rng.normal(size=shape) * 10.0 ** (e - spread * rng.random(size=shape))
    if specials:
        pool = [0.0, -0.0, 1e-40 if dtype != jnp.float16 else 1e-7]
        pool += [np.nan, np.inf, -np.inf] if nonfinite else []
        n = int(np.prod(shape))
        for _ in range(draw(st.integers(0, 3))):
            x.flat[draw(st.integers(0, n - 1))] = draw(st.sampled_from(pool))
    with np.errstate(over="ignore"):
        return jnp.asarray(np.asarray(x, np.float32)).astype(dtype)


@st.composite
def quantize_cases(draw, shapes=SHAPES, rounding=("nearest", "stochastic")):
    """(x, quantize options) with every valid axis / 1D-2D / Hadamard combination."""
    shape = draw(st.sampled_from(shapes))
    dtype = draw(st.sampled_from(DTYPES))
    x = draw(tensors(shape, dtype))
    axis = draw(st.sampled_from(range(len(shape))))
    layouts = ["1d"]
    if len(shape) >= 2 and axis >= len(shape) - 2:
        layouts.append("2d")
    if shape[axis] % 16 == 0:
        layouts.append("hadamard")
    layout = draw(st.sampled_from(layouts))
    mode = draw(st.sampled_from(rounding))
    key = jax.random.key(draw(st.integers(0, 2**31 - 1))) if mode == "stochastic" else None
    return x, {"axis": axis, "block_2d": layout == "2d", "hadamard": layout == "hadamard",
               "rounding": mode, "key": key}


# ---------------------------------------------------------------- quantize / dequantize


@given(quantize_cases())
def test_quantize_dequantize_properties(case):
    """For any input and options: storage layout and dtypes as documented; each element
    within the NVFP4 error bound of its block (all NaN for non-finite input);
    quantize(-x) flips exactly the sign bits; quantize(dequantize(q)) == q (round to
    nearest)."""
    x, opts = case
    q = fp4jax.quantize(x, **opts)
    n = q.shape[q.axis]
    padded = -(-n // 16) * 16
    data_shape = list(x.shape)
    data_shape[q.axis] = padded // 2
    scale_shape = list(x.shape)
    scale_shape[q.axis] = padded // 16
    if q.block_2d:
        scale_shape[q.tile_axis] = -(-x.shape[q.tile_axis] // 16)
    chex.assert_shape([q.data, q.scales, q.amax], [data_shape, scale_shape, ()])
    chex.assert_type([q.data, q.scales, q.amax], [jnp.uint8, jnp.float8_e4m3fn, jnp.float32])
    assert (q.shape, q.dtype, q.hadamard) == (x.shape, x.dtype, opts["hadamard"])
    y = jax.eval_shape(functools.partial(fp4jax.dequantize, dtype=x.dtype), q)
    assert (y.shape, y.dtype) == (x.shape, x.dtype)

    fpt.assert_quantization_error_bounded(x, q, rounding=opts["rounding"])
    fpt.assert_sign_symmetric(x, **opts)
    if opts["rounding"] == "nearest":
        fpt.assert_roundtrip_idempotent(q)


@budget(0.3)
@given(quantize_cases(shapes=((3, 17), (2, 32)), rounding=("nearest",)))
@pytest.mark.filterwarnings("ignore:assert_bitwise_equal_across")
def test_quantize_same_bits_with_and_without_jit(case):
    """quantize → (codes, scales, amax, dequantized) are bit-identical eagerly and jitted
    (and on the GPU when one is present)."""
    x, opts = case
    def fn(x):
        q = fp4jax.quantize(x, **opts)
        return q.data, q.scales, q.amax, fp4jax.dequantize(q)

    fpt.assert_bitwise_equal_across(fn, x, backends=("cpu", "gpu"))


# ---------------------------------------------------------------- random Hadamard transform


_rht = jax.jit(fp4jax.rht, static_argnums=(1, 2))


def _rht_matrix(signs) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    return np.asarray(signs, np.float64)[:, None] * h / 4


@budget(0.5)
@given(st.sampled_from(((16,), (2, 32), (3, 16, 2), (1, 2, 1, 16))), st.sampled_from(DTYPES),
       st.data())
def test_rht_is_the_rounded_orthogonal_transform(shape, dtype, data):
    """rht(x) along an axis of 16-multiples equals (x · diag(s) H16 / 4) per 16-run, rounded
    once to the input dtype (up to float32 butterfly rounding); rht(-x) == -rht(x)
    bitwise; quantize(x, hadamard=True) quantizes exactly rht(x)."""
    axis = data.draw(st.sampled_from([a for a in range(len(shape)) if shape[a] % 16 == 0]))
    x = data.draw(tensors(shape, dtype, nonfinite=False))
    signs = data.draw(st.sampled_from((fp4jax.DEFAULT_HADAMARD_SIGNS, (1,) * 16,
                                       (-1,) * 8 + (1,) * 8)))
    y = _rht(x, axis, signs)
    chex.assert_shape(y, x.shape)
    xf = np.moveaxis(np.asarray(x.astype(jnp.float32), np.float64), axis, -1)
    runs = xf.reshape(*xf.shape[:-1], -1, 16)
    exact = np.moveaxis((runs @ _rht_matrix(signs)).reshape(xf.shape), -1, axis)
    scale = np.moveaxis(np.repeat(np.abs(runs).max(-1), 16, -1).reshape(xf.shape), -1, axis)
    eps = float(jnp.finfo(dtype).eps)
    tiny = float(jnp.finfo(dtype).smallest_subnormal)
    bound = np.abs(exact) * eps / 2 + scale * 2.0**-19 + tiny + float(np.finfo(np.float32).tiny)
    err = np.abs(np.asarray(y, np.float64) - exact)
    assert (err <= bound).all(), (
        f"rht off by {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}, "
        f"bound {bound.flat[err.argmax()]:.3g}")
    chex.assert_trees_all_equal(_rht(-x, axis, signs), -y)
    q1 = fp4jax.quantize(x, axis=axis, hadamard=True, hadamard_signs=signs)
    q2 = fp4jax.quantize(y, axis=axis)
    chex.assert_trees_all_equal((q1.data, q1.scales, q1.amax), (q2.data, q2.scales, q2.amax))


# ---------------------------------------------------------------- stochastic rounding


@budget(0.3)
@given(st.sampled_from(((2, 16), (3, 17), (2, 1, 20))), st.sampled_from(DTYPES),
       st.sampled_from(("1d", "2d", "hadamard")), st.integers(0, 2**31 - 1), st.data())
def test_stochastic_rounding_is_unbiased_and_deterministic(shape, dtype, layout, seed, data):
    """SR's dequantized mean equals the (block-range-clamped) input per element, within
    the statistical test sized to detect a 0.2-step bias; the same key gives the same
    bits."""
    x = data.draw(tensors(shape, dtype, specials=False))
    opts = {"block_2d": layout == "2d",
            "hadamard": layout == "hadamard" and shape[-1] % 16 == 0}
    expected, step = fpt.stochastic_rounding_target(x, **opts)
    base = jax.random.key(seed)

    def sr(k):
        return fp4jax.dequantize(fp4jax.quantize(x, rounding="stochastic", key=k, **opts))

    fpt.assert_stochastic_rounding_unbiased(
        sr, lambda i: jax.random.fold_in(base, i), expected=expected, step=step,
        detectable_bias=0.2)
    chex.assert_trees_all_equal(sr(base), sr(base))


# ---------------------------------------------------------------- dot_general, fwd and bwd

# (lhs shape, rhs shape, dimension numbers): a linear layer, one with 3D activations,
# 1-sized and unaligned dims, batch dims (attention-style), two contracting dims.
DOT_CASES = (
    ((5, 33), (33, 7), LINEAR),
    ((2, 3, 16), (16, 20), (((2,), (0,)), ((), ()))),
    ((1, 17), (17, 1), LINEAR),
    ((2, 4, 16), (2, 16, 3), (((2,), (1,)), ((0,), (0,)))),
    ((3, 2, 8), (2, 8, 5), (((1, 2), (0, 1)), ((), ()))),
)


@budget(0.5)
@given(st.sampled_from(DOT_CASES), st.sampled_from(RECIPES),
       st.sampled_from((jnp.float32, jnp.bfloat16)), st.integers(0, 2**31 - 1), st.data())
def test_dot_general_fwd_bwd_conform_to_recipe(case, recipe, dtype, seed, data):
    """fp4jax.dot_general's forward, dgrad and wgrad equal the GEMMs rebuilt from
    fp4jax.quantize + fp4jax.matmul as the recipe says, bit for bit, for any dimension
    numbers, shapes, magnitudes and non-finite placements."""
    lhs_shape, rhs_shape, dn = case
    lhs = data.draw(tensors(lhs_shape, dtype))
    rhs = data.draw(tensors(rhs_shape, dtype, specials=False))
    fpt.assert_conforms_to_recipe(lhs, rhs, dn, getattr(fp4jax.Recipe, recipe)(),
                                  jax.random.key(seed))


# ---------------------------------------------------------------- the Flax adapter


@budget(0.25)
@given(st.sampled_from(((16, 8), (20, 1), (33, 4))), st.sampled_from(((), (1,), (2, 3))),
       st.sampled_from(RECIPES), st.sampled_from((jnp.float32, jnp.bfloat16)),
       st.integers(0, 2**31 - 1), st.data())
def test_flax_dot_general_on_nnx_linear_is_dot_general_with_layer_key(
        features, batch, recipe, dtype, seed, data):
    """An nnx.Linear with dot_general=fp4jax.flax.DotGeneral(name), called in a
    step_scope(step_key), computes exactly fp4jax.dot_general(x, kernel, recipe=...,
    key=layer_key(step_key, name)) forward and backward (which conforms to the recipe:
    test_dot_general_fwd_bwd_conform_to_recipe)."""
    from flax import nnx

    from fp4jax import flax as fp4flax

    din, dout = features
    r = getattr(fp4jax.Recipe, recipe)()
    layer = nnx.Linear(din, dout, use_bias=False, dtype=dtype, param_dtype=dtype,
                       dot_general=fp4flax.DotGeneral(name="mlp.up", recipe=r),
                       rngs=nnx.Rngs(seed % 1000))
    graphdef, state = nnx.split(layer)
    step_key = jax.random.key(seed)
    x = data.draw(tensors(batch + (din,), dtype, specials=False))
    dn = (((len(batch),), (0,)), ((), ()))

    def via_layer(x, kernel):
        with fp4flax.step_scope(step_key):
            return nnx.merge(graphdef, jax.tree.map(lambda _: kernel, state))(x)

    def direct(x, kernel):
        return fp4jax.dot_general(x, kernel, dn, recipe=r,
                                  key=fp4jax.layer_key(step_key, "mlp.up"))

    kernel = layer.kernel[...]
    y1, vjp1 = jax.vjp(via_layer, x, kernel)
    y2, vjp2 = jax.vjp(direct, x, kernel)
    chex.assert_shape(y1, batch + (dout,))
    chex.assert_type(y1, dtype)
    ct = jax.random.normal(jax.random.key(seed % 7), y1.shape).astype(y1.dtype)
    chex.assert_trees_all_equal((y1, *vjp1(ct)), (y2, *vjp2(ct)))
