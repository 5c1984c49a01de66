"""Tests of the Mosaic GPU NVFP4 GEMM (`pallas_kernels.matmul`) against `fp4jax.matmul`.

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
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from pallas_kernels import matmul as mm
from pallas_kernels import matmul_decode as dec

_ON_GPU = jax.devices()[0].platform == "gpu"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _normal(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _exact(shape, seed):
    """E2M1-grid values with a ±6 in every 16-block along both axes: every block scale
    is 448, the codes are the values, and (for K ≤ 512) every float32 sum is exact."""
    grid = jnp.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], jnp.float32)
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = grid[jax.random.randint(k1, shape, 0, 8)] * jnp.where(
        jax.random.bernoulli(k2, 0.5, shape), -1.0, 1.0)
    return x.at[..., :, ::16].set(6.0).at[..., ::16, :].set(-6.0)


def _layout_operands(layout, m, n, k, *, exact=False, seed=0):
    """(lhs, rhs, kwargs) of the ``layout`` GEMM with output (m, n), contraction k."""
    data = _exact if exact else _normal
    if layout == "fprop":  # Y = X W: X blocked along K, W 2D-tiled.
        x, w = data((m, k), seed), data((k, n), seed + 1)
        return fp4jax.quantize(x), fp4jax.quantize(w, axis=0, block_2d=True), {}
    if layout == "dgrad":  # dX = dY W^T: dY (m, k) blocked along k, W (n, k) 2D-tiled.
        g, w = data((m, k), seed), data((n, k), seed + 1)
        return fp4jax.quantize(g), fp4jax.quantize(w, axis=0, block_2d=True).mT, {}
    if layout in ("wgrad", "wgrad_plain"):  # dW = X^T dY, both blocked along tokens.
        x, g = data((k, m), seed), data((k, n), seed + 1)
        kw = {"lhs_from_mT": True} if layout == "wgrad" else {}
        return fp4jax.quantize(x, axis=0).mT, fp4jax.quantize(g, axis=0), kw
    raise ValueError(layout)


def _abstract_operands(layout, m, n, k):
    """Like `_layout_operands`, as shapes only (for tests that only trace)."""
    lhs, rhs = jax.eval_shape(lambda: _layout_operands(layout, m, n, k)[:2])
    return lhs, rhs, ({"lhs_from_mT": True} if layout == "wgrad" else {})


def _compare(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return {
        "shape_ok": got.shape == want.shape,
        "finite": bool(np.isfinite(got).all()),
        "rel": float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)),
        "max_rel_elem": float(np.max(np.abs(got - want) / (np.abs(want) + 1e-3))),
        "bitwise": bool(np.array_equal(got.view(np.uint32), want.view(np.uint32))),
    }


# ----------------------------------------------------------------------------------------
# CPU / CI: interpret mode, in a subprocess.
# ----------------------------------------------------------------------------------------

def _small(**kw):
    return mm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, **{"num_sms": 1, **kw})


# name -> (layout, (m, n, k), exact inputs, preferred_element_type, config, batch).
# Small but structural: several output tiles per persistent CTA, several K steps, both
# warpgroup splits, split-K with a padded M, batch dims.
INTERPRET_CASES = {
    "fprop_batched": ("fprop", (64, 128, 128), False, "float32", _small(), 2),
    "dgrad_wg_m": ("dgrad", (128, 64, 128), False, "float32",
                   _small(wg_dimension=mm.MatmulDimension.M), None),
    "wgrad_from_mT": ("wgrad", (64, 128, 128), True, "float32", _small(), None),
    "skinny_splitk_bf16": ("fprop", (16, 128, 128), False, "bfloat16",
                           _small(k_splits=2, num_sms=2), None),
}


def _run_case(name):
    layout, (m, n, k), exact, dtype, cfg, batch = INTERPRET_CASES[name]
    if batch:  # fprop with leading batch dims
        data = _exact if exact else _normal
        x, w = data((batch, m, k), 0), data((batch, k, n), 1)
        lhs, rhs, kw = fp4jax.quantize(x), fp4jax.quantize(w, axis=1, block_2d=True), {}
    else:
        lhs, rhs, kw = _layout_operands(layout, m, n, k, exact=exact)
    got = mm.matmul(lhs, rhs, preferred_element_type=dtype, config=cfg, interpret=True, **kw)
    want = fp4jax.matmul(lhs, rhs, preferred_element_type=dtype)
    return _compare(got, want)


@functools.cache
def _interpret_results():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=_ROOT,
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
               + " --xla_force_host_platform_device_count=8")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--interpret-worker"],
        cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpret_matches_reference(name):
    r = _interpret_results()[name]
    _, _, exact, dtype, _, _ = INTERPRET_CASES[name]
    assert r["shape_ok"] and r["finite"], r
    if exact:
        assert r["bitwise"], r
    elif dtype == "float32":
        assert r["rel"] <= 1e-6, r
    else:  # a float32 sum-order difference may flip one bf16 rounding
        assert r["max_rel_elem"] <= 2.0**-7, r


@pytest.mark.parametrize(
    "layout, mnk, cfg, match",
    [
        ("fprop", (128, 100 * 2, 128), None, "N=200"),  # N not a multiple of the tile
        ("fprop", (128, 256, 80), None, "K=80"),  # K not a multiple of tile_k
        ("fprop", (200, 256, 128), None, "M=200"),  # M > tile but not a multiple
        ("wgrad", (96, 256, 128), None, "M=96"),  # padding M needs lhs_from_mT=False
        ("fprop", (128, 256, 128), mm.TuningConfig(k_splits=4), "tile_k·k_splits"),
    ],
)
def test_shapes_it_cannot_take(layout, mnk, cfg, match):
    lhs, rhs, kw = _abstract_operands(layout, *mnk)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(functools.partial(mm.matmul, config=cfg, **kw), lhs, rhs)


def test_unsupported_layouts_and_dtypes():
    x = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    def quant(x, **kw):
        return jax.eval_shape(functools.partial(fp4jax.quantize, **kw), x)
    q_m = quant(x, axis=0, block_2d=True)  # lhs blocked along M
    q_k = quant(x, axis=0)
    with pytest.raises(ValueError, match="blocked along M"):
        jax.eval_shape(mm.matmul, q_m, q_k)
    with pytest.raises(ValueError, match="preferred_element_type"):
        jax.eval_shape(functools.partial(mm.matmul, preferred_element_type=jnp.int32),
                       quant(x), q_k)
    with pytest.raises(ValueError, match="contraction sizes differ"):  # check_operands
        jax.eval_shape(mm.matmul, quant(jax.ShapeDtypeStruct((128, 64), jnp.float32)), q_k)


def test_config_validation():
    with pytest.raises(ValueError, match="tile_m"):
        mm.TuningConfig(tile_m=96)
    with pytest.raises(ValueError, match="max_concurrent_steps"):
        mm.TuningConfig(max_concurrent_steps=1)
    with pytest.raises(ValueError, match="epi_tile_n"):
        mm.TuningConfig(epi_tile_n=48)
    assert mm.default_config(8192, 8192, 8192) == mm.LARGE_CONFIG
    assert mm.default_config(16, 8192, 8192) == mm.SKINNY_CONFIG
    cfg = mm.default_config(384, 640, 1152)  # non-power-of-two multiples of 128
    assert 384 % cfg.cta_tile_m == 0 and 640 % cfg.cta_tile_n == 0


# --- The GPU decode's bit recipes and register renamings, checked on the CPU. ---------

_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def _bf16_bits_value(bits):
    """Exact value (float64, subnormals kept) of uint16 BF16 bit patterns."""
    return (np.asarray(bits, np.uint32) << 16).view(np.float32).astype(np.float64)


def test_gpu_decode_bit_recipes():
    """The integer recipes give e2m1(code) · 2**-126 (numpy mirror of the mgpu code)."""
    b = np.arange(256, dtype=np.uint64)
    lo, hi = _E2M1[b & 15] * 2.0**-126, _E2M1[b >> 4] * 2.0**-126
    m32 = np.uint64(0xFFFFFFFF)
    # Rows layout: one byte -> bf16x2 (low code, high code).
    w = (((b * dec.ROWS_MAG_MUL) & m32) & dec.MAG_MASK) | (
        ((b * dec.ROWS_SIGN_MUL) & m32) & dec.SIGN_MASK)
    np.testing.assert_array_equal(_bf16_bits_value(w & 0xFFFF), lo)
    np.testing.assert_array_equal(_bf16_bits_value(w >> 16), hi)
    # Cols layout: bytes (b0, b1) of one row -> even-row (lo0, lo1), odd-row (hi0, hi1).
    b0, b1 = np.meshgrid(b, b, indexing="ij")
    assert dec.COLS_SPREAD == 0x4140  # prmt: bytes [b0, 0, b1, 0]
    y = b0 | (b1 << 16)
    for which, code in (("even", lambda v: v & 15), ("odd", lambda v: v >> 4)):
        mag_s, sign_s = dec.COLS_SHIFTS[which]
        w = (((y << mag_s) & m32) & dec.MAG_MASK) | (((y << sign_s) & m32) & dec.SIGN_MASK)
        np.testing.assert_array_equal(_bf16_bits_value(w & 0xFFFF), _E2M1[code(b0)] * 2.0**-126)
        np.testing.assert_array_equal(_bf16_bits_value(w >> 16), _E2M1[code(b1)] * 2.0**-126)
    # Times the scale factor s · 2**118 (BF16), every product is e2m1 · s · 2**-8, exactly.
    s = np.array([2.0**-9, 7 * 2.0**-9, 0.8125, 1.0, 240.0, 448.0])
    prod = lo[:, None] * (s * 2.0**118)[None, :]
    np.testing.assert_array_equal(prod, _E2M1[b & 15][:, None] * s[None, :] * 2.0**-8)
    assert dec.SCALE_FACTOR_SUBNORMAL == 2.0**118 and dec.ACC_UNSCALE == 2.0**16
    assert dec.SCALE_FACTOR_EXACT == 2.0**-8
    # decode="normal": r = bf16((c & 7) << 6 + 0x3F00), then min(r, 2r - 1), then the sign.
    mag = np.arange(8, dtype=np.uint64) << 6
    r = _bf16_bits_value((mag + (dec.NORMAL_BIAS & 0xFFFF)) & 0xFFFF)
    assert r.min() > 2.0**-126  # no subnormals anywhere
    np.testing.assert_array_equal(np.minimum(r, 2 * r - 1), _E2M1[:8])
    assert dec.NORMAL_BIAS >> 16 == dec.NORMAL_BIAS & 0xFFFF


def _tiled_owner(layout, shape):
    """{(warp, lane, register index, vector position): logical index} of a TiledLayout,
    from the tiling semantics documented in mosaic/gpu/fragmented_array.py."""
    idx = np.arange(int(np.prod(shape))).reshape(shape)
    for tile in layout.tiling.tiles:
        lead, dims = idx.shape[:-len(tile)], idx.shape[-len(tile):]
        idx = idx.reshape(*lead, *[v for d, t in zip(dims, tile) for v in (d // t, t)])
        nl = len(lead)
        idx = idx.transpose(*range(nl), *range(nl, nl + 2 * len(tile), 2),
                            *range(nl + 1, nl + 2 * len(tile), 2))
    nd = idx.ndim
    dims = lambda ds: [d % nd for d in ds if isinstance(d, int)]  # noqa: E731
    warp_d, lane_d, vec_d = dims(layout.warp_dims), dims(layout.lane_dims), layout.vector_dim % nd
    owner = {}
    for pos in np.ndindex(idx.shape):
        def lin(ds, pos=pos):
            return int(np.ravel_multi_index([pos[d] for d in ds], [idx.shape[d] for d in ds]))
        reg = tuple(0 if d in warp_d + lane_d + [vec_d] else pos[d] for d in range(nd))
        owner[(lin(warp_d), lin(lane_d), reg, pos[vec_d])] = np.unravel_index(idx[pos], shape)
    return owner


def test_gpu_register_renamings():
    """Decode and zip only rename registers: check them against Mosaic's layouts."""
    from jax.experimental.mosaic import gpu as mgpu  # noqa: PLC0415

    wgmma = _tiled_owner(mgpu.WGMMA_LAYOUT, (128, 64))
    # The simulator reproduces the documented WGMMA assignment (lane 5: row 1, cols 2-3).
    zero = (0,) * 9
    assert [wgmma[(0, 5, zero, v)] for v in (0, 1)] == [(1, 2), (1, 3)]
    assert wgmma[(1, 0, zero, 0)] == (16, 0)
    rows_bytes = _tiled_owner(dec.ROWS_BYTES_LAYOUT.to_mgpu(), (128, 32))
    for (w, l, reg, v), (i, j) in rows_bytes.items():  # byte (i, j) -> elements 2j, 2j+1
        assert v == 0
        for half in (0, 1):
            assert wgmma[(w, l, reg, half)] == (i, 2 * j + half)
    cols_bytes = _tiled_owner(dec.COLS_BYTES_LAYOUT.to_mgpu(), (8, 128))
    decoded = _tiled_owner(dec.COLS_DECODED_LAYOUT.to_mgpu(), (16, 128))
    for (w, l, reg, v), (j, c) in cols_bytes.items():  # packed row j -> rows 2j, 2j+1
        for parity in (0, 1):
            assert decoded[(w, l, dec.zipped_register(reg, parity), v)] == (2 * j + parity, c)


def test_lowers_for_cuda():
    """The Mosaic GPU lowering (layouts, transforms, SMEM budget) runs on a CPU host."""
    for layout, cfg in (("fprop", None), ("dgrad", None), ("wgrad", None),
                        ("fprop", mm.TuningConfig(decode="normal")),
                        ("dgrad", mm.TuningConfig(decode="normal", tile_n=64))):
        lhs, rhs, kw = _abstract_operands(layout, 512, 512, 512)
        f = jax.jit(functools.partial(mm.matmul, config=cfg, **kw))
        f.trace(lhs, rhs).lower(lowering_platforms=("cuda",))
    lhs, rhs, _ = _abstract_operands("fprop", 16, 1024, 2048)
    jax.jit(mm.matmul).trace(lhs, rhs).lower(lowering_platforms=("cuda",))


# ----------------------------------------------------------------------------------------
# GPU: the compiled kernel.
# ----------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not _ON_GPU, reason="needs a GPU")


def _poison_allocator(nbytes: int):
    """Fills and frees a NaN buffer of ``nbytes`` so a fresh output likely reuses it."""
    junk = jnp.full((max(nbytes // 4, 1),), jnp.nan, jnp.float32)
    junk.block_until_ready()
    junk.delete()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fprop", "dgrad", "wgrad", "wgrad_plain"])
@pytest.mark.parametrize("mnk", [(384, 640, 1152), (256, 512, 256), (1024, 1024, 2048)])
def test_gpu_matches_reference(layout, mnk):
    lhs, rhs, kw = _layout_operands(layout, *mnk, seed=sum(mnk))
    want = jax.jit(fp4jax.matmul)(lhs, rhs)
    _poison_allocator(4 * mnk[0] * mnk[1])
    got = mm.matmul(lhs, rhs, **kw)
    r = _compare(got, want)
    assert r["shape_ok"] and r["finite"] and r["rel"] <= 1e-6, r


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("decode", ["subnormal", "normal"])
@pytest.mark.parametrize("layout", ["fprop", "dgrad", "wgrad"])
def test_gpu_bitwise_when_sums_are_exact(layout, decode):
    lhs, rhs, kw = _layout_operands(layout, 256, 512, 512, exact=True)
    want = jax.jit(fp4jax.matmul)(lhs, rhs)
    _poison_allocator(4 * 256 * 512)
    cfg = dataclasses.replace(mm.default_config(256, 512, 512), decode=decode)
    r = _compare(mm.matmul(lhs, rhs, config=cfg, **kw), want)
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
        ((512, 512, 1024), jnp.float32, mm.TuningConfig(auto_barriers=True)),
        ((512, 512, 1024), jnp.float32,
         mm.TuningConfig(wg_dimension=mm.MatmulDimension.M, max_concurrent_steps=6)),
    ],
)
def test_gpu_configs_and_dtypes(mnk, dtype, cfg):
    lhs, rhs, _ = _layout_operands("fprop", *mnk, seed=1)
    want = jax.jit(functools.partial(fp4jax.matmul, preferred_element_type=dtype))(lhs, rhs)
    _poison_allocator(4 * mnk[0] * mnk[1])
    got = mm.matmul(lhs, rhs, preferred_element_type=dtype, config=cfg)
    r = _compare(got, want)
    assert r["shape_ok"] and r["finite"], r
    if dtype == jnp.float32:
        assert r["rel"] <= 1e-6, r
    else:
        assert r["max_rel_elem"] <= 2.0**-7, r


@gpu
@pytest.mark.gpu
def test_gpu_batched():
    x, w = _normal((3, 256, 512), 0), _normal((3, 512, 256), 1)
    lhs, rhs = fp4jax.quantize(x), fp4jax.quantize(w, axis=1, block_2d=True)
    r = _compare(mm.matmul(lhs, rhs), jax.jit(fp4jax.matmul)(lhs, rhs))
    assert r["shape_ok"] and r["finite"] and r["rel"] <= 1e-6, r


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(384, 600, 1152), (384, 640, 1000), (300, 640, 1152)])
def test_gpu_shapes_it_cannot_take(mnk):
    lhs, rhs, kw = _layout_operands("fprop", *mnk)
    with pytest.raises(ValueError, match="must be a multiple"):
        mm.matmul(lhs, rhs, **kw)


if __name__ == "__main__" and "--interpret-worker" in sys.argv:
    print(json.dumps({name: _run_case(name) for name in INTERPRET_CASES}))
elif __name__ == "__main__" and "--time-worker" in sys.argv:
    import time
    for name in INTERPRET_CASES:
        t = time.time()
        r = _run_case(name)
        print(name, f"{time.time() - t:.1f}s", r, flush=True)
