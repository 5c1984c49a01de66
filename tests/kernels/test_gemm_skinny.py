"""Tests of the skinny NVFP4 GEMM (`pallas_kernels.gemm_skinny`, M <= 64, fprop layout)
against the reference GEMM `fp4jax.reference.gemm.matmul`.

CPU/CI:
* the register-level parts the CPU cannot run, checked against their definitions: the
  bit recipes of the weight decode and of the scale factor (numpy mirrors of the
  Mosaic GPU code, every byte value), the row permutation, and the register renamings
  for every thread of a warpgroup (derived from Mosaic's layout definitions, whose
  simulator is first checked on Mosaic's documented WGMMA layouts), plus the
  bank-conflict-free pattern of the code loads;
* the Mosaic GPU lowering for CUDA (layouts, transforms, TMA shapes) on this host;
* the kernel in Mosaic GPU interpret mode (pipeline, split-K, padded and odd M, every
  output dtype) in one subprocess with more host devices (see tests/kernels/test_gemm.py);
* `supports` / ValueErrors for the shapes the skinny kernel cannot take.
GPU (``-m gpu``; skipped without a GPU): the compiled kernel at the decode shapes
16×8192×8192 and 64×8192×8192, odd M, bitwise on exact-sum data.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.mosaic import gpu as mgpu

from fp4jax.reference.gemm import matmul as ref_matmul
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm, gemm_skinny
from pallas_kernels import gemm_skinny_decode as sd
from pallas_kernels.gemm_config import SkinnyConfig, default_config

_ON_GPU = jax.devices()[0].platform == "gpu"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def _bf16_value(bits):
    """Exact value (float64, subnormals kept) of uint16 BF16 bit patterns."""
    return (np.asarray(bits, np.uint32) << 16).view(np.float32).astype(np.float64)


def _prmt(a, b, sel):
    """PTX ``prmt.b32`` (default mode) on uint64 arrays holding 32-bit values."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        c = (sel >> (4 * i)) & 0xF
        byte = src[c & 7]
        if c & 8:  # replicate the byte's sign bit
            byte = np.where(byte & 0x80, 0xFF, 0).astype(a.dtype)
        out |= byte << (8 * i)
    return out


def test_weight_decode_recipe():
    """`_decode_word` (numpy mirror): byte e of a word -> bf16x2 (low, high code) of
    e2m1 · 2**-126, for every byte value in every position."""
    rng = np.random.default_rng(0)
    m32 = np.uint64(0xFFFFFFFF)
    for e in range(4):
        other = rng.integers(0, 2**32, 256, dtype=np.uint64) & ~np.uint64(0xFF << (8 * e))
        b = np.arange(256, dtype=np.uint64)
        word = other | (b << np.uint64(8 * e))
        u = word & sd.NIBBLES
        v = (word >> np.uint64(4)) & sd.NIBBLES
        y = _prmt(u, v, sd.PAIR_SELECTORS[e])
        bits = ((y * sd.SPREAD_MUL) & m32) & sd.BF16_MASK
        np.testing.assert_array_equal(_bf16_value(bits & 0xFFFF), _E2M1[b & 15] * 2.0**-126)
        np.testing.assert_array_equal(_bf16_value(bits >> 16), _E2M1[b >> 4] * 2.0**-126)


def test_scale_factor_recipe():
    """`_scale_factor` (numpy mirror): the float16 pattern ``(b & 0x7F) << 7`` is the
    E4M3 scale times 2**-8 for every finite scale (subnormals included), so the factor
    is s · 2**118, and e2m1 · 2**-126 times it is e2m1 · s · 2**-8, exact in BF16."""
    b = np.arange(0x7F, dtype=np.uint16)  # every finite non-negative E4M3 scale
    s = b.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    half = ((b & 0x7F) << 7).view(np.float16).astype(np.float64)
    np.testing.assert_array_equal(half, s * 2.0**-8)
    factor = (half.astype(np.float32) * np.float32(2.0**126)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(factor.astype(np.float64), s * 2.0**118)
    prod = (_E2M1[:, None] * 2.0**-126) * factor.astype(np.float64)[None, :]
    np.testing.assert_array_equal(prod.astype(ml_dtypes.bfloat16).astype(np.float64),
                                  _E2M1[:, None] * s[None, :] * 2.0**-8)
    assert sd.ACC_UNSCALE == 2.0**8


def test_row_permutation():
    rows = [sd.row_to_n(r) for r in range(sd.WG_ROWS)]
    assert sorted(rows) == list(range(sd.WG_ROWS))
    assert all(sd.n_to_row(sd.row_to_n(r)) == r for r in range(sd.WG_ROWS))


def test_thread_view_matches_documented_layouts():
    """The layout simulator reproduces Mosaic's documented WGMMA assignments (PTX
    ``wgmma-64n16-d``), including replicated lane and warp dims."""
    wgmma = sd.thread_view(mgpu.WGMMA_LAYOUT, (128, 64), 0, 5)
    zero = (0,) * 9
    assert [wgmma[(zero, v)] for v in (0, 1)] == [(1, 2), (1, 3)]
    assert sd.thread_view(mgpu.WGMMA_LAYOUT, (128, 64), 1, 0)[(zero, 0)] == (16, 0)
    for warp, lane in ((0, 0), (2, 13), (3, 31)):
        rows = set(sd.thread_view(mgpu.WGMMA_ROW_LAYOUT, (64,), warp, lane).values())
        assert rows == {(16 * warp + lane // 4,), (16 * warp + lane // 4 + 8,)}
        cols = set(sd.thread_view(mgpu.WGMMA_COL_LAYOUT, (16,), warp, lane).values())
        assert cols == {(2 * (lane % 4) + d,) for d in (0, 1, 8, 9)}


@pytest.mark.parametrize("tile_k", [128, 256])
def test_decode_renaming_is_the_same_in_every_thread(tile_k):
    """Every thread's A registers come from the same (code register, byte, scale
    register) of its own loads, so the kernel's one renaming (thread 0's) is right for
    all 128 threads; each A register pair is one byte (two K elements) of one column."""
    plan = sd.decode_plan(tile_k)
    assert len(plan) == sd.WG_ROWS * tile_k // 2 // 128
    for warp in range(4):
        for lane in range(32):
            assert sd.decode_plan(tile_k, warp, lane) == plan, (warp, lane)


@pytest.mark.parametrize("m", [8, 16, 40, 64])
def test_store_renaming_is_the_same_in_every_thread(m):
    plan = sd.store_plan(m)
    for warp in range(4):
        for lane in range(32):
            assert sd.store_plan(m, warp, lane) == plan, (warp, lane)


def test_code_loads_are_bank_conflict_free():
    """Under the 128-byte swizzle of the (tile_k/2, 128) code tile, the 32 lanes of a
    warp read 32 different banks with every 32-bit load."""
    layout = sd.MGPU_LAYOUTS["codes"]
    for warp in range(4):
        views = [sd.thread_view(layout, (64, sd.WG_ROWS), warp, lane) for lane in range(32)]
        for reg in {r for r, _ in views[0]}:
            banks = set()
            for v in views:
                j, n = v[(reg, 0)]
                chunk = (n // 16) ^ (j % 8)  # the 16-byte chunk after the swizzle
                banks.add((4 * chunk + (n % 16) // 4) % 32)
            assert len(banks) == 32, (warp, reg)


def _operands(m, n, k, *, exact=False, seed=0):
    """(X rowwise, W 16×16 tiles) of an fprop GEMM; ``exact``: E2M1-grid values with a
    ±6 in every 16-block (scales 448, every float32 sum exact for K <= 512)."""
    if exact:
        grid = jnp.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], jnp.float32)

        def data(shape, s):
            k1, k2 = jax.random.split(jax.random.key(s))
            x = grid[jax.random.randint(k1, shape, 0, 8)] * jnp.where(
                jax.random.bernoulli(k2, 0.5, shape), -1.0, 1.0)
            return x.at[:, ::16].set(6.0).at[::16, :].set(-6.0)
    else:
        def data(shape, s):
            return jax.random.normal(jax.random.key(s), shape, jnp.float32)
    return quantize(data((m, k), seed)), quantize(data((k, n), seed + 1), axis=0, block_2d=True)


def _compare(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return {
        "shape_ok": got.shape == want.shape,
        "finite": bool(np.isfinite(got).all()),
        "rel": float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)),
        "max_rel_elem": float(np.max(np.abs(got - want) / (np.abs(want) + 1e-3))),
        "bitwise": bool(np.array_equal(got.view(np.uint32), want.view(np.uint32))),
    }


def _check(r, exact, dtype):
    assert r["shape_ok"] and r["finite"], r
    if exact:
        assert r["bitwise"], r
    elif dtype == "float32":
        assert r["rel"] <= 1e-6, r
    else:  # a float32 sum-order difference may flip one rounding
        assert r["max_rel_elem"] <= 2.0**-7, r


# ----------------------------------------------------------------------------------------
# CPU / CI: interpret mode, in a subprocess.
# ----------------------------------------------------------------------------------------

# name -> ((m, n, k), exact inputs, preferred_element_type, config): several column
# tiles and K splits per persistent CTA, several K steps, M padded to a multiple of 8.
INTERPRET_CASES = {
    "m16_splitk_f32": ((16, 512, 512), False, "float32",
                       SkinnyConfig(k_splits=2, num_sms=2, max_concurrent_steps=2)),
    "m48_exact": ((48, 256, 512), True, "float32", SkinnyConfig(k_splits=2, num_sms=2)),
    "m1_bf16": ((1, 256, 256), False, "bfloat16", SkinnyConfig(k_splits=1, num_sms=2)),
    "m7_f16_splitk": ((7, 256, 256), False, "float16", SkinnyConfig(k_splits=2, num_sms=2)),
    "m33_exact_bf16": ((33, 256, 256), True, "bfloat16", SkinnyConfig(k_splits=1, num_sms=1)),
}


def _run_case(name):
    (m, n, k), exact, dtype, cfg = INTERPRET_CASES[name]
    lhs, rhs = _operands(m, n, k, exact=exact)
    got = gemm.matmul(lhs, rhs, preferred_element_type=dtype, config=cfg, interpret=True)
    return _compare(got, ref_matmul(lhs, rhs, preferred_element_type=dtype))


@functools.cache
def _interpret_results():
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path,
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
               + " --xla_force_host_platform_device_count=8")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--interpret-worker"],
        cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpret_matches_reference(name):
    _, exact, dtype, _ = INTERPRET_CASES[name]
    _check(_interpret_results()[name], exact, dtype)


def _abstract(m, n, k):
    return jax.eval_shape(lambda: _operands(m, n, k))


def test_lowers_for_cuda():
    """The Mosaic GPU lowering (layouts, register renamings, transforms, TMA boxes)
    runs on a CPU host for the decode shapes, padded M and every output dtype."""
    for (m, n, k), dtype, cfg in [
        ((16, 8192, 8192), jnp.bfloat16, None),
        ((64, 8192, 8192), jnp.float32, None),
        ((1, 512, 1024), jnp.float16, SkinnyConfig(k_splits=1, max_concurrent_steps=2)),
        ((40, 256, 1024), jnp.float32, SkinnyConfig(tile_k=256, k_splits=2)),
    ]:
        lhs, rhs = _abstract(m, n, k)
        f = jax.jit(functools.partial(gemm.matmul, config=cfg, preferred_element_type=dtype))
        f.trace(lhs, rhs).lower(lowering_platforms=("cuda",))


def test_default_config_takes_the_skinny_kernel():
    lhs, rhs = _abstract(16, 8192, 8192)
    cfg = default_config(16, 8192, 8192)
    assert isinstance(cfg, SkinnyConfig) and gemm_skinny.unsupported(lhs, rhs, cfg) is None
    assert cfg.k_splits * 8192 // cfg.cta_tile_n <= 132
    assert not isinstance(default_config(16, 8192, 8192, skinny=False), SkinnyConfig)
    assert not isinstance(default_config(128, 8192, 8192), SkinnyConfig)
    assert not isinstance(default_config(16, 8192 + 128, 8192), SkinnyConfig)  # N % 256


def test_other_layouts_keep_the_general_kernel():
    """dgrad (W.mT), 1D-blocked weights and batched operands are not the skinny
    kernel's layout: `supports` still takes them, through the general kernel."""
    x, w = jax.ShapeDtypeStruct((16, 512), jnp.float32), jax.ShapeDtypeStruct((512, 512),
                                                                            jnp.float32)
    qx, qw_t, qw_1d = jax.eval_shape(lambda a, b: (
        quantize(a), quantize(b, axis=0, block_2d=True).mT, quantize(b, axis=0)), x, w)
    for rhs in (qw_t, qw_1d):
        assert gemm.supports(qx, rhs) is None
        assert jax.eval_shape(gemm.matmul, qx, rhs).shape == (16, 512)


@pytest.mark.parametrize("mnk, cfg, match", [
    ((16, 512, 1024), SkinnyConfig(k_splits=16), "tile_k·k_splits"),
    ((16, 384, 1024), SkinnyConfig(), "multiple of 256"),
    ((128, 512, 1024), SkinnyConfig(), "M <= 64"),
])
def test_shapes_the_skinny_kernel_cannot_take(mnk, cfg, match):
    """An explicit SkinnyConfig the operands do not fit raises `supports`' reason."""
    lhs, rhs = _abstract(*mnk)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(functools.partial(gemm.matmul, config=cfg), lhs, rhs)


def test_config_validation():
    with pytest.raises(ValueError, match="tile_k"):
        SkinnyConfig(tile_k=64)
    with pytest.raises(ValueError, match="k_splits"):
        SkinnyConfig(k_splits=0)


# ----------------------------------------------------------------------------------------
# GPU: the compiled kernel.
# ----------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not _ON_GPU, reason="needs a GPU")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mnk, dtype", [
    ((16, 8192, 8192), "bfloat16"), ((64, 8192, 8192), "float32"),
    ((1, 2048, 2048), "float32"), ((7, 1024, 4096), "float16"), ((33, 512, 1024), "float32"),
])
def test_gpu_matches_reference(mnk, dtype):
    lhs, rhs = _operands(*mnk, seed=sum(mnk))
    want = jax.jit(functools.partial(ref_matmul, preferred_element_type=dtype))(lhs, rhs)
    junk = jnp.full((mnk[0] * mnk[1],), jnp.nan, jnp.float32)  # poison the allocator
    junk.block_until_ready()
    junk.delete()
    _check(_compare(gemm.matmul(lhs, rhs, preferred_element_type=dtype), want), False, dtype)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 40, 64])
@pytest.mark.parametrize("k_splits", [1, 2])
def test_gpu_bitwise_when_sums_are_exact(m, k_splits):
    lhs, rhs = _operands(m, 1024, 512, exact=True)
    want = jax.jit(ref_matmul)(lhs, rhs)
    got = gemm.matmul(lhs, rhs, config=SkinnyConfig(k_splits=k_splits))
    _check(_compare(got, want), True, "float32")


if __name__ == "__main__" and "--interpret-worker" in sys.argv:
    print(json.dumps({name: _run_case(name) for name in INTERPRET_CASES}))
elif __name__ == "__main__" and "--time-worker" in sys.argv:
    import time
    for name in INTERPRET_CASES:
        t = time.time()
        r = _run_case(name)
        print(name, f"{time.time() - t:.1f}s", r, flush=True)
