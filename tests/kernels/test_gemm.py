"""Tests of the Mosaic GPU NVFP4 GEMM (`pallas_kernels.gemm`) against the reference GEMM
`fp4jax.reference.gemm.matmul`, and of its `supports`.

CPU/CI: the kernel runs in Mosaic GPU interpret mode on small shapes for the fprop,
dgrad and wgrad layouts, split-K with a padded skinny M, batch dims and both ways of
splitting the CTA between the consumer warpgroups. Interpret mode simulates the three
warpgroups as threads that block inside XLA host callbacks; with XLA's default CPU
thread pool (one thread per core) that deadlocks on a 2-core machine, so these cases
run in one subprocess with more host devices (a larger pool) and report back as JSON.
GPU (``-m gpu``; skipped without a GPU): the compiled kernel at several shapes
(including non-power-of-two multiples of 128), outputs poisoned first, all elements
finite and matching; bitwise equality when every float32 sum is exact.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from fp4jax.reference.gemm import matmul as ref_matmul
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm
from pallas_kernels.gemm_config import LARGE_CONFIG, MatmulDimension, TuningConfig
from tests.kernels.nvfp4_bits import abstract_layout_operands as _abstract_operands
from tests.kernels.nvfp4_bits import (
    compare_outputs,
    interpret_worker_results,
    interpreted_gemm_vs_reference,
    nan_poison_allocator,
    worker_main,
)
from tests.kernels.nvfp4_bits import exact_grid_data as _exact
from tests.kernels.nvfp4_bits import layout_operands as _layout_operands
from tests.kernels.nvfp4_bits import normal_data as _normal

_ON_GPU = jax.devices()[0].platform == "gpu"


# ----------------------------------------------------------------------------------------
# CPU / CI: interpret mode, in a subprocess.
# ----------------------------------------------------------------------------------------

def _small(**kw):
    return TuningConfig(tile_m=64, tile_n=64, tile_k=64, **{"num_sms": 1, **kw})


# name -> (layout, (m, n, k), exact inputs, preferred_element_type, config, batch).
# Small but structural: several output tiles per persistent CTA, several K steps, both
# warpgroup splits, split-K with a padded M, batch dims.
INTERPRET_CASES = {
    "fprop_batched": ("fprop", (64, 128, 128), False, "float32", _small(), 2),
    "dgrad_wg_m": ("dgrad", (128, 64, 128), False, "float32",
                   _small(wg_dimension=MatmulDimension.M), None),
    "wgrad_from_mT": ("wgrad", (64, 128, 128), True, "float32", _small(), None),
    "skinny_splitk_bf16": ("fprop", (16, 128, 128), False, "bfloat16",
                           _small(k_splits=2, num_sms=2), None),
}


def _run_case(name):
    layout, (m, n, k), exact, dtype, cfg, batch = INTERPRET_CASES[name]
    if batch:  # fprop with leading batch dims
        data = _exact if exact else _normal
        x, w = data((batch, m, k), 0), data((batch, k, n), 1)
        lhs, rhs, kw = quantize(x), quantize(w, axis=1, block_2d=True), {}
    else:
        lhs, rhs, kw = _layout_operands(layout, m, n, k, exact=exact)
    return interpreted_gemm_vs_reference(lhs, rhs, dtype, cfg, **kw)


@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpret_matches_reference(name):
    r = interpret_worker_results(__file__)[name]
    _, _, exact, dtype, _, _ = INTERPRET_CASES[name]
    assert r["shape_ok"] and r["finite"], r
    if exact:
        assert r["bitwise"], r
    elif dtype == "float32":
        assert r["rel"] <= 1e-6, r
    else:  # a float32 sum-order difference may flip one bf16 rounding
        assert r["max_rel_elem"] <= 2.0**-7, r


# --- supports(): the predicate and the wrapper agree. ---------------------------------

@pytest.mark.parametrize("layout, mnk, supported", [
    ("fprop", (256, 512, 512), True),
    ("dgrad", (256, 512, 512), True),
    ("wgrad", (256, 512, 512), True),
    ("fprop", (16, 1024, 2048), True),  # skinny: M zero-padded to one tile
    ("fprop", (128, 200, 128), False),  # N not a multiple of the tile
    ("fprop", (128, 256, 80), False),  # K not a multiple of tile_k
    ("fprop", (200, 256, 128), False),  # M > tile but not a multiple
    ("wgrad", (96, 256, 128), False),  # padding M needs lhs_from_mT=False
])
def test_supports_agrees_with_the_wrapper(layout, mnk, supported):
    """None for operands the kernel takes (the wrapper traces), else a one-line reason
    naming the shapes, which is exactly the wrapper's ValueError."""
    lhs, rhs, kw = _abstract_operands(layout, *mnk)
    reason = gemm.supports(lhs, rhs, **kw)
    run = functools.partial(gemm.matmul, **kw)
    if supported:
        assert reason is None
        assert jax.eval_shape(run, lhs, rhs).shape == mnk[:2]
    else:
        assert isinstance(reason, str) and "\n" not in reason and str(lhs.shape) in reason
        with pytest.raises(ValueError) as err:
            jax.eval_shape(run, lhs, rhs)
        assert str(err.value) == reason


def test_supports_lhs_blocked_along_m():
    x = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    q_m, q_k = jax.eval_shape(
        lambda a: (quantize(a, axis=0, block_2d=True), quantize(a, axis=0)), x)
    reason = gemm.supports(q_m, q_k)
    assert "blocked along M" in reason
    with pytest.raises(ValueError) as err:
        jax.eval_shape(gemm.matmul, q_m, q_k)
    assert str(err.value) == reason


@pytest.mark.parametrize(
    "layout, mnk, cfg, match",
    [
        ("fprop", (128, 100 * 2, 128), None, "N=200"),  # N not a multiple of the tile
        ("fprop", (128, 256, 80), None, "K=80"),  # K not a multiple of tile_k
        ("fprop", (200, 256, 128), None, "M=200"),  # M > tile but not a multiple
        ("wgrad", (96, 256, 128), None, "M=96"),  # padding M needs lhs_from_mT=False
        ("fprop", (128, 256, 128), TuningConfig(k_splits=4), "tile_k·k_splits"),
    ],
)
def test_shapes_it_cannot_take(layout, mnk, cfg, match):
    lhs, rhs, kw = _abstract_operands(layout, *mnk)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(functools.partial(gemm.matmul, config=cfg, **kw), lhs, rhs)


def test_unsupported_layouts_and_dtypes():
    x = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    def quant(x, **kw):
        return jax.eval_shape(functools.partial(quantize, **kw), x)
    q_m = quant(x, axis=0, block_2d=True)  # lhs blocked along M
    q_k = quant(x, axis=0)
    with pytest.raises(ValueError, match="blocked along M"):
        jax.eval_shape(gemm.matmul, q_m, q_k)
    with pytest.raises(ValueError, match="preferred_element_type"):
        jax.eval_shape(functools.partial(gemm.matmul, preferred_element_type=jnp.int32),
                       quant(x), q_k)
    bad_k = quant(jax.ShapeDtypeStruct((128, 64), jnp.float32))
    with pytest.raises(ValueError, match="contraction sizes differ"):  # check_gemm_operands
        jax.eval_shape(gemm.matmul, bad_k, q_k)
    with pytest.raises(ValueError, match="contraction sizes differ"):  # supports validates too
        gemm.supports(bad_k, q_k)


def test_lowers_for_cuda():
    """The Mosaic GPU lowering (layouts, transforms, SMEM budget) runs on a CPU host."""
    for layout, cfg in (("fprop", None), ("dgrad", None), ("wgrad", None),
                        ("fprop", TuningConfig(decode="normal")),
                        ("dgrad", TuningConfig(decode="normal", tile_n=64))):
        lhs, rhs, kw = _abstract_operands(layout, 512, 512, 512)
        f = jax.jit(functools.partial(gemm.matmul, config=cfg, **kw))
        f.trace(lhs, rhs).lower(lowering_platforms=("cuda",))
    lhs, rhs, _ = _abstract_operands("fprop", 16, 1024, 2048)
    jax.jit(gemm.matmul).trace(lhs, rhs).lower(lowering_platforms=("cuda",))


# ----------------------------------------------------------------------------------------
# GPU: the compiled kernel.
# ----------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not _ON_GPU, reason="needs a GPU")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fprop", "dgrad", "wgrad", "wgrad_plain"])
@pytest.mark.parametrize("mnk", [(384, 640, 1152), (256, 512, 256), (1024, 1024, 2048)])
def test_gpu_matches_reference(layout, mnk):
    lhs, rhs, kw = _layout_operands(layout, *mnk, seed=sum(mnk))
    want = jax.jit(ref_matmul)(lhs, rhs)
    nan_poison_allocator(4 * mnk[0] * mnk[1])
    got = gemm.matmul(lhs, rhs, **kw)
    r = compare_outputs(got, want)
    assert r["shape_ok"] and r["finite"] and r["rel"] <= 1e-6, r


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("decode", ["subnormal", "normal"])
@pytest.mark.parametrize("layout", ["fprop", "dgrad", "wgrad"])
def test_gpu_bitwise_when_sums_are_exact(layout, decode):
    """The serial mainloop with either decode equals the XLA path bit for bit on exact-sum
    data (the pipelined mainloop, the default here, has its own test file)."""
    lhs, rhs, kw = _layout_operands(layout, 256, 512, 512, exact=True)
    want = jax.jit(ref_matmul)(lhs, rhs)
    nan_poison_allocator(4 * 256 * 512)
    cfg = dataclasses.replace(LARGE_CONFIG, decode=decode)
    r = compare_outputs(gemm.matmul(lhs, rhs, config=cfg, **kw), want)
    assert r["bitwise"], r


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    "mnk, dtype, cfg",
    [
        ((16, 1024, 2048), jnp.float32, None),  # skinny default: padded M, split K
        ((1, 512, 1024), jnp.bfloat16, None),
        ((64, 768, 640), jnp.float16, None),
        ((512, 512, 512), jnp.bfloat16, None),
        ((512, 512, 1024), jnp.float32, TuningConfig(auto_barriers=True)),
        ((512, 512, 1024), jnp.float32,
         TuningConfig(wg_dimension=MatmulDimension.M, max_concurrent_steps=6)),
    ],
)
def test_gpu_configs_and_dtypes(mnk, dtype, cfg):
    lhs, rhs, _ = _layout_operands("fprop", *mnk, seed=1)
    want = jax.jit(functools.partial(ref_matmul, preferred_element_type=dtype))(lhs, rhs)
    nan_poison_allocator(4 * mnk[0] * mnk[1])
    got = gemm.matmul(lhs, rhs, preferred_element_type=dtype, config=cfg)
    r = compare_outputs(got, want)
    assert r["shape_ok"] and r["finite"], r
    if dtype == jnp.float32:
        assert r["rel"] <= 1e-6, r
    else:
        assert r["max_rel_elem"] <= 2.0**-7, r


@gpu
@pytest.mark.gpu
def test_gpu_batched():
    x, w = _normal((3, 256, 512), 0), _normal((3, 512, 256), 1)
    lhs, rhs = quantize(x), quantize(w, axis=1, block_2d=True)
    r = compare_outputs(gemm.matmul(lhs, rhs), jax.jit(ref_matmul)(lhs, rhs))
    assert r["shape_ok"] and r["finite"] and r["rel"] <= 1e-6, r


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(384, 600, 1152), (384, 640, 1000), (300, 640, 1152)])
def test_gpu_shapes_it_cannot_take(mnk):
    lhs, rhs, kw = _layout_operands("fprop", *mnk)
    with pytest.raises(ValueError, match="must be a multiple"):
        gemm.matmul(lhs, rhs, **kw)


if __name__ == "__main__":
    worker_main(INTERPRET_CASES, _run_case)


def test_sweep_configs_are_taken_by_the_kernel():
    """Every tuning config the benchmark sweep (`gemm._sweep_configs`) times is one the
    kernel takes for its shape (a config it rejects would only fail on the device)."""
    for (m, n, k), cfgs in gemm._sweep_configs().items():
        lhs, rhs, _ = _abstract_operands("fprop", m, n, k)
        for cfg in cfgs:
            out = jax.eval_shape(functools.partial(gemm.matmul, config=cfg), lhs, rhs)
            assert out.shape == (m, n), cfg
