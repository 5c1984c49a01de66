"""Models shaped like Flax's own examples: stacked (scanned/vmapped) layers draw their own
stochastic-rounding keys, and forward passes need no key (issue 10, items 2 and 3).

Every quantized GEMM here is the same (32, 32) x (32, 32) product, so the eager
quantize ops share JAX's compilation cache.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4jax
import fp4jax.train
from fp4jax.flax import step_scope

STEP_KEY = jax.random.key(7)
X = jnp.asarray(np.random.default_rng(0).standard_normal((32, 32)), jnp.float32)
G = jnp.asarray(np.random.default_rng(1).standard_normal((32, 32)), jnp.float32)
WGRAD_SR = fp4jax.Recipe.bf16().replace(
    wgrad_lhs=fp4jax.Operand(), wgrad_grad=fp4jax.Operand(rounding="stochastic"))
"""Only the weight gradient in NVFP4 with SR: the key-dependent part, cheap to compile."""


def _bits(x):
    return np.asarray(x).reshape(-1).view(np.uint8).tobytes()


def _stacked_linears(n=2, recipe=None):
    """``n`` nnx.Linear layers stacked by nnx.vmap (Flax's scan-over-layers idiom), all
    with the kernel of the first, converted to NVFP4 (default: `Recipe.nvfp4`)."""

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return nnx.Linear(32, 32, use_bias=False, rngs=rngs)

    layers = make(nnx.Rngs(0))
    layers.kernel[...] = jnp.broadcast_to(layers.kernel[...][:1], layers.kernel[...].shape)
    report = fp4jax.flax.nnx.quantize(layers, fp4jax.flax.Policy(default=recipe or
                                                                   fp4jax.Recipe.nvfp4()))
    assert report.quantized == ("root",)
    return layers


def _kernel_grads(layers, apply):
    """d/dkernel of sum(G * y) for every stacked layer, each fed the same input X, twice."""
    loss_fn, params = fp4jax.train.nnx_loss_fn(layers, lambda m, x: jnp.sum(apply(m, x) * G))

    @jax.jit
    def grads(params, step_key):
        def loss(params):
            with step_scope(step_key):
                return loss_fn(params, X)

        return jax.grad(loss)(params)["kernel"][...]

    return np.asarray(grads(params, STEP_KEY)), np.asarray(grads(params, STEP_KEY))


def _scan(layers, x):
    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=(nnx.Carry, 0))
    def body(layer, x):
        return x, layer(x)  # the carry passes through: every layer sees the same input

    return body(layers, x)[1]


def _vmap(layers, x):
    return nnx.vmap(lambda layer, x: layer(x), in_axes=(0, None))(layers, x)


@pytest.mark.parametrize("apply,recipe", [(_scan, None), (_vmap, WGRAD_SR)],
                         ids=["nnx.scan-nvfp4", "nnx.vmap-wgrad_sr"])
def test_stacked_nnx_layers_draw_their_own_sr_keys(apply, recipe):
    """Two stacked layers with equal kernels and equal inputs get different kernel
    gradients (each draws its own stochastic-rounding bits), and the same ones again
    when the step is repeated."""
    layers = _stacked_linears(recipe=recipe)
    g, again = _kernel_grads(layers, apply)
    assert g.shape == (2, 32, 32)
    assert not np.array_equal(g[0], g[1])
    assert _bits(g) == _bits(again)
    np.testing.assert_allclose(g[0], g[1], rtol=0.5, atol=0.5 * np.abs(g).max())


def test_stacked_nnx_layer_with_broadcast_sr_index_is_a_clear_error():
    """Scanning the parameters but broadcasting the other state would hand every stacked
    layer the whole SR index: a clear error, not a silent key collision."""
    layers = _stacked_linears()
    axes = nnx.StateAxes({nnx.Param: 0, ...: None})

    def apply(layers, x):
        return nnx.vmap(lambda layer, x: layer(x), in_axes=(axes, None))(layers, x)

    with pytest.raises(ValueError, match="SRIndex"):
        _kernel_grads(layers, apply)


class _ScannedDense(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        dense = nn.Dense(32, use_bias=False,
                         dot_general_cls=fp4jax.flax.linen.dot_general_cls(WGRAD_SR))
        return x, dense(x)  # the carry passes through: every layer sees the same input


def _linen_stack(collections):
    return nn.scan(_ScannedDense, variable_axes={c: 0 for c in collections},
                   split_rngs={"params": True}, length=2)


def test_stacked_linen_layers_draw_their_own_sr_keys():
    """linen nn.scan: with the ``fp4jax`` collection scanned along with the parameters,
    equal stacked layers get different kernel gradients, reproducibly; forgetting the
    collection (at init or apply) is a clear error rather than one shared key."""
    model = _linen_stack(("params", "fp4jax"))()
    with step_scope(STEP_KEY):
        variables = model.init(jax.random.key(0), X, None)
    (salts,) = jax.tree.leaves(variables["fp4jax"])  # one salt per stacked layer
    assert salts.shape == (2,) and salts[0] != salts[1]
    params = variables["params"]
    params = jax.tree.map(lambda k: jnp.broadcast_to(k[:1], k.shape), params)

    @jax.jit
    def grads(params, step_key):
        def loss(params):
            with step_scope(step_key):
                _, ys = model.apply({**variables, "params": params}, X, None)
            return jnp.sum(ys * G)

        return jax.grad(loss)(params)

    g = jax.tree.leaves(grads(params, STEP_KEY))[0]
    again = jax.tree.leaves(grads(params, STEP_KEY))[0]
    assert g.shape == (2, 32, 32) and not np.array_equal(g[0], g[1])
    assert _bits(g) == _bits(again)

    with pytest.raises(ValueError, match="fp4jax"), step_scope(STEP_KEY):
        model.apply({"params": params}, X, None)
    with pytest.raises(ValueError, match="variable_axes"), step_scope(STEP_KEY):
        _linen_stack(("params",))().init(jax.random.key(0), X, None)


def test_a_layer_called_twice_in_a_step_draws_two_keys():
    """Weight sharing: the two calls of one layer round their output gradients with
    different bits (the input gradients of the two calls differ)."""
    dgrad_sr = fp4jax.Recipe.bf16().replace(
        dgrad_grad=fp4jax.Operand(rounding="stochastic"), dgrad_rhs=fp4jax.Operand())
    layer = nnx.Linear(32, 32, use_bias=False,
                       dot_general=fp4jax.flax.DotGeneral(name="fc", recipe=dgrad_sr),
                       rngs=nnx.Rngs(0))

    @jax.jit
    def input_grads(x, g):
        def twice(x):
            with step_scope(STEP_KEY):
                return layer(x), layer(x)

        _, vjp = jax.vjp(twice, x)
        return vjp((g, jnp.zeros_like(g)))[0], vjp((jnp.zeros_like(g), g))[0]

    dx1, dx2 = input_grads(X, G)
    assert not np.array_equal(dx1, dx2)


def test_forward_passes_need_no_key():
    """``model.init`` of a linen layer with the fp4jax ``dot_general_cls`` and nnx
    inference outside any step scope work; the forward rounds to nearest, so it equals
    the forward inside a scope bit for bit."""
    dense = nn.Dense(32, use_bias=False, dot_general_cls=fp4jax.flax.linen.dot_general_cls())
    variables = dense.init(jax.random.key(0), X)  # no step scope
    with step_scope(STEP_KEY):
        inside = dense.apply(variables, X)
    assert _bits(dense.apply(variables, X)) == _bits(inside)

    layer = nnx.Linear(32, 32, use_bias=False, dot_general=fp4jax.flax.DotGeneral(name="fc"),
                       rngs=nnx.Rngs(0))
    with step_scope(STEP_KEY):
        inside = layer(X)
    assert _bits(layer(X)) == _bits(inside)
    stacked = _stacked_linears()
    assert _vmap(stacked, X).shape == (2, 32, 32)


def test_a_stochastic_backward_without_a_key_is_a_clear_error():
    """Only a backward pass that rounds stochastically needs a key; without one it
    raises a ValueError that says so."""
    layer = nnx.Linear(32, 32, use_bias=False, dot_general=fp4jax.flax.DotGeneral(name="fc"),
                       rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"stochastic.*key"):
        jax.grad(lambda x: jnp.sum(layer(x)))(X)
