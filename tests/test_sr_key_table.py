"""A step's SR keys derived all at once (the step scope's key table) are bit for bit the
keys each call derives on its own, and the program holds O(1) threefry hashes, not
O(layers).

The GEMMs here are (32, 32) x (32, 32) products with only their key-dependent parts
in NVFP4 (cheap to compile): both gradient GEMMs, with dY rounded stochastically in
both (`GRAD_SR`), or the weight gradient alone (`WGRAD_SR`, the training steps).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import fp4jax
import fp4jax.train
from fp4jax import keys
from fp4jax import quantized_dot as qd
from fp4jax.flax import Scope

GRAD_SR = fp4jax.Recipe.bf16().replace(
    dgrad_grad=fp4jax.Operand(rounding="stochastic"), dgrad_rhs=fp4jax.Operand(),
    wgrad_lhs=fp4jax.Operand(), wgrad_grad=fp4jax.Operand(rounding="stochastic"))
"""Both gradient GEMMs in NVFP4, dY rounded stochastically in both: two operand keys."""
WGRAD_SR = fp4jax.Recipe.bf16().replace(
    wgrad_lhs=fp4jax.Operand(), wgrad_grad=fp4jax.Operand(rounding="stochastic"))

NAMES = ["blocks.0.attn.q", "blocks.0.mlp.up", "head", "", "ünï.cödé"]
STEP_KEYS = [jax.random.key(3), jax.random.PRNGKey(3)]
X = jnp.asarray(np.random.default_rng(0).standard_normal((32, 32)), jnp.float32)
G = jnp.asarray(np.random.default_rng(1).standard_normal((32, 32)), jnp.float32)
DN = (((1,), (0,)), ((), ()))


def _data(k):
    return np.asarray(jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key)
                      else k)


def _bits(tree):
    return [np.asarray(x).reshape(-1).view(np.uint8).tobytes() for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("step_key", STEP_KEYS, ids=["typed", "raw"])
def test_layer_keys_and_role_tables_are_the_per_call_keys(step_key):
    """`keys.layer_keys` row i is `keys.layer_key` of name i, and `role_key_table` row r
    is ``fold_in(key, r)`` for every role r, also under vmap over several layers' keys."""
    table = keys.layer_keys(step_key, NAMES)
    roles = jax.vmap(qd.role_key_table)(table)
    assert sorted(qd.ROLE_IDS.values()) == list(range(len(qd.ROLE_IDS)))
    for i, name in enumerate(NAMES):
        want = keys.layer_key(step_key, name)
        np.testing.assert_array_equal(_data(table[i]), _data(want))
        for role, r in qd.ROLE_IDS.items():
            np.testing.assert_array_equal(_data(roles[i][r]),
                                          _data(jax.random.fold_in(want, r)), err_msg=role)
    assert not np.array_equal(_data(table[0]), _data(table[1]))


def test_bad_names_and_role_tables_are_clear_errors():
    """Wrong arguments name themselves."""
    k = jax.random.key(0)
    with pytest.raises(ValueError, match="at least one"):
        keys.layer_keys(k, [])
    with pytest.raises(TypeError, match="sequence of str"):
        keys.layer_keys(k, "head")
    with pytest.raises(TypeError, match="names must be str"):
        keys.layer_keys(k, ["head", 3])
    with pytest.raises(TypeError, match="layer_names must hold str"):
        Scope(key=k, layer_names=["a", None])
    with pytest.raises(TypeError, match="layer_names must be an iterable"):
        Scope(key=k, layer_names="head")
    with pytest.raises(ValueError, match="one key per role"):
        qd.check_role_table(jax.random.split(k, 3))
    with pytest.raises(ValueError, match="one key per role"):
        qd.check_role_table(jnp.zeros((6,), jnp.uint32))
    with pytest.raises(TypeError, match="dtype float32"):
        qd.check_role_table(jnp.zeros((6, 2)))
    with pytest.raises(TypeError, match="got int"):
        qd.check_role_table(0)
    with pytest.raises(ValueError, match="not both"):
        qd.dot_general(X, X, DN, recipe=GRAD_SR, key=k, role_table=qd.role_key_table(k))


@pytest.mark.parametrize("k", STEP_KEYS, ids=["typed", "raw"])
def test_scope_table_gives_each_call_its_own_key(k):
    """A scope given layer names hands every call the key a scope without them derives:
    first calls (and their operand keys), repeated calls ``name#i``, salted (stacked)
    calls and names not listed; only first calls of listed names get a role table."""
    plain, table = Scope(key=k), Scope(key=k, layer_names=["a", "b", "a"])
    assert table.layer_names == ("a", "b")
    salt = jnp.int32(1)
    for call_id, s in [("a", None), ("b", None), ("a#1", None), ("b#2", None), ("a", salt),
                       ("c", None), ("c#1", None), ("c", salt)]:
        np.testing.assert_array_equal(_data(table.layer_key(call_id, s)),
                                      _data(plain.layer_key(call_id, s)), err_msg=call_id)
        got = table.role_table(call_id, s)
        if call_id in ("a", "b") and s is None:
            np.testing.assert_array_equal(
                _data(got), _data(qd.role_key_table(plain.layer_key(call_id))))
        else:
            assert got is None, call_id
        assert plain.role_table(call_id, s) is None
    assert Scope(key=None, layer_names=["a"]).role_table("a") is None


class _Net(nnx.Module):
    """``n`` ordinary layers; with ``extras``, one more called twice (weight sharing) and
    two layers created by nnx.vmap and run by nnx.scan (stacked copies: salted keys)."""

    def __init__(self, n, extras=True):
        rngs = nnx.Rngs(0)
        self.up = nnx.List([nnx.Linear(32, 32, use_bias=False, rngs=rngs) for _ in range(n)])
        self.extras = extras
        if extras:
            self.shared = nnx.Linear(32, 32, use_bias=False, rngs=rngs)

            @nnx.split_rngs(splits=2)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(rngs):
                return nnx.Linear(32, 32, use_bias=False, rngs=rngs)

            self.blocks = make(rngs)

    def __call__(self, x):
        for layer in self.up:
            x = layer(x)
        if not self.extras:
            return x

        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def body(block, x):
            return block(x)

        return body(self.blocks, self.shared(self.shared(x)))


def _loss_fn(n, extras=True, recipe=WGRAD_SR):
    """The loss function and the initial state of a `_Net`."""
    model = _Net(n, extras)
    report = fp4jax.flax.nnx.quantize(model, fp4jax.flax.Policy(default=recipe))
    names = {*(f"up.{i}" for i in range(n)), *(("shared", "blocks") if extras else ())}
    assert set(report.quantized) == names
    loss_fn, params = fp4jax.train.nnx_loss_fn(model, lambda m, x: jnp.sum(m(x) * G))
    return loss_fn, fp4jax.train.init_state(params, optax.sgd(1e-2), 0)


def _updates(loss_fn, *states):
    """The parameters and metrics after one step from each state (one compilation)."""
    step = fp4jax.train.TrainStep(loss_fn, optax.sgd(1e-2))
    out = [step(s, X, step=0) for s in states]
    return [_bits((new.params, metrics)) for new, metrics in out]


def test_train_step_with_key_table_equals_per_call_keys(monkeypatch):
    """A TrainStep whose scope derives its layers' keys on entry (from the parameters'
    names) updates the parameters bit for bit as one whose layers derive their own
    (both gradient GEMMs rounded stochastically); another run key gives others."""
    loss_fn, state = _loss_fn(1, extras=False, recipe=GRAD_SR)
    with_table, other = _updates(loss_fn, state, state._replace(rng=jax.random.key(1)))
    assert with_table != other
    monkeypatch.setattr(fp4jax.train, "layer_names", lambda params: ())
    assert [with_table] == _updates(loss_fn, state)


def _key_probe(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *,
               key=None, role_table=None, **kwargs):
    """Stands in for `fp4jax.dot_general` (cheap to compile): the product scaled by a
    number made of the call's operand keys (its role table, or derived from its key),
    so that the gradients depend on them."""
    del precision, preferred_element_type, kwargs
    table = qd.role_key_table(key) if role_table is None else role_table
    bits = jax.random.key_data(table) >> 16
    scale = 1 + jnp.sum(bits.astype(jnp.float32)) * 2.0**-20
    return jax.lax.dot_general(lhs, rhs, dimension_numbers) * scale


def test_every_layer_call_gets_the_same_keys_with_the_table(monkeypatch):
    """Every call in a TrainStep gets the operand keys it gets without the table, bit
    for bit: ordinary layers, a shared layer's two calls and scanned stacked copies
    (checked through gradients that depend on the keys, `_key_probe`)."""
    monkeypatch.setattr(fp4jax.flax.ops, "fp4_dot_general", _key_probe)
    loss_fn, state = _loss_fn(2)
    assert set(fp4jax.train.layer_names(state.params)) == {"up.0", "up.1", "shared", "blocks"}
    with_table, other = _updates(loss_fn, state, state._replace(rng=jax.random.key(1)))
    assert with_table != other
    monkeypatch.setattr(fp4jax.train, "layer_names", lambda params: ())
    assert [with_table] == _updates(loss_fn, state)


def _fold_ins(jaxpr) -> int:
    """``random_fold_in`` equations of a jaxpr and the jaxprs inside it (a scan body
    counted once: it is one hash in the program)."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "random_fold_in"
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += _fold_ins(inner)
    return n


def test_train_step_hashes_do_not_grow_with_layers(monkeypatch):
    """The traced step's fold_ins (threefry hashes) do not depend on the number of
    layers: the step key, the model key, the layer-key table and the role-key table,
    plus the per-call derivations of a shared layer's second call and of the scan body
    (two each). Without the table every layer adds two."""

    def fold_ins(n):
        loss_fn, state = _loss_fn(n)
        step = fp4jax.train.TrainStep(loss_fn, optax.sgd(1e-2))
        return _fold_ins(step.jitted.trace(state, X, mode="recipe").jaxpr.jaxpr)

    assert fold_ins(1) == fold_ins(4) == 8
    monkeypatch.setattr(fp4jax.train, "layer_names", lambda params: ())
    assert fold_ins(4) - fold_ins(1) == 2 * 3
