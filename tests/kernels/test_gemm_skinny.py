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

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.mosaic import gpu as mgpu

from fp4jax.reference.gemm import matmul as ref_matmul
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm, gemm_data, gemm_skinny
from pallas_kernels import gemm_skinny_decode as sd
from pallas_kernels import gemm_skinny_layouts as sl
from pallas_kernels.gemm_config import SkinnyConfig, default_config
from tests.kernels.nvfp4_bits import (
    compare_outputs,
    interpret_worker_results,
    interpreted_gemm_vs_reference,
    nan_poison_allocator,
    worker_main,
)

_ON_GPU = jax.devices()[0].platform == "gpu"
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


def _decode_word(word, sel):
    """numpy mirror of `gemm_skinny_decode._decode_word` for one selector: uint64 words
    -> the (low half, high half) values of the bf16x2 result."""
    u = word & sd.NIBBLES
    v = (word >> np.uint64(4)) & sd.NIBBLES
    bits = ((_prmt(u, v, sel) * sd.SPREAD_MUL) & np.uint64(0xFFFFFFFF)) & sd.BF16_MASK
    return _bf16_value(bits & 0xFFFF), _bf16_value(bits >> 16)


def _scale_factor(b):
    """numpy mirror of `gemm_skinny_decode._scale_factor`: E4M3 bits -> s · 2**118."""
    b = np.asarray(b, np.uint32)
    e, normal = (b >> 3) & 15, ((b >> 3) & 15) != 0
    mant = (b & 7) | np.where(normal, 8, 0).astype(np.uint32)
    pow2 = ((np.where(normal, e, 1) + sd.SCALE_EXP_BIAS) << 23).astype(np.uint32)
    s = mant.astype(np.float32) * pow2.view(np.float32)
    bits = s.view(np.uint32) | ((b & 0x80) << 24)
    bits = np.where((b & 0x7F) == 0x7F, np.uint32(0x7FC00000), bits).astype(np.uint32)
    return bits.view(np.float32).astype(ml_dtypes.bfloat16)


def test_word_decode_recipe():
    """Every selector gathers the codes it names: for all byte values in every position,
    nibble pairs (p, q) of a word decode to e2m1 · 2**-126 exactly."""
    rng = np.random.default_rng(0)
    for p0, p1 in ((0, 4), (3, 7), (0, 1), (6, 7), (2, 3), (5, 4)):
        for b in range(256):
            word = rng.integers(0, 2**32, 64, dtype=np.uint64)
            word = (word & ~np.uint64(0xFF << 8 * (p0 % 4))) | np.uint64(b << 8 * (p0 % 4))
            sel = p0 | sl.ZERO_BYTE << 4 | p1 << 8 | sl.ZERO_BYTE << 12
            lo, hi = _decode_word(word, sel)
            code = [((word >> np.uint64(8 * (p % 4) + 4 * (p // 4))) & 15).astype(int)
                    for p in (p0, p1)]
            np.testing.assert_array_equal(lo, _E2M1[code[0]] * 2.0**-126)
            np.testing.assert_array_equal(hi, _E2M1[code[1]] * 2.0**-126)


def test_scale_factor_recipe():
    """For every E4M3 byte (subnormal, negative and NaN scales included) the factor is
    s · 2**118, exact in BF16, and e2m1 · 2**-126 times it is e2m1 · s · 2**-8, exact."""
    b = np.arange(256, dtype=np.uint8)
    s = b.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    factor = _scale_factor(b).astype(np.float64)
    np.testing.assert_array_equal(factor, s * 2.0**118)  # NaN where s is NaN
    finite = ~np.isnan(s)
    np.testing.assert_array_equal(np.signbit(factor[finite]), np.signbit(s[finite]))
    prod = (_E2M1[:, None] * 2.0**-126) * factor[None, :]
    np.testing.assert_array_equal(prod.astype(ml_dtypes.bfloat16).astype(np.float64),
                                  _E2M1[:, None] * s[None, :] * 2.0**-8)
    assert sd.ACC_UNSCALE == 2.0**8


@pytest.mark.parametrize("variant", list(sl.VARIANTS.values()), ids=list(sl.VARIANTS))
def test_permutations(variant):
    assert sorted(map(variant.row, range(sl.WG_ROWS))) == list(range(sl.WG_ROWS))
    assert sorted(map(variant.col, range(16))) == list(range(16))
    perm = sd.column_permutation(variant, 256)
    assert sorted(perm) == list(range(256)) and all(perm // 16 == np.arange(256) // 16)


def test_thread_view_matches_documented_layouts():
    """The layout simulator reproduces Mosaic's documented WGMMA assignments (PTX
    ``wgmma-64n16-d``), including replicated lane and warp dims."""
    wgmma = sl.thread_view(mgpu.WGMMA_LAYOUT, (128, 64), 0, 5)
    zero = (0,) * 9
    assert [wgmma[(zero, v)] for v in (0, 1)] == [(1, 2), (1, 3)]
    assert sl.thread_view(mgpu.WGMMA_LAYOUT, (128, 64), 1, 0)[(zero, 0)] == (16, 0)
    for warp, lane in ((0, 0), (2, 13), (3, 31)):
        rows = set(sl.thread_view(mgpu.WGMMA_ROW_LAYOUT, (64,), warp, lane).values())
        assert rows == {(16 * warp + lane // 4,), (16 * warp + lane // 4 + 8,)}
        cols = set(sl.thread_view(mgpu.WGMMA_COL_LAYOUT, (16,), warp, lane).values())
        assert cols == {(2 * (lane % 4) + d,) for d in (0, 1, 8, 9)}


def _threads():
    return [(w, lane) for w in range(4) for lane in range(32)]


def _stored_tile(variant, codes, tile_k):
    """Packs logical codes (128 output columns, tile_k contraction) as the weight is
    stored: fprop (tile_k/2, 128) packed along K, dgrad (64, tile_k) packed along N."""
    c = codes.T if variant.name == "fprop" else codes  # the packed axis first
    return (c[0::2] | (c[1::2] << 4)).astype(np.uint8)


@pytest.mark.parametrize("variant, tile_k", [  # tile_k: a part of a step (k_substeps)
    (sl.FPROP, 64), (sl.FPROP, 128), (sl.FPROP, 256), (sl.DGRAD, 128), (sl.DGRAD, 256)],
    ids=["fprop-64", "fprop-128", "fprop-256", "dgrad-128", "dgrad-256"])
def test_gpu_decode_emulated_for_every_thread(variant, tile_k):
    """The GPU decode, emulated in numpy for all 128 threads with thread 0's renaming
    (as the kernel does): each thread's loads (`thread_view` of the code and scale
    layouts) decode into exactly the A registers the WGMMA layout gives it, i.e. A row
    rho, column κ is e2m1 · s · 2**-8 of output column ``row(rho)`` and contraction
    column `column_permutation` [κ]. The interpret-mode decode gives the same values in
    the natural row order."""
    rng = np.random.default_rng(tile_k)
    codes = rng.integers(0, 16, (sl.WG_ROWS, tile_k))
    scale_bits = rng.integers(0, 0x7F, (sl.WG_ROWS // 16, tile_k // 16)).astype(np.uint8)
    scale_bits[:2, :4] = np.arange(8).reshape(2, 4)  # zero and subnormal scales
    tile = _stored_tile(variant, codes, tile_k)
    s_tile = scale_bits.T if variant.name == "fprop" else scale_bits
    s = scale_bits.view(ml_dtypes.float8_e4m3fn).astype(np.float64).repeat(16, 0).repeat(16, 1)
    perm = sd.column_permutation(variant, tile_k)
    rows = np.array([variant.row(r) for r in range(sl.WG_ROWS)])
    want = (_E2M1[codes] * s * 2.0**-8)[:, perm]  # natural rows, permuted columns
    plan = sl.decode_plan(variant, tile_k)
    got = np.full((sl.WG_ROWS, tile_k), np.nan)
    for warp, lane in _threads():
        words, sbytes = {}, {}
        for (reg, pos), idx in sl.thread_view(variant.codes, tile.shape, warp, lane).items():
            words[reg] = words.get(reg, 0) | int(tile[idx]) << (8 * pos)
        for key, idx in sl.thread_view(variant.scales, s_tile.shape, warp, lane).items():
            sbytes[key] = s_tile[idx]
        a = sl.thread_view(mgpu.WGMMA_LAYOUT, (sl.WG_ROWS, tile_k), warp, lane)
        for dst, (src, sel, skey) in plan.items():
            factor = _scale_factor(sbytes[skey]).astype(np.float64)
            for v, val in enumerate(_decode_word(np.array([words[src]], np.uint64), sel)):
                got[a[(dst, v)]] = val[0] * factor
    np.testing.assert_array_equal(got, want[rows])
    interp = sd.decode_tile(variant, jnp.asarray(tile), jnp.asarray(s_tile), interpret=True)
    np.testing.assert_array_equal(np.asarray(interp, np.float64), want)


@pytest.mark.parametrize("m", [8, 16, 40, 64])
@pytest.mark.parametrize("variant", list(sl.VARIANTS.values()), ids=list(sl.VARIANTS))
def test_store_emulated_for_every_thread(variant, m):
    """The transposed store, emulated for all threads with thread 0's renaming: output
    (mm, n) receives accumulator element (row⁻¹(n), mm), every element exactly once."""
    acc = np.arange(sl.WG_ROWS * m, dtype=np.float64).reshape(sl.WG_ROWS, m)
    plan = sl.store_plan(variant, m)
    out = np.full((m, sl.WG_ROWS), np.nan)
    for warp, lane in _threads():
        a = sl.thread_view(mgpu.WGMMA_LAYOUT, (sl.WG_ROWS, m), warp, lane)
        o = sl.thread_view(variant.out, (m, sl.WG_ROWS), warp, lane)
        for dst, srcs in plan.items():
            for pos, src in enumerate(srcs):
                assert np.isnan(out[o[(dst, pos)]])
                out[o[(dst, pos)]] = acc[a[src]]
    rows = [variant.row(r) for r in range(sl.WG_ROWS)]
    np.testing.assert_array_equal(out[:, rows], acc.T)


@pytest.mark.parametrize("variant", list(sl.VARIANTS.values()), ids=list(sl.VARIANTS))
def test_code_loads_are_bank_conflict_free(variant):
    """Under the 128-byte swizzle of the code tile (8-row × 128-byte tiles), the 32
    lanes of a warp read 32 different banks with every 32-bit load."""
    shape = variant.codes_shape(128)
    for warp in range(4):
        views = [sl.thread_view(variant.codes, shape, warp, lane) for lane in range(32)]
        for reg in {r for r, _ in views[0]}:
            banks = set()
            for v in views:
                row, col = v[(reg, 0)]
                chunk = ((col % 128) // 16) ^ (row % 8)  # the 16-byte chunk after the swizzle
                banks.add((4 * chunk + (col % 16) // 4) % 32)
            assert len(banks) == 32, (warp, reg)


def _wide_normal(shape, seed):
    """Normal values over 12 binades."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    return jax.random.normal(k1, shape) * jnp.exp2(jax.random.uniform(k2, shape, minval=-6,
                                                                      maxval=6))


def _operands(m, n, k, *, layout="fprop", exact=False, seed=0):
    """(X or dY rowwise, W or W.mT in 16×16 tiles) with output (m, n), contraction k.

    ``exact``: `gemm_data.exact_sum_data` (codes on the grid, scales differing per 16×16
    tile, every float32 sum exact for K <= 512). Else: `_wide_normal`.
    """
    data = gemm_data.exact_sum_data if exact else _wide_normal
    return gemm_data.layout_operands(quantize, layout, m, n, k, seed=seed, data=data)[:2]


def _check(r, exact, dtype, k=512):
    assert r["shape_ok"] and r["finite"], r
    if exact:
        assert r["bitwise"], r
    elif dtype == "float32":  # float32 sums in another order: ~sqrt(K) roundings
        assert r["rel"] <= 4 * np.sqrt(k) * 2.0**-24, r
    else:  # a float32 sum-order difference may flip one rounding
        assert r["max_rel_elem"] <= 2.0**-7, r


# ----------------------------------------------------------------------------------------
# CPU / CI: interpret mode, in a subprocess.
# ----------------------------------------------------------------------------------------

# name -> ((m, n, k), exact inputs, preferred_element_type, config): several column
# tiles and K splits per persistent CTA, several K steps, M padded to a multiple of 8.
INTERPRET_CASES = {
    "m16_splitk_f32": ((16, 512, 512), "fprop", False, "float32",
                       SkinnyConfig(k_splits=2, num_sms=2, max_concurrent_steps=2)),
    "m48_exact": ((48, 256, 512), "fprop", True, "float32", SkinnyConfig(k_splits=2, num_sms=2)),
    "m1_bf16_substeps": ((1, 256, 256), "fprop", False, "bfloat16",
                         SkinnyConfig(k_splits=1, num_sms=2, k_substeps=2)),
    "m7_f16_tk256": ((7, 256, 256), "fprop", False, "float16",
                     SkinnyConfig(tile_k=256, k_splits=1, num_sms=1)),
    "dgrad_m16_splitk_f32": ((16, 512, 512), "dgrad", False, "float32",
                             SkinnyConfig(k_splits=2, num_sms=2, max_concurrent_steps=2)),
    "dgrad_m33_exact_bf16_substeps": ((33, 256, 256), "dgrad", True, "bfloat16",
                                      SkinnyConfig(tile_k=256, k_splits=1, num_sms=1,
                                                   k_substeps=2)),
}


def _run_case(name):
    (m, n, k), layout, exact, dtype, cfg = INTERPRET_CASES[name]
    lhs, rhs = _operands(m, n, k, layout=layout, exact=exact)
    return interpreted_gemm_vs_reference(lhs, rhs, dtype, cfg)


@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpret_matches_reference(name):
    _, _, exact, dtype, _ = INTERPRET_CASES[name]
    _check(interpret_worker_results(__file__)[name], exact, dtype)


def _abstract(m, n, k, layout="fprop"):
    return jax.eval_shape(lambda: _operands(m, n, k, layout=layout))


def _lowered(lhs, rhs, **kw) -> str:
    f = jax.jit(functools.partial(gemm.matmul, **kw))
    return f.trace(lhs, rhs).lower(lowering_platforms=("cuda",)).as_text()


def test_lowers_for_cuda():
    """The Mosaic GPU lowering (layouts, register renamings, transforms, TMA boxes)
    runs on a CPU host for the decode shapes, padded M, both layouts, every output
    dtype and both tile sizes."""
    for (m, n, k), layout, dtype, cfg in [
        ((16, 8192, 8192), "fprop", jnp.bfloat16, None),
        ((64, 8192, 8192), "fprop", jnp.float32, None),
        ((16, 8192, 8192), "dgrad", jnp.bfloat16, None),
        ((1, 512, 1024), "fprop", jnp.float16, SkinnyConfig(k_splits=1, max_concurrent_steps=2)),
        ((40, 256, 1024), "fprop", jnp.float32, SkinnyConfig(tile_k=256, k_splits=2)),
        ((5, 256, 1024), "dgrad", jnp.float16, SkinnyConfig(tile_k=256, k_splits=2)),
        ((16, 1024, 1024), "fprop", jnp.bfloat16, SkinnyConfig(k_substeps=2, k_splits=2)),
        ((16, 1024, 1024), "dgrad", jnp.bfloat16,
         SkinnyConfig(tile_k=256, k_substeps=2, k_splits=2, max_concurrent_steps=4)),
    ]:
        assert "fp4jax_gemm_skinny" in _lowered(*_abstract(m, n, k, layout), config=cfg,
                                                preferred_element_type=dtype)


def test_dispatch():
    """The default takes the skinny kernel for M <= 64 with a 16×16-tiled 2D weight
    (fprop W, dgrad W.mT), and the general kernel otherwise (1D-blocked weight, M > 64,
    N not a multiple of 256); `supports` takes all of them."""
    x, w = jax.ShapeDtypeStruct((16, 512), jnp.float32), jax.ShapeDtypeStruct((512, 512),
                                                                            jnp.float32)
    qx, qw, qw_t, qw_1d = jax.eval_shape(lambda a, b: (
        quantize(a), quantize(b, axis=0, block_2d=True),
        quantize(b, axis=0, block_2d=True).mT, quantize(b, axis=0)), x, w)
    for rhs, skinny in ((qw, True), (qw_t, True), (qw_1d, False)):
        assert gemm.supports(qx, rhs) is None
        assert ("fp4jax_gemm_skinny" in _lowered(qx, rhs)) == skinny
    for m, n in ((128, 512), (16, 384)):
        lhs, rhs = _abstract(m, n, 512)
        assert gemm.supports(lhs, rhs) is None
        assert "fp4jax_gemm_skinny" not in _lowered(lhs, rhs)


def test_default_config_takes_the_skinny_kernel():
    lhs, rhs = _abstract(16, 8192, 8192)
    cfg = default_config(16, 8192, 8192)
    assert isinstance(cfg, SkinnyConfig) and gemm_skinny.unsupported(lhs, rhs, cfg) is None
    assert cfg.k_splits * 8192 // cfg.cta_tile_n <= 132
    assert not isinstance(default_config(16, 8192, 8192, skinny=False), SkinnyConfig)
    assert not isinstance(default_config(128, 8192, 8192), SkinnyConfig)
    assert not isinstance(default_config(16, 8192 + 128, 8192), SkinnyConfig)  # N % 256


@pytest.mark.parametrize("mnk, layout, cfg, match", [
    ((16, 512, 1024), "fprop", SkinnyConfig(k_splits=16), "tile_k·k_splits"),
    ((16, 384, 1024), "fprop", SkinnyConfig(), "multiple of 256"),
    ((128, 512, 1024), "fprop", SkinnyConfig(), "M <= 64"),
    ((16, 512, 1024), "dgrad", SkinnyConfig(k_splits=8), "multiple of 256"),
    ((16, 512, 1024), "dgrad", SkinnyConfig(k_substeps=2, k_splits=1), "whole 128-byte rows"),
    ((16, 512, 1024), "dgrad", SkinnyConfig(tile_k=512, k_splits=1), "at most 256"),
])
def test_shapes_the_skinny_kernel_cannot_take(mnk, layout, cfg, match):
    """An explicit SkinnyConfig the operands do not fit raises `supports`' reason."""
    lhs, rhs = _abstract(*mnk, layout)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(functools.partial(gemm.matmul, config=cfg), lhs, rhs)


def test_config_validation():
    with pytest.raises(ValueError, match="tile_k"):
        SkinnyConfig(tile_k=64)
    with pytest.raises(ValueError, match="k_splits"):
        SkinnyConfig(k_splits=0)
    with pytest.raises(ValueError, match="k_substeps"):
        SkinnyConfig(tile_k=128, k_substeps=4)


# ----------------------------------------------------------------------------------------
# GPU: the compiled kernel.
# ----------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not _ON_GPU, reason="needs a GPU")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fprop", "dgrad"])
@pytest.mark.parametrize("mnk", [
    (16, 8192, 8192), (64, 8192, 8192), (1, 2048, 2048), (7, 1024, 4096), (33, 512, 1024)])
def test_gpu_matches_reference(layout, mnk):
    """The default (skinny) kernel at the decode shapes and odd M: float32 output within
    summation order of the reference, every element written; BF16 and float16 outputs
    are the float32 result rounded once (bitwise)."""
    lhs, rhs = _operands(*mnk, layout=layout, seed=sum(mnk))
    want = jax.jit(ref_matmul)(lhs, rhs)
    nan_poison_allocator(16 * mnk[0] * mnk[1])
    got = gemm.matmul(lhs, rhs)
    _check(compare_outputs(got, want), False, "float32", mnk[2])
    for dtype in (jnp.bfloat16, jnp.float16):
        nan_poison_allocator(16 * mnk[0] * mnk[1])
        r = compare_outputs(gemm.matmul(lhs, rhs, preferred_element_type=dtype), got.astype(dtype))
        assert r["bitwise"], (dtype, r)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fprop", "dgrad"])
@pytest.mark.parametrize("m, cfg, dtype", [
    (16, SkinnyConfig(k_splits=1), "float32"), (40, SkinnyConfig(k_splits=2), "bfloat16"),
    (64, SkinnyConfig(tile_k=256, k_splits=1, max_concurrent_steps=3), "float32"),
    (1, None, "float16"),
    (24, SkinnyConfig(tile_k=256, k_substeps=2, k_splits=1, max_concurrent_steps=3),
     "float32"),
])
def test_gpu_bitwise_when_sums_are_exact(layout, m, cfg, dtype):
    """Bit for bit the XLA path when every float32 sum is exact (scales differing from
    tile to tile), for both tile sizes, split K, padded M and every output dtype."""
    lhs, rhs = _operands(m, 1024, 512, layout=layout, exact=True)
    want = jax.jit(functools.partial(ref_matmul, preferred_element_type=dtype))(lhs, rhs)
    nan_poison_allocator(16 * m * 1024)
    got = gemm.matmul(lhs, rhs, config=cfg, preferred_element_type=dtype)
    _check(compare_outputs(got, want), True, dtype)


if __name__ == "__main__":
    worker_main(INTERPRET_CASES, _run_case)
