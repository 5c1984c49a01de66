"""fp4jax.dot_general: recipe conformance, gradients, dimension numbers, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax.recipe import Operand

LINEAR = (((1,), (0,)), ((), ()))


def _xw(m=48, k=64, n=32, dtype=jnp.bfloat16, seed=0):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
    w = (jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)).astype(dtype)
    return x, w


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


# ---------------------------------------------------------------- exact passthrough


@pytest.mark.parametrize("dn,shapes", [
    (LINEAR, ((48, 64), (64, 32))),
    ((((2,), (0,)), ((), ())), ((2, 24, 64), (64, 32))),
    ((((3,), (3,)), ((0, 1), (0, 1))), ((2, 3, 20, 32), (2, 3, 24, 32))),
])
def test_bf16_recipe_equals_lax_dot_general_exactly(dn, shapes):
    """Recipe.bf16(): values and both gradients are bit-identical to lax.dot_general."""
    a = jax.random.normal(jax.random.key(1), shapes[0], jnp.bfloat16)
    b = jax.random.normal(jax.random.key(2), shapes[1], jnp.bfloat16)
    f = lambda a, b: fp4jax.dot_general(a, b, dn, recipe=fp4jax.Recipe.bf16())  # noqa: E731
    g = lambda a, b: jax.lax.dot_general(a, b, dn)  # noqa: E731
    y1, vjp1 = jax.vjp(f, a, b)
    y2, vjp2 = jax.vjp(g, a, b)
    ct = jax.random.normal(jax.random.key(3), y1.shape, y1.dtype)
    for u, v in zip((y1, *vjp1(ct)), (y2, *vjp2(ct))):
        np.testing.assert_array_equal(_bits(u), _bits(v))


def test_nvfp4_is_not_full_precision():
    """The NVFP4 forward differs from BF16 (fake quantization must not silently vanish)."""
    x, w = _xw()
    key = jax.random.key(0)
    y = jax.jit(lambda x, w: fp4jax.dot_general(x, w, LINEAR, key=key))(x, w)
    y_bf16 = jax.lax.dot_general(x, w, LINEAR)
    assert 0.05 < _rel(y, y_bf16) < 0.3


# ---------------------------------------------------------------- recipe conformance


def _manual_linear(x, w, g, key, recipe):
    """The three GEMMs rebuilt from the public primitives, per RECIPE.md §6."""
    r = recipe
    k = lambda i: jax.random.fold_in(key, i)  # noqa: E731  role ids 0..5

    def q(t, axis, op, role):
        return fp4jax.quantize(
            t, axis=axis, block_2d=op.block_2d, rounding=op.rounding,
            key=k(role) if op.stochastic else None, hadamard=op.hadamard,
            hadamard_signs=r.hadamard_signs if op.hadamard else None)

    qx, qw = q(x, 1, r.fprop_lhs, 0), q(w, 0, r.fprop_rhs, 1)
    y = fp4jax.matmul(qx, qw)
    dx = fp4jax.matmul(q(g, 1, r.dgrad_grad, 2), qw.T if r.fprop_rhs.block_2d
                       else q(w, 1, r.dgrad_rhs, 3).T)
    dw = fp4jax.matmul(q(x, 0, r.wgrad_lhs, 4).T, q(g, 0, r.wgrad_grad, 5))
    return y, dx, dw


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_no_2d"])
def test_each_gemm_is_quantized_as_the_recipe_says(name):
    """dot_general's forward, dgrad and wgrad equal the GEMMs built by hand (bitwise)."""
    recipe = getattr(fp4jax.Recipe, name)()
    x, w = _xw(m=64, k=64, n=48, dtype=jnp.float32)
    g = jax.random.normal(jax.random.key(9), (64, 48))
    key = jax.random.key(4)
    y, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, LINEAR, recipe=recipe, key=key), x, w)
    dx, dw = vjp(g)
    my, mdx, mdw = _manual_linear(x, w, g, key, recipe)
    for got, want in ((y, my), (dx, mdx), (dw, mdw)):
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_recipe_roles_are_what_the_paper_says():
    """Recipe.nvfp4(): fprop RNE (W 2D), dgrad SR (W reused), wgrad RHT (+SR on dY)."""
    r = fp4jax.Recipe.nvfp4()
    assert r.fprop_lhs == Operand() and r.fprop_rhs == Operand(block_2d=True)
    assert r.dgrad_grad == Operand(rounding="stochastic") and r.dgrad_rhs == r.fprop_rhs
    assert r.wgrad_lhs == Operand(hadamard=True)
    assert r.wgrad_grad == Operand(rounding="stochastic", hadamard=True)
    assert r.hadamard_signs == fp4jax.DEFAULT_HADAMARD_SIGNS


# ---------------------------------------------------------------- accuracy


@pytest.mark.parametrize("name,bound", [("nvfp4", 0.25), ("nvfp4_no_sr", 0.2)])
def test_gradients_close_to_float64_reference(name, bound):
    """Y, dX, dW within the NVFP4 error band of the float64 products.

    Two E2M1 operands with 16-block E4M3 scales give ~0.13–0.15 relative RMS error on
    Gaussian data (~0.17 with stochastic rounding); the bound leaves margin but would
    catch a wrong scale (errors of O(1)) or a dropped quantization (< 0.05).
    """
    recipe = getattr(fp4jax.Recipe, name)()
    x, w = _xw(m=256, k=256, n=128, dtype=jnp.float32, seed=3)
    g = jax.random.normal(jax.random.key(8), (256, 128))
    y, vjp = jax.vjp(
        lambda x, w: fp4jax.dot_general(x, w, LINEAR, recipe=recipe, key=jax.random.key(1)), x, w)
    dx, dw = vjp(g)
    X, W, G = (np.asarray(a, np.float64) for a in (x, w, g))
    for got, want in ((y, X @ W), (dx, G @ W.T), (dw, X.T @ G)):
        assert 0.05 < _rel(got, want) < bound


def test_stochastic_rounding_keys():
    """Same key → identical gradients; another key → different gradients, same forward."""
    x, w = _xw()

    ct = jax.random.normal(jax.random.key(5), (48, 32), jnp.bfloat16)

    def grads(key):
        return jax.vjp(lambda x, w: fp4jax.dot_general(x, w, LINEAR, key=key), x, w)[1](ct)

    a, b, c = grads(jax.random.key(1)), grads(jax.random.key(1)), grads(jax.random.key(2))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(_bits(u), _bits(v))
    assert all(np.any(np.asarray(u) != np.asarray(v)) for u, v in zip(a, c))


# ---------------------------------------------------------------- dimension numbers


def _check_against_canonical(a, b, dn, key):
    """dot_general(dn) equals the canonical (M, K) x (K, N) computation, reshaped."""
    (lc, rc), (lb, rb) = dn
    y = fp4jax.dot_general(a, b, dn, key=key)
    assert y.shape == jax.lax.dot_general(a, b, dn).shape
    ref = jax.lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dn)
    assert 0.05 < _rel(y, ref) < 0.3
    grads = jax.grad(lambda a, b: fp4jax.dot_general(a, b, dn, key=key).astype(jnp.float32).sum(),
                     (0, 1))(a, b)
    assert grads[0].shape == a.shape and grads[1].shape == b.shape
    assert grads[0].dtype == a.dtype and grads[1].dtype == b.dtype
    return y


def test_nnx_linear_dimension_numbers():
    """x (batch, seq, K) · kernel (K, N), as nnx.Linear calls it, equals the 2D linear."""
    x, w = _xw(m=48, k=64, n=32)
    key = jax.random.key(0)
    y3 = _check_against_canonical(x.reshape(2, 24, 64), w, (((2,), (0,)), ((), ())), key)
    y2 = fp4jax.dot_general(x, w, LINEAR, key=key)
    np.testing.assert_array_equal(_bits(y3.reshape(48, 32)), _bits(y2))


def test_linear_general_multiple_contracting_dims():
    """Contracting (heads, head_dim) of x with (heads, head_dim, N): flattened K = 4*16."""
    key = jax.random.key(0)
    x = jax.random.normal(jax.random.key(1), (2, 8, 4, 16), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(2), (4, 16, 32), jnp.bfloat16)
    y = _check_against_canonical(x, w, (((2, 3), (0, 1)), ((), ())), key)
    y2 = fp4jax.dot_general(x.reshape(16, 64), w.reshape(64, 32), LINEAR, key=key)
    np.testing.assert_array_equal(_bits(y.reshape(16, 32)), _bits(y2))


def test_einsum_with_batch_dims_and_permuted_contraction():
    """'bqhd,bkhd->bhqk'-style: batch dims (b, h), contraction d, free dims not leading."""
    key = jax.random.key(0)
    q = jax.random.normal(jax.random.key(3), (2, 20, 3, 32), jnp.float32)
    k = jax.random.normal(jax.random.key(4), (2, 24, 3, 32), jnp.float32)
    _check_against_canonical(q, k, (((3,), (3,)), ((0, 2), (0, 2))), key)


def test_unaligned_sizes_are_padded_exactly():
    """M, K, N not multiples of 16 work; zero padding does not change the product."""
    x, w = _xw(m=37, k=50, n=19, dtype=jnp.float32)
    key = jax.random.key(0)
    y, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, LINEAR, key=key), x, w)
    dx, dw = vjp(jnp.ones_like(y))
    assert y.shape == (37, 19) and dx.shape == x.shape and dw.shape == w.shape
    X, W = np.asarray(x, np.float64), np.asarray(w, np.float64)
    assert _rel(y, X @ W) < 0.25
    assert _rel(dw, X.T @ np.ones((37, 19))) < 0.25


def test_preferred_element_type_precision_and_out_sharding_accepted():
    """lax.dot_general's keyword arguments are accepted (as flax.nnx.Linear passes them)."""
    x, w = _xw()
    key = jax.random.key(0)
    y = fp4jax.dot_general(x, w, LINEAR, jax.lax.Precision.HIGHEST, jnp.float32,
                           out_sharding=None, key=key)
    assert y.dtype == jnp.float32
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    y2 = jax.jit(lambda x, w: fp4jax.dot_general(x, w, LINEAR, preferred_element_type=jnp.float32,
                                                 out_sharding=sharding, key=key))(x, w)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y2))


def test_jit_no_recompilation():
    """A jitted training-style step compiles once across calls with new data and keys."""
    x, w = _xw()

    @jax.jit
    def step(x, w, key):
        return jax.grad(lambda w: fp4jax.dot_general(x, w, LINEAR, key=key)
                        .astype(jnp.float32).sum())(w)

    step(x, w, jax.random.key(0))
    step(x * 2, w, jax.random.key(1))
    assert step._cache_size() == 1


def test_backward_residuals_are_nvfp4():
    """What the VJP keeps for backward is packed NVFP4 (≤ 0.3x the BF16 bytes of X and W)."""
    x, w = _xw(m=256, k=256, n=256)
    _, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, LINEAR, key=jax.random.key(0)), x, w)
    leaves = [l for l in jax.tree_util.tree_leaves(vjp) if hasattr(l, "dtype")]
    big = [l for l in leaves if l.size >= 1024]
    assert big and all(l.dtype in (jnp.uint8, jnp.float8_e4m3fn) for l in big), \
        [(l.shape, l.dtype) for l in big]
    saved = sum(l.size * l.dtype.itemsize for l in leaves)
    assert saved <= 0.3 * (x.nbytes + w.nbytes)


@pytest.mark.parametrize("tokens,d_in,d_out", [(8192, 8192, 8192), (8192, 2048, 2048)])
def test_backward_residuals_at_the_benchmark_shapes_stay_under_0_3x_bf16(tokens, d_in, d_out):
    """At issue 9's layer shapes (shapes only: `jax.eval_shape`, nothing computed), the
    VJP's residuals take ≤ 0.3x the BF16 bytes of X and W (8192³: 0.267x; 2048: 0.275x,
    where the scales' 1/16 of the bytes weigh more beside a small W)."""
    x = jax.ShapeDtypeStruct((tokens, d_in), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((d_in, d_out), jnp.bfloat16)
    key = jax.random.key(0)
    vjp = jax.eval_shape(lambda x, w: jax.vjp(
        lambda x, w: fp4jax.dot_general(x, w, LINEAR, key=key), x, w)[1], x, w)
    saved = sum(l.size * l.dtype.itemsize for l in jax.tree_util.tree_leaves(vjp)
                if not jax.dtypes.issubdtype(l.dtype, jax.dtypes.prng_key))
    bf16 = 2 * (tokens * d_in + d_in * d_out)
    assert 0.25 * bf16 < saved <= 0.3 * bf16, saved / bf16


def test_non_finite_input_gives_nan_output():
    """A NaN/inf in X makes the NVFP4 product NaN (loudly), like a BF16 GEMM would."""
    x, w = _xw()
    y = fp4jax.dot_general(x.at[3, 5].set(jnp.inf), w, LINEAR, key=jax.random.key(0))
    assert np.all(np.isnan(np.asarray(y, np.float32)))


# ---------------------------------------------------------------- errors


def test_bad_inputs_raise_clear_errors():
    x, w = _xw()
    key = jax.random.key(0)
    with pytest.raises(TypeError, match="jax.random key"):
        fp4jax.dot_general(x, w, LINEAR, key=42)
    with pytest.raises(ValueError, match="contracting dims have different sizes"):
        fp4jax.dot_general(x, w[:32], LINEAR, key=key)
    with pytest.raises(ValueError, match="dimension_numbers"):
        fp4jax.dot_general(x, w, (((5,), (0,)), ((), ())), key=key)
    with pytest.raises(ValueError, match="dimension_numbers"):
        fp4jax.dot_general(x, w, "ij,jk", key=key)
    with pytest.raises(TypeError, match="int32"):
        fp4jax.dot_general(x.astype(jnp.int32), w, LINEAR, key=key)
    with pytest.raises(TypeError, match="Recipe"):
        fp4jax.dot_general(x, w, LINEAR, recipe="nvfp4", key=key)
    with pytest.raises(ValueError, match="impl"):
        fp4jax.dot_general(x, w, LINEAR, key=key, impl="cuda")
    with pytest.raises(TypeError, match="jax.random key"):
        fp4jax.dot_general(x, w, LINEAR, key=jnp.zeros(2))


def test_forward_needs_no_key_backward_says_it_does():
    """The forward GEMM rounds to nearest, so it runs without a key; the backward pass,
    which rounds dY stochastically, raises a clear error instead (issue 10 item 3)."""
    x, w = _xw()
    y = fp4jax.dot_general(x, w, LINEAR)
    np.testing.assert_array_equal(
        _bits(y), _bits(fp4jax.dot_general(x, w, LINEAR, key=jax.random.key(0))))
    with pytest.raises(ValueError, match="rounds dgrad_grad, wgrad_grad stochastically"):
        jax.grad(lambda x: fp4jax.dot_general(x, w, LINEAR).astype(jnp.float32).sum())(x)
    fwd_sr = fp4jax.Recipe.nvfp4().replace(fprop_lhs=Operand(rounding="stochastic"),
                                           fprop_rhs=Operand(rounding="stochastic"))
    with pytest.raises(ValueError, match="rounds fprop_lhs, fprop_rhs stochastically"):
        fp4jax.dot_general(x, w, LINEAR, recipe=fwd_sr)


def test_recipe_validation():
    """Invalid recipes raise ValueError naming the GEMM and the fields at fault."""
    r = fp4jax.Recipe.nvfp4()
    with pytest.raises(ValueError, match="wgrad: the Hadamard"):
        r.replace(wgrad_lhs=Operand())
    with pytest.raises(ValueError,
                       match="fprop: fprop_lhs is unquantized but fprop_rhs is nvfp4"):
        r.replace(fprop_lhs=fp4jax.UNQUANTIZED)
    with pytest.raises(ValueError, match="only apply to format='nvfp4'"):
        Operand(format="bf16", rounding="stochastic")
    with pytest.raises(ValueError, match="both hadamard"):
        Operand(hadamard=True, block_2d=True)
    with pytest.raises(ValueError, match="format"):
        Operand(format="fp8")
    with pytest.raises(ValueError, match="16 entries"):
        r.replace(hadamard_signs=(1,) * 15)
    with pytest.raises(TypeError, match="Operand"):
        r.replace(dgrad_grad="sr")
    assert fp4jax.Recipe.unquantized().is_unquantized and not r.is_unquantized
    # The old spellings stay as documented aliases of the "unquantized" names.
    assert fp4jax.Recipe.bf16() == fp4jax.Recipe.unquantized() and fp4jax.BF16 == fp4jax.UNQUANTIZED
    assert Operand(format="bf16").format == "unquantized" and fp4jax.Recipe.bf16().is_bf16
    assert r.with_bf16_forward() == r.with_unquantized_forward()
    assert r.needs_key and not fp4jax.Recipe.nvfp4_no_sr().needs_key
    f = r.with_bf16_forward()
    assert not f.fprop_lhs.quantized and f.dgrad_grad == r.dgrad_grad
    assert hash(r) == hash(fp4jax.Recipe.nvfp4())  # usable as a static jit argument


def test_bf16_forward_recipe_keeps_quantized_backward():
    """with_bf16_forward(): forward equals lax exactly, backward still NVFP4."""
    x, w = _xw(dtype=jnp.float32)
    r = fp4jax.Recipe.nvfp4().with_bf16_forward()
    y, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, LINEAR, recipe=r,
                                                     key=jax.random.key(0)), x, w)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(
        jax.lax.dot_general(x, w, LINEAR, preferred_element_type=jnp.float32)))
    dx, _ = vjp(jnp.ones_like(y))
    exact = np.ones((48, 32)) @ np.asarray(w, np.float64).T
    assert 0.02 < _rel(dx, exact) < 0.3


# ---------------------------------------------------------------- sharding
# Sharded operands (auto and explicit meshes, 8 host devices): tests/test_sharding.py.


def test_unquantized_forward_with_bf16_and_moved_contraction_runs_on_cpu():
    """with_bf16_forward() with bf16 inputs and the lhs contraction not last computes the
    forward with lax.dot_general's own dimension numbers (issue 10.10): no CPU DotThunk
    error, and the result is exactly lax.dot_general's."""
    x = jax.random.normal(jax.random.key(0), (32, 8, 4), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (32, 16), jnp.bfloat16)
    dn = (((0,), (0,)), ((), ()))
    r = fp4jax.Recipe.nvfp4().with_bf16_forward()
    y = fp4jax.dot_general(x, w, dn, recipe=r, key=jax.random.key(2))
    np.testing.assert_array_equal(_bits(y), _bits(jax.lax.dot_general(x, w, dn)))
