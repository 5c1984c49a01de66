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
    c, _ = step(state0._replace(rng=jax.random.key(1)), batch, step=0)
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
    with pytest.raises(TypeError, match="int seed or a typed"):
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
