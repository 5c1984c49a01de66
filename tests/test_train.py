"""fp4jax.train: the NVFP4 training step, its precision schedule and its guarantees."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import fp4jax
from fp4jax.train import PrecisionSchedule, TrainState, TrainStep, init_state, nnx_loss_fn

SWITCH, TOTAL = 8, 12


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    teacher = rng.standard_normal((32, 16)).astype(np.float32) / 6
    return {"x": jnp.asarray(x), "y": jnp.asarray(np.tanh(x @ teacher) * 3)}


def make_problem():
    """A 2-layer MLP, its hidden layer converted to NVFP4 by policy (the output layer
    stays high precision, as a model head would), on a fixed regression batch."""
    model = nnx.Sequential(nnx.Linear(32, 64, rngs=nnx.Rngs(0)), nnx.relu,
                           nnx.Linear(64, 16, rngs=nnx.Rngs(1)))
    policy = fp4jax.flax.Policy(rules=(fp4jax.flax.Rule(pattern=r"layers\.2", recipe=None),))
    report = fp4jax.flax.nnx.quantize(model, policy)
    assert report.quantized == ("layers.0",)

    def loss(m, batch):
        err = m(batch["x"]) - batch["y"]
        return jnp.mean(err**2), {"max_err": jnp.max(jnp.abs(err))}

    loss_fn, params = nnx_loss_fn(model, loss)
    return loss_fn, params, _data()


def test_nvfp4_run_learns_switches_precision_once_and_is_deterministic():
    """One NVFP4 run of TOTAL steps whose forward GEMMs switch to BF16 at step SWITCH
    (a single test, so that its two compilations are paid once even under xdist):

    * before the switch every GEMM is NVFP4 and the loss falls steadily;
    * the BF16-forward tail costs exactly one extra compilation, at the switch;
    * replaying a step from the same state reproduces it bit for bit (SR keys
      included), another run key draws other SR bits, and neither recompiles.
    """
    loss_fn, params, batch = make_problem()
    tx = optax.adam(3e-2)
    step = TrainStep(loss_fn, tx, has_aux=True, max_grad_norm=10.0,
                     schedule=PrecisionSchedule(switch_step=SWITCH))
    state0 = state = init_state(params, tx, 0)
    losses, modes, compiled = [], [], []
    for i in range(TOTAL):
        state, m = step(state, batch)  # step= omitted: read from state.step
        losses.append(float(m["loss"]))
        modes.append(step.mode(i))
        compiled.append(step.num_compiled())

    assert modes[:SWITCH] == ["recipe"] * SWITCH
    assert losses[SWITCH - 1] < 0.6 * losses[0], losses
    assert np.all(np.isfinite(losses)) and set(m) == {"loss", "grad_norm", "max_err"}

    assert modes[SWITCH:] == ["bf16_forward"] * (TOTAL - SWITCH)
    assert compiled == [1] * SWITCH + [2] * (TOTAL - SWITCH)
    assert step.traces == 2 and int(state.step) == TOTAL

    a, _ = step(state0, batch, step=0)
    b, _ = step(state0, batch, step=0)
    c, _ = step(init_state(params, tx, 1), batch, step=0)  # another run key
    leaves = lambda s: [np.asarray(x) for x in jax.tree.leaves(s.params)]  # noqa: E731
    assert all(np.array_equal(x, y) for x, y in zip(leaves(a), leaves(b)))
    assert not all(np.array_equal(x, y) for x, y in zip(leaves(a), leaves(c)))
    assert step.num_compiled() == 2


def test_gradient_clipping_bounds_the_update():
    """With SGD(lr=1) and max_grad_norm=c, the parameters move by exactly norm c."""
    dg = fp4jax.flax.DotGeneral(name="w", recipe=fp4jax.Recipe.bf16())
    loss_fn = lambda p, b: jnp.sum(dg(b, p["w"], (((1,), (0,)), ((), ()))) ** 2)  # noqa: E731
    x = jnp.ones((4, 8))
    state = init_state({"w": jnp.ones((8, 2))}, optax.sgd(1.0), 0)
    new, m = TrainStep(loss_fn, optax.sgd(1.0), max_grad_norm=0.5)(state, x, step=0)
    assert float(m["grad_norm"]) > 0.5
    np.testing.assert_allclose(float(optax.tree.norm(new.params["w"] - state.params["w"])), 0.5,
                               rtol=1e-5)


def test_init_and_step_validate_their_inputs():
    with pytest.raises(TypeError, match="GradientTransformation"):
        init_state({"w": jnp.ones(2)}, "adam", 0)
    with pytest.raises(TypeError, match="int seed or a jax.random key"):
        init_state({"w": jnp.ones(2)}, optax.sgd(1.0), "seed")
    with pytest.raises(ValueError, match="max_grad_norm"):
        TrainStep(lambda p, b: 0.0, optax.sgd(1.0), max_grad_norm=0.0)
    with pytest.raises(ValueError, match="mode must be one of"):
        PrecisionSchedule(switch_step=3, after="fp8")
    with pytest.raises(ValueError, match="fraction"):
        PrecisionSchedule.bf16_forward_tail(total_steps=10, fraction=1.5)
    with pytest.raises(TypeError, match="TrainState"):
        TrainStep(lambda p, b: 0.0, optax.sgd(1.0))(({}, {}), None, step=0)
    s = init_state({"w": jnp.ones(2, jnp.bfloat16), "n": jnp.arange(2)}, optax.sgd(1.0), 0)
    assert isinstance(s, TrainState) and s.params["w"].dtype == jnp.float32
    assert s.params["n"].dtype == jnp.int32
    assert PrecisionSchedule.bf16_forward_tail(total_steps=10, fraction=0.0).switch_step is None


class _Block(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(32, 32, rngs=rngs)
        self.bn = nnx.BatchNorm(32, rngs=rngs)
        self.drop = nnx.Dropout(0.25, rngs=rngs)

    def __call__(self, x):
        return x + self.drop(nnx.relu(self.bn(self.fc(x))))


class _StatefulNet(nnx.Module):
    """The shape of Flax's nnx examples: blocks created by nnx.vmap and run by nnx.scan,
    with BatchNorm in training mode and Dropout(rngs=...)."""

    def __init__(self, rngs):
        @nnx.split_rngs(splits=2)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return _Block(rngs)

        self.blocks = make(rngs)
        self.head = nnx.Linear(32, 16, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def body(block, x):
            return block(x)

        return self.head(body(self.blocks, x))


def _bits(tree):
    leaves = [jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
              for x in jax.tree.leaves(tree)]
    return [np.asarray(x).reshape(-1).view(np.uint8).tobytes() for x in leaves]


def test_stateful_nnx_model_trains_and_resumes_bitwise(tmp_path):
    """BatchNorm statistics and dropout RNG travel in TrainState.model_state: the step
    updates the statistics, draws a fresh dropout mask each step from the step key (the
    same one when a step is repeated), and 2N steps straight equal N steps, a checkpoint
    restore and N more steps, bit for bit."""
    from fp4jax.checkpoint import Checkpointer  # orbax only here

    model = _StatefulNet(nnx.Rngs(params=0, dropout=1))
    # One stochastically rounded GEMM (wgrad) is enough to make resumption depend on
    # the SR keys, and compiles in a fraction of the full recipe's time.
    wgrad_sr = fp4jax.Recipe.bf16().replace(
        wgrad_lhs=fp4jax.Operand(), wgrad_grad=fp4jax.Operand(rounding="stochastic"))
    report = fp4jax.flax.nnx.quantize(
        model, fp4jax.flax.paper_policy(num_blocks=2, recipe=wgrad_sr))
    assert report.quantized == ("blocks.fc",)

    def loss(m, batch):
        return jnp.mean((m(batch["x"]) - batch["y"]) ** 2)

    loss_fn, params, model_state = nnx_loss_fn(model, loss, has_state=True)
    tx = optax.adam(1e-2)
    step = TrainStep(loss_fn, tx, has_state=True)
    batch = _data()
    s0 = init_state(params, tx, 0, model_state=model_state)

    a, ma = step(s0, batch, step=0)
    b, mb = step(s0, batch, step=0)
    _, mc = step(s0._replace(step=s0.step + 1), batch, step=1)
    assert _bits(a) == _bits(b) and _bits(ma) == _bits(mb)
    assert float(ma["loss"]) != float(mc["loss"])  # forward GEMMs round to nearest: dropout
    assert _bits(a.model_state) != _bits(s0.model_state)  # batch statistics moved

    n = 2
    straight = s0
    for i in range(2 * n):
        straight, _ = step(straight, batch, step=i)
    half = s0
    for i in range(n):
        half, _ = step(half, batch, step=i)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(half)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        resumed = ckpt.restore(init_state(params, tx, 9, model_state=model_state))
    for i in range(n, 2 * n):
        resumed, _ = step(resumed, batch, step=i)
    assert _bits(resumed) == _bits(straight)
    assert step.num_compiled() == 1  # the restored state reuses the compiled step

    nnx.update(model, straight.params, straight.model_state)  # back into the model
    model.eval()
    with fp4jax.flax.step_scope(jax.random.key(0)):
        assert np.isfinite(np.asarray(model(batch["x"]))).all()


def test_keys_and_step_numbers_are_checked():
    """Raw (jax.random.PRNGKey) and typed keys are accepted alike; a bad key or a host
    step number that disagrees with state.step is a clear error."""
    with pytest.raises(TypeError, match="step_key must be a jax.random key"):
        fp4jax.layer_key(0, "a")
    raw, typed = jax.random.PRNGKey(3), jax.random.key(3)
    assert np.array_equal(jax.random.key_data(fp4jax.layer_key(raw, "a")),
                          jax.random.key_data(fp4jax.layer_key(typed, "a")))
    tx = optax.sgd(1.0)
    s_raw = init_state({"w": jnp.ones(2)}, tx, raw)
    s = init_state({"w": jnp.ones(2)}, tx, typed)
    assert _bits(s_raw.rng) == _bits(s.rng)
    model = nnx.Sequential(nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.Dropout(0.5, rngs=nnx.Rngs(1)))
    f, p, ms = nnx_loss_fn(model, lambda m, x: jnp.sum(m(x)), has_state=True)
    assert float(f(p, ms, jnp.ones((2, 4)), raw)[0]) == float(f(p, ms, jnp.ones((2, 4)), typed)[0])

    step = TrainStep(lambda p, b: jnp.sum(p["w"] * b), tx)
    with pytest.raises(ValueError, match=r"step=5 but state.step is 0"):
        step(s, 1.0, step=5)
    with pytest.raises(TypeError, match="step must be an int"):
        step(s, 1.0, step="0")
    s1, _ = step(s, 1.0, step=0)
    s2, _ = step(s1, 1.0, step=1)
    with pytest.raises(ValueError, match=r"step=1 but state.step is 2"):
        step(s2, 1.0, step=1)
    with pytest.raises(ValueError, match="has_state=True"):
        TrainStep(lambda p, b: 0.0, tx)(init_state({"w": jnp.ones(2)}, tx, 0,
                                                   model_state={"n": jnp.zeros(2)}), 1.0, step=0)


def test_step_number_without_step_arg_is_a_host_counter_not_a_device_read(monkeypatch):
    """Chained calls without ``step=`` never read ``state.step`` back to the host (that
    would wait for the previous step): the step keeps the host count of the state it
    returned, and the schedule still switches precision at the right step."""
    tx = optax.sgd(0.1)
    train_step = TrainStep(lambda p, b: jnp.sum(p["w"] * b), tx,
                           schedule=PrecisionSchedule(switch_step=2))
    batch = jnp.ones(3)
    state, _ = train_step(init_state({"w": jnp.ones(3)}, tx, 0), batch)  # fresh: read once

    def read_back(*args, **kwargs):
        raise AssertionError("state.step was read back to the host")

    array_type = type(state.step)
    for name in ("__int__", "__index__", "__float__", "__bool__", "__array__", "item", "tolist"):
        monkeypatch.setattr(array_type, name, read_back)
    traces = [train_step.traces]
    for _ in range(3):
        state, _ = train_step(state, batch)
        traces.append(train_step.traces)
    monkeypatch.undo()
    assert int(state.step) == 4
    assert traces == [1, 1, 2, 2]  # "bf16_forward" compiled when step 2 came, not before
    with pytest.raises(ValueError, match="state.step is 4"):
        train_step(state, batch, step=3)  # a wrong host step is still caught, from the copy


def test_vmapped_step_trains_each_stacked_run_as_the_single_run_step_does():
    """Two runs (own parameters, run keys and data) stacked through `TrainStep.vmapped`
    end where each run's own steps end (an NVFP4 layer with SR gradients; up to the
    batched GEMM's summation order); the runs stay distinct; a mesh step refuses."""
    dg = fp4jax.flax.DotGeneral(name="w")

    def loss_fn(params, batch):
        y = dg(batch["x"], params["w"], (((1,), (0,)), ((), ())))
        return jnp.mean((y - batch["y"]) ** 2)

    opt = optax.adam(1e-2)
    step = TrainStep(loss_fn, opt)
    runs = [init_state({"w": jax.random.normal(jax.random.key(s), (32, 16))}, opt, s)
            for s in (0, 1)]
    data = [{"x": jax.random.normal(jax.random.key(10 + s), (16, 32)),
             "y": jnp.zeros((16, 16))} for s in (0, 1)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *runs)
    batches = jax.tree.map(lambda *x: jnp.stack(x), *data)
    for _ in range(3):
        stacked, metrics = step.vmapped()(stacked, batches, mode="recipe")
    for s in (0, 1):
        state = runs[s]
        for i in range(3):
            state, m = step(state, data[s], step=i)
        np.testing.assert_allclose(stacked.params["w"][s], state.params["w"], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(metrics["loss"][s], m["loss"], rtol=1e-5)
    assert not np.allclose(stacked.params["w"][0], stacked.params["w"][1])
    mesh = fp4jax.parallel.MeshRules(mesh=jax.make_mesh((1, 1, 1), ("data", "fsdp", "model")))
    with pytest.raises(ValueError, match="mesh"):
        TrainStep(loss_fn, opt, mesh_rules=mesh).vmapped()
