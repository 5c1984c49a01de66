"""fp4jax.diagnostics: per-tensor quantization statistics, and their collection per layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4jax
from fp4jax.diagnostics import flatten, fprop_stats, tensor_stats
from fp4jax.flax import step_scope
from fp4jax.train import make_diagnostics_step, nnx_loss_fn


def _blocks():
    """Three 16-blocks under one global amax of 1000:
    0: normal values; 1: |x| = 1e-3, whose E4M3 scale underflows to 0 (all flushed,
    enc = FLT_MAX so the block saturates); 2: |x| = 0.0065, whose scale is the smallest
    subnormal 2^-9 (rounded down from ~1.5·2^-9), so x·enc ≈ 8.9 > 7 saturates."""
    b0 = np.linspace(-1000.0, 1000.0, 16)
    b1 = np.full(16, 1e-3) * np.where(np.arange(16) % 2, 1, -1)
    b2 = np.full(16, 0.0065)
    b2[:8] = 0.0
    return np.concatenate([b0, b1, b2]).astype(np.float32)[None, :]


def test_tensor_stats_flush_saturation_underflow_and_error():
    x = _blocks()
    q = fp4jax.quantize(x)
    s = jax.device_get(tensor_stats(x, q))
    xq = np.asarray(fp4jax.dequantize(q))
    assert s["amax"] == 1000.0
    assert s["saturated_blocks"] == pytest.approx(2 / 3)
    assert s["underflow_blocks"] == pytest.approx(1 / 3)
    flushed = np.sum((x != 0) & (xq == 0)) / np.sum(x != 0)
    assert flushed >= 16 / np.sum(x != 0) and s["flush_to_zero"] == pytest.approx(flushed)
    assert s["rel_error"] == pytest.approx(np.linalg.norm(x - xq) / np.linalg.norm(x), rel=1e-5)


def test_tensor_stats_of_a_well_scaled_tensor_and_2d_tiles():
    """Gaussian data: no saturation or underflow, ~10% error; 2D tiles are counted per tile."""
    x = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    s = jax.device_get(tensor_stats(x, fp4jax.quantize(x)))
    assert s["saturated_blocks"] == 0 and s["underflow_blocks"] == 0
    assert 0.05 < s["rel_error"] < 0.15
    w = x.copy()
    w[:16, :16] *= 1e-6  # one of four 16x16 tiles far below the tensor amax
    s2 = jax.device_get(tensor_stats(w, fp4jax.quantize(w, axis=0, block_2d=True)))
    assert s2["underflow_blocks"] == pytest.approx(0.25)
    assert s2["saturated_blocks"] == pytest.approx(0.25)


def test_fprop_stats_describe_the_operands_dot_general_quantizes():
    """Inputs in 1D blocks along the (flattened) contraction, weights in 16x16 tiles."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 16, 2, 16)).astype(np.float32)
    w = rng.standard_normal((2, 16, 32)).astype(np.float32)
    st = fprop_stats(x, w, (((2, 3), (0, 1)), ((), ())), fp4jax.Recipe.nvfp4())
    a, b = x.reshape(1, 32, 32), w.reshape(1, 32, 32)
    want_x = tensor_stats(a, fp4jax.quantize(a, axis=2))
    want_w = tensor_stats(b, fp4jax.quantize(b, axis=1, block_2d=True))
    assert jax.tree.all(jax.tree.map(lambda u, v: bool(u == v), st, {"x": want_x, "w": want_w}))
    with pytest.raises(ValueError, match="forward GEMM is quantized"):
        fprop_stats(x, w, (((2, 3), (0, 1)), ((), ())), fp4jax.Recipe.bf16())


def test_diagnostics_step_collects_per_layer_stats_only_when_asked():
    """make_diagnostics_step returns stats for every quantized layer; an ordinary scope
    (as in the training step) records nothing, so training pays nothing."""
    model = nnx.Sequential(nnx.Linear(32, 32, rngs=nnx.Rngs(0)), nnx.relu,
                           nnx.Linear(32, 16, rngs=nnx.Rngs(1)))
    fp4jax.flax.nnx.quantize(model, fp4jax.flax.Policy(
        rules=(fp4jax.flax.Rule(pattern=r"layers\.2", recipe=None),)))
    loss_fn, params = nnx_loss_fn(model, lambda m, x: jnp.mean(m(x) ** 2))
    x = jnp.asarray(np.random.default_rng(2).standard_normal((32, 32)), jnp.float32)
    metrics, stats = make_diagnostics_step(loss_fn)(params, x)
    assert set(stats) == {"layers.0"} and set(stats["layers.0"]) == {"x", "w"}
    assert set(flatten(stats)) == {f"layers.0/{o}/{n}" for o in "xw"
                                   for n in fp4jax.diagnostics.STAT_NAMES}
    assert float(stats["layers.0"]["w"]["rel_error"]) > 0.01

    scopes = []

    def plain(p, x):
        with step_scope(jax.random.key(0)) as scope:
            scopes.append(scope)
            return loss_fn(p, x)

    jax.eval_shape(plain, params, x)
    assert scopes[0].stats == {}


def test_tensor_stats_rejects_bad_input():
    x = np.ones((2, 16), np.float32)
    with pytest.raises(TypeError, match="NVFP4Array"):
        tensor_stats(x, x)
    with pytest.raises(ValueError, match="shape"):
        tensor_stats(np.ones((2, 32), np.float32), fp4jax.quantize(x))
    with pytest.raises(ValueError, match="Hadamard"):
        tensor_stats(x, fp4jax.quantize(x, hadamard=True))
