"""fp4jax.flax adapters: nnx and linen layers compute exactly what fp4jax.dot_general does."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4jax
from fp4jax.flax import DotGeneral, Einsum, step_scope
from fp4jax.flax.einsum import einsum, plan

R = fp4jax.Recipe.nvfp4()
DN = (((1,), (0,)), ((), ()))
STEP_KEY = jax.random.key(7)


def _normal(seed, shape):
    """Test data from numpy (a new shape under jax.random costs a compilation)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _bits_equal(a, b):
    return all(
        np.array_equal(np.asarray(x).reshape(-1).view(np.uint8),
                       np.asarray(y).reshape(-1).view(np.uint8))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _direct(x, w, dn, name, step_key=STEP_KEY, recipe=R):
    return fp4jax.dot_general(x, w, dn, recipe=recipe, key=fp4jax.layer_key(step_key, name))


# All adapters below reduce to the same canonical (1, 32, 32) x (1, 32, 32) GEMM, so
# their eager quantize ops share JAX's per-op compilation cache (keeps the file fast).


def test_nnx_linear_matches_direct_dot_general_forward_and_gradients():
    """nnx.Linear(dot_general=DotGeneral(name)) == fp4jax.dot_general with layer_key(step, name)."""
    layer = nnx.Linear(32, 32, use_bias=False, dot_general=DotGeneral(name="fc"),
                       rngs=nnx.Rngs(0))
    x = _normal(1, (32, 32))
    graphdef, params = nnx.split(layer)
    kernel = params["kernel"][...]

    def via_layer(x, k, step_key=STEP_KEY):
        params["kernel"] = params["kernel"].replace(k)
        with step_scope(step_key):
            return jnp.sum(nnx.merge(graphdef, params)(x) ** 2)

    def via_direct(x, k):
        return jnp.sum(_direct(x, k, DN, "fc") ** 2)

    got = jax.value_and_grad(via_layer, argnums=(0, 1))(x, kernel)
    want = jax.value_and_grad(via_direct, argnums=(0, 1))(x, kernel)
    assert _bits_equal(got, want)
    # Gradients depend on the step key only: a new key draws new SR bits.
    other = jax.value_and_grad(via_layer, argnums=(0, 1))(x, kernel, jax.random.key(8))
    assert other[0] == got[0] and not np.array_equal(other[1][1], got[1][1])


def test_nnx_linear_general_and_einsum_match_direct():
    """LinearGeneral (2 contracting axes, as MHA's out projection) and Einsum adapters are
    exact, with the input as lhs and the kernel as rhs."""
    x = _normal(3, (2, 16, 2, 16))
    lg = nnx.LinearGeneral((2, 16), 32, axis=(-2, -1), use_bias=False,
                           dot_general=DotGeneral(name="attn.out"), rngs=nnx.Rngs(0))
    with step_scope(STEP_KEY):
        y = lg(x)
    want = _direct(x, lg.kernel[...], (((2, 3), (0, 1)), ((), ())), "attn.out")
    assert _bits_equal(y, want)

    xe = x.reshape(2, 16, 32)
    es = nnx.Einsum("btd,dnh->bnth", (32, 2, 16), einsum_op=Einsum(name="q"), rngs=nnx.Rngs(1))
    with step_scope(STEP_KEY):
        y = es(xe)
    want = _direct(xe, es.kernel[...], (((2,), (0,)), ((), ())), "q").transpose(0, 2, 1, 3)
    assert y.shape == (2, 2, 16, 16) and _bits_equal(y, want)


@pytest.mark.parametrize(
    "eq,ls,rs",
    [("btd,dnh->btnh", (2, 3, 16), (16, 4, 5)), ("...d,dh->...h", (2, 3, 16), (16, 8)),
     ("bnd,bdk->bkn", (2, 3, 16), (2, 16, 4)), ("abd,dc->ca", (2, 3, 16), (16, 5))],
)
def test_einsum_plan_matches_jnp_einsum(eq, ls, rs):
    """The planned dot_general (input as lhs, kernel as rhs) computes jnp.einsum."""
    a, b = _normal(0, ls), _normal(1, rs)
    got = einsum(eq, a, b, dot_general=jax.lax.dot_general)
    np.testing.assert_allclose(got, jnp.einsum(eq, a, b), rtol=1e-5, atol=1e-5)


def test_einsum_plan_rejects_unsupported_equations():
    with pytest.raises(ValueError, match="explicit two-operand"):
        plan("ab,bc", 2, 2)
    with pytest.raises(ValueError, match="repeats a label"):
        plan("aab,bc->ac", 3, 2)


class _Block(nnx.Module):
    def __init__(self, rngs):
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=32, qkv_features=32,
                                           decode=False, rngs=rngs)
        self.up = nnx.Linear(32, 64, rngs=rngs)
        self.proj = nnx.Einsum("btf,fd->btd", (64, 32), rngs=rngs)

    def __call__(self, x):
        return self.proj(nnx.relu(self.up(self.attn(x))))


class _Model(nnx.Module):
    def __init__(self, rngs):
        self.blocks = nnx.List([_Block(rngs) for _ in range(2)])
        self.head = nnx.Linear(32, 8, rngs=rngs)

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_nnx_quantize_converts_every_matmul_layer_and_keys_reach_each():
    """Policy conversion covers Linear, LinearGeneral (MHA projections) and Einsum; each
    quantized layer is called under its own path name, so it gets its own SR key."""
    model = _Model(nnx.Rngs(0))
    report = fp4jax.flax.nnx.quantize(model, fp4jax.flax.paper_policy(num_blocks=2))
    expected = {f"blocks.{i}.{n}" for i in range(2)
                for n in ("attn.query", "attn.key", "attn.value", "attn.out", "up", "proj")}
    assert set(report.quantized) == expected
    assert report.high_precision == ("head",)
    x = _normal(0, (2, 16, 32))
    scopes = []

    def run(x):  # traced only (eval_shape): key derivation happens at trace time
        with step_scope(STEP_KEY) as scope:
            scopes.append(scope)
            return model(x)

    jax.eval_shape(run, x)
    scope = scopes[0]
    assert set(scope._calls) == expected  # noqa: SLF001 - every quantized layer asked for a key
    keys = {n: np.asarray(jax.random.key_data(scope.layer_key(n))).tobytes() for n in expected}
    assert len(set(keys.values())) == len(expected)


def test_bad_names_keys_and_modes_are_clear_errors():
    """(A layer outside a step scope: tests/test_flax_models.py.)"""
    with pytest.raises(ValueError, match="non-empty str"):
        DotGeneral(name="")
    with pytest.raises(TypeError, match="step_scope needs a jax.random key"):
        with step_scope(3):
            pass
    with pytest.raises(ValueError, match="mode must be one of"):
        with step_scope(STEP_KEY, mode="fp8"):
            pass


def test_bf16_forward_mode_makes_the_forward_gemm_exactly_bf16():
    """Under mode='bf16_forward' the layer output is the plain lax.dot_general output."""
    layer = nnx.Linear(32, 32, use_bias=False, dot_general=DotGeneral(name="fc"),
                       rngs=nnx.Rngs(0))
    x = _normal(0, (32, 32))
    ref = jax.lax.dot_general(x, layer.kernel[...], DN)
    with step_scope(STEP_KEY, mode="bf16_forward"):
        assert _bits_equal(layer(x), ref)
    with step_scope(STEP_KEY):
        assert not np.array_equal(layer(x), ref)


class _Seq(nn.Module):
    cls: object = None

    @nn.compact
    def __call__(self, x):
        kw = {} if self.cls is None else {"dot_general_cls": self.cls}
        x = nn.relu(nn.Dense(32, use_bias=False, name="up", **kw)(x))
        return nn.Dense(8, use_bias=False, name="head")(x)


def test_linen_dot_general_cls_and_policy_match_direct_dot_general():
    """linen: dot_general_cls on one layer and quantize(policy) on the model give the
    numbers (output and gradients) of fp4jax.dot_general keyed by the layer path."""
    x = _normal(0, (32, 32))
    params = _Seq().init(jax.random.key(1), x)
    policy = fp4jax.flax.Policy(rules=(fp4jax.flax.Rule(pattern="head", recipe=None),))

    def by_cls(p):
        with step_scope(STEP_KEY):
            return jnp.sum(_Seq(cls=fp4jax.flax.linen.dot_general_cls()).apply(p, x) ** 2)

    def by_policy(p):
        with step_scope(STEP_KEY), fp4jax.flax.linen.quantize(policy) as rec:
            out = jnp.sum(_Seq().apply(p, x) ** 2)
        assert rec.report().quantized == ("up",)
        return out

    def direct(p):
        w = p["params"]
        h = nn.relu(_direct(x, w["up"]["kernel"], DN, "up"))
        return jnp.sum((h @ w["head"]["kernel"]) ** 2)

    want = jax.value_and_grad(direct)(params)
    assert _bits_equal(jax.value_and_grad(by_cls)(params), want)
    assert _bits_equal(jax.value_and_grad(by_policy)(params), want)
