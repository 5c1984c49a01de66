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


def _elementwise_block_counts(x, q):
    """The block statistics by their per-element definition, in NumPy: a block saturates
    if any ``|x · enc|`` (float32) reaches 7 and underflows if its scale is 0 while it
    holds a nonzero; 16-blocks along ``q.axis`` (16×16 tiles with the tile axis)."""
    from fp4jax.numerics.scales import (  # noqa: PLC0415
        block_encode_scale_table,
        global_decode_scale,
        lookup_encode_scales,
    )
    s = np.asarray(q.block_scales(jnp.float32))  # per element, padded along q.axis
    enc = np.asarray(lookup_encode_scales(
        block_encode_scale_table(global_decode_scale(q.amax)), jnp.asarray(s)))
    pad = [(0, 0)] * x.ndim
    pad[q.axis] = (0, s.shape[q.axis] - x.shape[q.axis])
    xp = np.pad(x, pad)
    masks = {"clipped": np.abs(xp * enc) >= np.float32(7.0),
             "under": (s == 0) & (xp != 0), "nonzero": xp != 0}
    axes = [q.axis] + ([q.tile_axis] if q.block_2d else [])
    out = {}
    for name, m in masks.items():
        for ax in axes:
            widths = [(0, 0)] * m.ndim
            widths[ax] = (0, -m.shape[ax] % 16)
            m = np.pad(m, widths)
        for ax in sorted(axes, reverse=True):
            m = m.reshape(m.shape[:ax] + (m.shape[ax] // 16, 16) + m.shape[ax + 1:])
            m = m.any(axis=ax + 1)
        out[name] = int(m.sum())
        out["blocks"] = m.size
    return out


@pytest.mark.parametrize("shape, axis, block_2d", [
    ((24, 40), -1, False), ((1, 64, 280), 1, True), ((77, 50), 0, True), ((50, 77), 1, True)])
def test_tensor_stats_block_counts_match_their_elementwise_definition(shape, axis, block_2d):
    """Saturated and underflowing blocks, counted per block from each block's largest |x|
    and its scale under jit, equal the per-element definition, on lengths that are not
    multiples of 16, with blocks 1e-6 to 1e-4 of the amax (subnormal and zero E4M3
    scales)."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    block_axes = [axis % len(shape)] + ([len(shape) - 1 - (axis % len(shape) == len(shape) - 1)]
                                        if block_2d else [])
    decades = rng.uniform(-6, -4, size=tuple(-(-n // 16) if ax in block_axes else n
                                              for ax, n in enumerate(shape)))
    for ax in block_axes:  # one magnitude per block, 1e-6 to 1e-4 of the amax: E4M3
        # scales around the subnormal range, zero at the low end, and blocks on both
        # sides of the |x·enc| = 7 boundary
        decades = decades.repeat(16, axis=ax)[(slice(None),) * ax + (slice(0, shape[ax]),)]
    x *= (10.0 ** decades).astype(np.float32)
    x[..., ::7] = 0.0
    ax = block_axes[0]
    x[(slice(None),) * ax + (slice(16 * ((shape[ax] - 1) // 16), None),)] = 0.0  # zero blocks
    x.flat[1] = 10.0  # the global amax
    q = fp4jax.quantize(x, axis=axis, block_2d=block_2d)
    got = jax.device_get(jax.jit(tensor_stats)(x, q))
    want = _elementwise_block_counts(x, q)
    assert want["clipped"] > 0 and want["under"] > 0  # the case exercises both
    assert got["saturated_blocks"] == np.float32(want["clipped"]) / np.float32(want["blocks"])
    assert got["underflow_blocks"] == (np.float32(want["under"])
                                       / np.float32(max(want["nonzero"], 1)))


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
