"""Tests of the pipelined NVFP4 GEMM mainloop (`pallas_kernels.gemm_pipelined`,
``TuningConfig.mainloop="pipelined"``) against the reference GEMM.

CPU/CI:
* the register-level parts the CPU cannot run, emulated in numpy for every thread of a
  warpgroup from the layouts' definitions (`gemm_skinny_layouts.thread_view`, itself
  checked against Mosaic's documented WGMMA layout in tests/kernels/test_gemm_skinny.py):
  the lhs decode into the register A operand (both lhs layouts), the rhs decode into the
  decoded tile (all four operand pairs), the epilogue's row renaming; and the interpret
  mode's static permutations against the maps the plans use;
* the Mosaic GPU lowering for CUDA at 8192³ and 4096³ in the fprop, dgrad and wgrad
  layouts (layouts, transforms, TMA boxes, the SMEM budget, and Mosaic's own bank-conflict
  check of every shared-memory transfer but the lhs scale load);
* the kernel in Mosaic GPU interpret mode (pipeline, the three decoded buffers reused over
  several output tiles, both warpgroups' halves, the permutations) in one subprocess,
  bitwise on exact-sum data in the three layouts;
* the config's validation.
GPU (``-m gpu``; skipped without a GPU): the compiled kernel in every layout at several
shapes, bitwise on exact-sum data, output dtypes, split K and batch dims.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.mosaic import gpu as mgpu

from fp4jax.reference.gemm import matmul as ref_matmul
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm, gemm_pipelined_decode, wgmma_regs
from pallas_kernels import gemm_pipelined_layouts as pl_
from pallas_kernels.gemm_config import PIPELINED_CONFIG, MatmulDimension, TuningConfig
from pallas_kernels.gemm_skinny_layouts import thread_view
from tests.kernels.nvfp4_bits import (
    abstract_layout_operands,
    compare_outputs,
    interpret_worker_results,
    interpreted_gemm_vs_reference,
    layout_operands,
    nan_poison_allocator,
    worker_main,
)

_ON_GPU = jax.devices()[0].platform == "gpu"
_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
_THREADS = [(w, lane) for w in range(4) for lane in range(32)]


def _bf16_value(bits):
    """Exact value (float64, subnormals kept) of uint16 BF16 bit patterns."""
    return (np.asarray(bits, np.uint32) << 16).view(np.float32).astype(np.float64)


def _decode_pair(u, v, sel):
    """numpy mirror of `wgmma_regs.decode_pair` (``prmt`` in its default mode, spread,
    mask) on Python ints: the (low, high) values of the bf16x2 result."""
    src = [(u >> 8 * i) & 0xFF for i in range(4)] + [(v >> 8 * i) & 0xFF for i in range(4)]
    y = 0
    for i in range(4):
        c = (sel >> 4 * i) & 0xF
        byte = src[c & 7]
        if c & 8:
            byte = 0xFF if byte & 0x80 else 0
        y |= byte << 8 * i
    bits = (y * wgmma_regs.SPREAD_MUL) & 0xFFFFFFFF & wgmma_regs.BF16_MASK
    return _bf16_value(bits & 0xFFFF), _bf16_value(bits >> 16)


def _planes(word):
    return word & wgmma_regs.NIBBLES, (word >> 4) & wgmma_regs.NIBBLES


def _register_words(layout, tile, warp, lane):
    """{register: [32-bit words]} a thread loads from ``tile`` (uint8) under ``layout``."""
    regs = {}
    for (reg, pos), idx in thread_view(layout, tile.shape, warp, lane).items():
        regs.setdefault(reg, {})[pos] = int(tile[idx])
    out = {}
    for reg, parts in regs.items():
        value = sum(b << 8 * p for p, b in parts.items())
        out[reg] = [(value >> 32 * i) & 0xFFFFFFFF for i in range(max(1, len(parts) // 4))]
    return out


def _register_values(layout, tile, warp, lane):
    return {key: tile[idx] for key, idx in thread_view(layout, tile.shape, warp, lane).items()}


def _factors(rng, shape):
    """bf16 block factors (as the interpret mode gets them: s · 2**-8, s an E4M3 value)."""
    s = rng.integers(1, 0x7F, shape).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    return (s.astype(np.float64) * 2.0**-8).astype(ml_dtypes.bfloat16)


def test_static_permutations_match_the_maps():
    """The interpret mode's reshape-and-transpose permutations are the maps the plans use
    (`rows_col`, `cols_row` and its inverse), and both maps are permutations."""
    k = np.arange(pl_.TILE_K)
    assert sorted(map(pl_.rows_col, k)) == list(k)
    got = gemm_pipelined_decode.take_k(jnp.asarray(k)[None], pl_.rows_col, 1)[0]
    np.testing.assert_array_equal(got, [pl_.rows_col(i) for i in k])
    rows = np.arange(pl_.WG_M)
    assert sorted(map(pl_.cols_row, rows)) == list(rows)
    got = gemm_pipelined_decode.take_rows(jnp.asarray(rows), pl_.cols_row)
    np.testing.assert_array_equal(got, [pl_.cols_row(r) for r in rows])
    back = gemm_pipelined_decode.take_rows(got, pl_.cols_row, inverse=True)
    np.testing.assert_array_equal(back, rows)


def test_each_thread_pairs_share_one_scale_block():
    """`A_ROWS`: a thread's 8 pairs of a row are one 16-block of the contraction (one
    64-bit load, one scale); `A_COLS`: its two rows are adjacent lhs rows."""
    for lane in range(4):
        cols = {pl_.rows_col(k) // 16 for k in range(64) if (k % 8) // 2 == lane}
        assert cols == {lane}
    assert all(pl_.cols_row(r + 8) == pl_.cols_row(r) + 1 for r in range(8))


@pytest.mark.parametrize("a", [pl_.A_ROWS, pl_.A_COLS], ids=["rows", "cols"])
def test_lhs_decode_emulated_for_every_thread(a):
    """The GPU lhs decode, emulated for all 128 threads with thread 0's renaming (as the
    kernel does): each thread's loads (`thread_view` of the code and scale layouts) decode
    into exactly the A registers the WGMMA layout gives it, A[ρ, κ] = e2m1 · f of lhs row
    ``row(ρ)`` at contraction ``col(κ)``; the interpret-mode decode gives the same array."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (pl_.WG_M, pl_.TILE_K))  # (lhs row, contraction)
    f = _factors(rng, a.scales_shape)  # (block, lhs row)
    pairs = codes[:, 0::2] | codes[:, 1::2] << 4
    tile = (pairs if a.name == "rows" else pairs.T).astype(np.uint8)
    rows = [a.row(r) for r in range(pl_.WG_M)]
    cols = [a.col(k) for k in range(pl_.TILE_K)]
    f64 = f.astype(np.float64)
    want = (_E2M1[codes] * np.repeat(f64, 16, axis=0).T)[rows][:, cols]
    plan = pl_.a_plan(a)
    got = np.full(want.shape, np.nan)
    for warp, lane in _THREADS:
        words = _register_words(a.codes, tile, warp, lane)
        scales = _register_values(a.scales, f64 * 2.0**126, warp, lane)  # the GPU factors
        view = thread_view(mgpu.WGMMA_LAYOUT, want.shape, warp, lane)
        for dst, (src, word, sel, skey) in plan.items():
            for v, val in enumerate(_decode_pair(*_planes(words[src][word]), sel)):
                assert np.isnan(got[view[(dst, v)]])
                got[view[(dst, v)]] = val * scales[skey]
    np.testing.assert_array_equal(got, want)
    interp = gemm_pipelined_decode.decode_a(a, jnp.asarray(tile), jnp.asarray(f), interpret=True)
    np.testing.assert_array_equal(np.asarray(interp, np.float64), want)


@pytest.mark.parametrize("lhs_cols, rhs_cols", [(False, False), (False, True), (True, False),
                                                (True, True)],
                         ids=["fprop", "dgrad", "wgrad", "cols-cols"])
def test_rhs_decode_emulated_for_every_thread(lhs_cols, rhs_cols):
    """The GPU rhs decode, emulated for all threads with thread 0's renaming (a
    ``"cols"`` thread takes its lane parity's nibble plane): the decoded tile holds
    e2m1 · f of contraction ``col(κ)`` at row (N-major) or column (K-major) κ, every
    element written once; the interpret-mode decode gives the same tile."""
    _, b = pl_.operands(lhs_cols, rhs_cols)
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, (pl_.TILE_K, pl_.HALF_N))  # (contraction, column)
    f = _factors(rng, b.scales_shape)
    f64 = f.astype(np.float64)
    if b.name == "rows":
        tile = (codes[0::2] | codes[1::2] << 4).astype(np.uint8)  # (K/2, N)
        nat = _E2M1[codes] * np.repeat(f64, 16, axis=0)
    else:
        tile = (codes[:, 0::2] | codes[:, 1::2] << 4).T.astype(np.uint8)  # (N/2, K)
        nat = _E2M1[codes] * np.repeat(np.repeat(f64, 16, axis=0), 16, axis=1)
    cols = [b.col(k) for k in range(pl_.TILE_K)]
    want = nat[cols] if b.name == "rows" else nat[cols].T
    plan = pl_.b_plan(b)
    got = np.full(want.shape, np.nan)
    for warp, lane in _THREADS:
        words = _register_words(b.codes, tile, warp, lane)
        scales = _register_values(b.scales, f64 * 2.0**126, warp, lane)
        view = thread_view(b.stored, want.shape, warp, lane)
        for dst, entries in plan.items():
            for e, (src, word, (p0, p1), (n0, n1), keys) in enumerate(entries):
                w = words[src][word]
                if b.thread_nibble:
                    plane = (w >> 4 * (lane % 2)) & wgmma_regs.NIBBLES
                    vals = _decode_pair(plane, plane, wgmma_regs.selector(p0, p1))
                else:
                    vals = _decode_pair(*_planes(w), wgmma_regs.selector(p0 + 4 * n0, p1 + 4 * n1))
                for v, val in enumerate(vals):
                    idx = view[(dst, 2 * e + v)]
                    assert np.isnan(got[idx])
                    got[idx] = val * scales[keys[v]]
    np.testing.assert_array_equal(got, want)
    interp = np.zeros(want.shape, ml_dtypes.bfloat16)
    gemm_pipelined_decode.decode_b(b, jnp.asarray(tile), jnp.asarray(f), interp, interpret=True)
    np.testing.assert_array_equal(interp.astype(np.float64), want)


@pytest.mark.parametrize("en", [32, 64])
def test_epilogue_renaming_for_every_thread(en):
    """`A_COLS` output, emulated for all threads: output row m receives accumulator row
    ``row⁻¹(m)``, every element exactly once, by a register renaming within a thread."""
    acc = np.arange(pl_.WG_M * en, dtype=np.float64).reshape(pl_.WG_M, en)
    plan = pl_.epilogue_plan(pl_.A_COLS, en)
    out = np.full(acc.shape, np.nan)
    for warp, lane in _THREADS:
        a = thread_view(mgpu.WGMMA_LAYOUT, acc.shape, warp, lane)
        o = thread_view(pl_.cols_out_layout(), acc.shape, warp, lane)
        for (dst, pos), idx in o.items():
            assert np.isnan(out[idx])
            out[idx] = acc[a[(plan[dst], pos)]]
    inv = np.argsort([pl_.cols_row(r) for r in range(pl_.WG_M)])
    np.testing.assert_array_equal(out, acc[inv])


def test_config_validation():
    assert PIPELINED_CONFIG.cta_tile_m == 128 and PIPELINED_CONFIG.cta_tile_n == 256
    with pytest.raises(ValueError, match="mainloop"):
        TuningConfig(mainloop="decode_warpgroups")
    with pytest.raises(ValueError, match="tile_m=64, tile_n=256"):
        TuningConfig(mainloop="pipelined")  # the default tiles
    with pytest.raises(ValueError, match="decode='subnormal'"):
        dataclasses.replace(PIPELINED_CONFIG, decode="normal")
    with pytest.raises(ValueError, match="wg_dimension=M"):
        dataclasses.replace(PIPELINED_CONFIG, wg_dimension=MatmulDimension.N)
    with pytest.raises(ValueError, match="decoded_slots must be 2 or 3"):
        dataclasses.replace(PIPELINED_CONFIG, decoded_slots=4)
    with pytest.raises(ValueError, match="applies to mainloop='pipelined' only"):
        TuningConfig(decoded_slots=2)


# ----------------------------------------------------------------------------------------
# CPU / CI: interpret mode, in a subprocess.
# ----------------------------------------------------------------------------------------

def _cfg(**kw):
    return dataclasses.replace(PIPELINED_CONFIG, **{"num_sms": 1, **kw})


# name -> (layout, (m, n, k), exact inputs, preferred_element_type, config). One CTA walks
# two output tiles of 4 K steps each, so the decoded buffers (two, with their release
# barriers: the default) wrap around across tiles; exact-sum data, so the results must be
# bitwise the reference's.
INTERPRET_CASES = {
    "fprop_exact": ("fprop", (256, 256, 256), True, "float32", _cfg()),
    "dgrad_exact_bf16": ("dgrad", (256, 256, 256), True, "bfloat16", _cfg()),
    "wgrad_exact": ("wgrad", (256, 256, 256), True, "float32", _cfg()),
    # Three decoded buffers and no release barrier, across tiles.
    "fprop_three_slots": ("fprop", (256, 256, 256), True, "float32", _cfg(decoded_slots=3)),
}


def _run_case(name):
    layout, (m, n, k), exact, dtype, cfg = INTERPRET_CASES[name]
    lhs, rhs, kw = layout_operands(layout, m, n, k, exact=exact)
    return interpreted_gemm_vs_reference(lhs, rhs, dtype, cfg, **kw)


@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpret_matches_reference(name):
    r = interpret_worker_results(__file__)[name]
    assert r["shape_ok"] and r["finite"] and r["bitwise"], r


@pytest.mark.parametrize("layout", ["fprop", "dgrad", "wgrad"])
def test_lowers_for_cuda(layout):
    """8192³ (float32 output: the largest epilogue buffer) and 4096³ (bfloat16) lower for
    CUDA on this host; with a fourth TMA stage in the shared memory two decoded buffers
    free, and with three buffers."""
    cases = [(8192, jnp.float32, PIPELINED_CONFIG), (4096, jnp.bfloat16, PIPELINED_CONFIG),
             (8192, jnp.float32, dataclasses.replace(PIPELINED_CONFIG, max_concurrent_steps=4)),
             (8192, jnp.float32, dataclasses.replace(PIPELINED_CONFIG, decoded_slots=3))]
    for size, dtype, cfg in cases:
        lhs, rhs, kw = abstract_layout_operands(layout, size, size, size)
        f = jax.jit(functools.partial(gemm.matmul, config=cfg, preferred_element_type=dtype,
                                      **kw))
        text = f.trace(lhs, rhs).lower(lowering_platforms=("cuda",)).as_text()
        assert "mosaic_gpu" in text


def test_a_config_over_the_shared_memory_is_refused_by_name():
    """Three decoded buffers and 4 stages need more than an SM's 227 KB of shared
    memory: a ValueError naming the config and the bytes, at trace time."""
    cfg = dataclasses.replace(PIPELINED_CONFIG, decoded_slots=3, max_concurrent_steps=4)
    lhs, rhs, kw = abstract_layout_operands("fprop", 1024, 1024, 1024)
    with pytest.raises(ValueError, match=r"decoded_slots=3.*bytes of shared memory"):
        jax.eval_shape(functools.partial(gemm.matmul, config=cfg, **kw), lhs, rhs)


# ----------------------------------------------------------------------------------------
# GPU: the compiled kernel.
# ----------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not _ON_GPU, reason="needs a GPU")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fprop", "dgrad", "wgrad", "wgrad_plain"])
@pytest.mark.parametrize("mnk", [(384, 768, 1152), (1024, 1024, 2048)])
def test_gpu_matches_reference(layout, mnk):
    lhs, rhs, kw = layout_operands(layout, *mnk, seed=sum(mnk))
    want = jax.jit(ref_matmul)(lhs, rhs)
    nan_poison_allocator(4 * mnk[0] * mnk[1])
    got = gemm.matmul(lhs, rhs, config=PIPELINED_CONFIG, **kw)
    r = compare_outputs(got, want)
    assert r["shape_ok"] and r["finite"] and r["rel"] <= 1e-6, r


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["fprop", "dgrad", "wgrad", "wgrad_plain"])
def test_gpu_bitwise_when_sums_are_exact(layout, dtype):
    lhs, rhs, kw = layout_operands(layout, 512, 768, 512, exact=True)
    want = jax.jit(functools.partial(ref_matmul, preferred_element_type=dtype))(lhs, rhs)
    nan_poison_allocator(4 * 512 * 768)
    got = gemm.matmul(lhs, rhs, config=PIPELINED_CONFIG, preferred_element_type=dtype, **kw)
    r = compare_outputs(got, want)
    assert r["bitwise"], r


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dataclasses.replace(PIPELINED_CONFIG, k_splits=2),
                                 dataclasses.replace(PIPELINED_CONFIG, max_concurrent_steps=3),
                                 dataclasses.replace(PIPELINED_CONFIG, num_sms=7),
                                 dataclasses.replace(PIPELINED_CONFIG, decoded_slots=3),
                                 dataclasses.replace(PIPELINED_CONFIG,
                                                     max_concurrent_steps=4, num_sms=5)])
def test_gpu_configs(cfg):
    lhs, rhs, kw = layout_operands("dgrad", 512, 512, 1024, seed=3)
    r = compare_outputs(gemm.matmul(lhs, rhs, config=cfg, **kw), jax.jit(ref_matmul)(lhs, rhs))
    assert r["shape_ok"] and r["finite"] and r["rel"] <= 1e-6, r


@gpu
@pytest.mark.gpu
def test_gpu_batched():
    x = jax.random.normal(jax.random.key(0), (3, 256, 512))
    w = jax.random.normal(jax.random.key(1), (3, 512, 256))
    lhs, rhs = quantize(x), quantize(w, axis=1, block_2d=True)
    got = gemm.matmul(lhs, rhs, config=PIPELINED_CONFIG)
    r = compare_outputs(got, jax.jit(ref_matmul)(lhs, rhs))
    assert r["shape_ok"] and r["finite"] and r["rel"] <= 1e-6, r


if __name__ == "__main__":
    worker_main(INTERPRET_CASES, _run_case)
