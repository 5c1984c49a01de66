"""Bit-exactness of the single-output quantize kernel (`pallas_kernels.quantize_single`)
against the reference `fp4jax.reference.quantization.quantize`, and its `supports`.

CPU/CI: the kernel runs in Mosaic GPU interpret mode on small shapes (one or two tiles).
GPU (``-m gpu``, skipped without a GPU): the compiled kernel at several shapes, outputs
poisoned first, compared bit for bit with the reference on the same device and on CPU.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4jax.reference.quantization import quantize as ref_quantize
from pallas_kernels import quantize_single as qs
from tests.kernels.nvfp4_bits import ON_GPU, assert_same, data, on_cpu, poison_allocator

_KEY = jax.random.key(7)

# ----------------------------------------------------------------------------------------
# CPU / CI: interpret mode (small shapes; the interpreter is slow).
# ----------------------------------------------------------------------------------------

INTERPRET_CASES = [
    # (name, shape, nonfinite, kwargs): together with the two-output test and SR_CASES
    # they cover both engines, both amax passes, the RHT, 2D blocks, SR, batch dims,
    # given/computed amax and non-finite inputs. The SR cases run on several tiles at odd
    # multiples of the tile: rowwise 4 tiles of 16x384 (24 blocks per tile row),
    # columnwise-RHT 2 x 5 tiles of 64x128.
    ("row_sr_batched_nonfinite_amax_given", (2, 32, 384), True,
     {"rounding": "stochastic", "key": _KEY, "amax": jnp.float32(300.0)}),
    ("col_rht_sr", (128, 640), False,
     {"axis": 0, "hadamard": True, "rounding": "stochastic", "key": _KEY}),
    ("col_2d", (64, 128), True, {"axis": 0, "block_2d": True}),
    ("row_2d", (32, 128), False, {"block_2d": True}),
]


@pytest.mark.parametrize("name,shape,nonfinite,kw", INTERPRET_CASES,
                         ids=[c[0] for c in INTERPRET_CASES])
def test_interpret_matches_reference(name, shape, nonfinite, kw):
    x = data(shape)
    if nonfinite:
        flat = x.reshape(-1, shape[-1]).at[5, 7].set(jnp.nan).at[6, 9].set(-jnp.inf)
        x = flat.reshape(shape)
    assert_same(qs.quantize(x, interpret=True, **kw), ref_quantize(x, **kw), name)


_SR = {"rounding": "stochastic", "key": jax.random.key(11)}
SR_CASES = [
    # (name, shape, dtype, kwargs): the SR paths INTERPRET_CASES leaves out, on several
    # tiles, so that both the in-tile block numbers and the tile origins' are checked
    # (the two-output test adds the rowwise engine on several tiles along K).
    # Columnwise without the RHT, batched: the block numbers continue across the batch
    # (grid (2, 4, 256)); 2 x 2 tiles of 64x128.
    ("col_batched_2x64x256", (2, 64, 256), jnp.bfloat16, {"axis": 1}),
    # The RHT along the last axis runs on x.T (2 x 2 tiles there): blocks remapped to x's.
    ("row_rht_on_xT_256x128_f16", (256, 128), jnp.float16, {"hadamard": True}),
]


@pytest.mark.parametrize("name,shape,dtype,kw", SR_CASES, ids=[c[0] for c in SR_CASES])
def test_interpret_sr_is_the_reference_bitwise(name, shape, dtype, kw):
    """Stochastic rounding in the kernel draws the reference's random bits for every
    element (docs/RECIPE.md §5), so codes, scales and amax are bit-identical. (The amax
    is given, as from a cross-device reduction, to skip the amax pass: it does not
    depend on the rounding and is tested above.)"""
    x = data(shape, dtype, seed=2)
    kw = {**kw, **_SR}
    ref = ref_quantize(x, **kw)
    assert_same(qs.quantize(x, amax=ref.amax, interpret=True, **kw), ref, name)


_KERNEL_AMAX = dataclasses.replace(qs.COLUMNWISE_CONFIG, xla_amax_elements=0)


@pytest.mark.parametrize("bad", [(), (jnp.nan, -jnp.inf)], ids=["finite", "nonfinite"])
def test_plain_amax_in_xla_is_the_kernels_bitwise(bad):
    """The unrotated global amax of a small input is reduced by XLA (`amax.plain_amax`'s
    size rule), of a large one by the amax kernel: both give the same finite maximum and
    non-finite flag, so the quantization (here the weights' 16x16 tiles) is the
    reference's either way."""
    from pallas_kernels import amax as amax_pass

    x = data((64, 128), seed=9)
    for i, v in enumerate(bad):
        x = x.at[5 + i, 7 + 2 * i].set(v)
    xla = amax_pass.plain_amax(x, qs.COLUMNWISE_CONFIG, True)
    kernel = amax_pass.plain_amax(x, _KERNEL_AMAX, True)
    np.testing.assert_array_equal(np.asarray(xla[0]).view(np.uint32),
                                  np.asarray(kernel[0]).view(np.uint32))
    assert bool(xla[1]) == bool(kernel[1]) == bool(bad)
    ref = ref_quantize(x, axis=0, block_2d=True)
    for cfg in (qs.COLUMNWISE_CONFIG, _KERNEL_AMAX):
        got = qs.quantize(x, axis=0, block_2d=True, config=cfg, interpret=True)
        assert_same(got, ref, f"xla_amax_elements={cfg.xla_amax_elements}")


def test_sr_block_count_limit_is_the_reference_one():
    """More than 2**30 blocks: SR raises ValueError (the uint32 block counter), as the
    reference; exactly 2**30 blocks are taken. Traced only (no memory is allocated)."""
    fine = jax.ShapeDtypeStruct((2**16, 2**18), jnp.bfloat16)  # 2**30 blocks
    big = jax.ShapeDtypeStruct((2**16 + 16, 2**18), jnp.bfloat16)
    run = functools.partial(qs.quantize, **_SR)
    assert jax.eval_shape(run, fine).shape == fine.shape
    assert jax.eval_shape(qs.quantize, big).shape == big.shape  # RNE: no counter
    for f in (run, functools.partial(ref_quantize, **_SR)):
        with pytest.raises(ValueError, match="uint32 counter"):
            jax.eval_shape(f, big)


# --- supports(): the predicate and the wrapper agree. ---------------------------------

_BF16, _F16, _F32 = jnp.bfloat16, jnp.float16, jnp.float32
SUPPORTS_CASES = [
    # (shape, dtype, axis, block_2d, hadamard, supported)
    ((64, 128), _BF16, -1, False, False, True),
    ((2, 16, 128), _F16, -1, True, False, True),
    ((64, 256), _BF16, 0, False, True, True),
    ((128, 64), _BF16, -1, False, True, True),  # RHT along the last axis, on x.T
    ((64, 100), _BF16, -1, False, False, False),  # K not a multiple of 128
    ((32, 128), _BF16, 0, False, False, False),  # columnwise needs M % 64
    ((64, 128), _F32, -1, False, False, False),  # float32: not a 16-bit word pair
    ((2, 64, 128), _BF16, 0, False, False, False),  # not one of the last two axes
    ((64, 128), _BF16, -1, False, True, False),  # RHT along the last axis needs M % 128
    ((128,), _BF16, -1, False, False, False),  # rank 1
]


@pytest.mark.parametrize("shape,dtype,axis,block_2d,hadamard,supported", SUPPORTS_CASES)
def test_supports_agrees_with_the_wrapper(shape, dtype, axis, block_2d, hadamard, supported):
    """None for shapes the kernel takes (the wrapper traces), else a one-line reason naming
    the shape, which is exactly the wrapper's ValueError."""
    kw = {"axis": axis, "block_2d": block_2d, "hadamard": hadamard}
    reason = qs.supports(shape, dtype, **kw)
    run = functools.partial(qs.quantize, **kw)
    if supported:
        assert reason is None
        assert jax.eval_shape(run, jax.ShapeDtypeStruct(shape, dtype)).shape == shape
    else:
        assert isinstance(reason, str) and "\n" not in reason and str(shape) in reason
        with pytest.raises(ValueError) as err:
            run(jnp.zeros(shape, dtype))
        assert str(err.value) == reason


@pytest.mark.parametrize(
    "shape,dtype,kw,match",
    [
        ((64, 100), jnp.bfloat16, {}, "multiple of 128"),
        ((24, 128), jnp.bfloat16, {}, "multiple of 16"),
        ((32, 128), jnp.bfloat16, {"axis": 0}, "multiple of\n?.*64|64"),
        ((64, 128), jnp.float32, {}, "bfloat16 or float16"),
        ((128,), jnp.bfloat16, {}, "rank >= 2"),
        ((2, 64, 128), jnp.bfloat16, {"axis": 0}, "last two axes"),
        ((64, 128), jnp.bfloat16, {"hadamard": True, "block_2d": True}, "cannot be combined"),
        ((64, 128), jnp.bfloat16, {"rounding": "stochastic"}, "key"),
        ((64, 128), jnp.bfloat16, {"rounding": "up"}, "rounding"),
    ],
)
def test_value_errors(shape, dtype, kw, match):
    with pytest.raises(ValueError, match=match):
        qs.quantize(jnp.zeros(shape, dtype), interpret=True, **kw)


def test_non_float_input_is_a_type_error_as_in_the_reference():
    with pytest.raises(TypeError, match="x has dtype int32"):
        qs.quantize(jnp.zeros((64, 128), jnp.int32), interpret=True)


def test_config_validation():
    with pytest.raises(ValueError):
        qs.QuantizeConfig(block_cols=100)
    with pytest.raises(ValueError):
        qs.QuantizeConfig(stages=0)
    with pytest.raises(ValueError, match="xla_amax_elements"):
        qs.QuantizeConfig(xla_amax_elements=-1)
    with pytest.raises(ValueError, match="multiple of 64"):  # narrow tiles hold 4 row groups
        qs.QuantizeConfig(block_rows=16, block_cols=64)
    assert qs.QuantizeConfig(block_rows=128, block_cols=64).block_cols == 64


# ----------------------------------------------------------------------------------------
# GPU: compiled kernel, bit-exact vs the reference on the same device and on CPU.
# ----------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
GPU_SHAPES = [(384, 640), (1152, 896), (8192, 8192)]

GPU_MODES = {
    "row_rne": {},
    "row_sr": {"rounding": "stochastic", "key": _KEY},
    "col_rht_rne": {"axis": 0, "hadamard": True},
    "col_rht_sr": {"axis": 0, "hadamard": True, "rounding": "stochastic", "key": _KEY},
    "row_2d": {"block_2d": True},
    "col_2d": {"axis": 0, "block_2d": True},
    "col_sr": {"axis": 0, "rounding": "stochastic", "key": _KEY},
    "row_rht": {"hadamard": True},
    "row_rht_sr": {"hadamard": True, "rounding": "stochastic", "key": _KEY},
    "row_2d_sr": {"block_2d": True, "rounding": "stochastic", "key": _KEY},
}


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mode", list(GPU_MODES))
def test_gpu_quantize(shape, mode):
    kw = GPU_MODES[mode]
    x = data(shape, seed=3)
    ref_gpu = jax.jit(functools.partial(ref_quantize, **kw))(x)
    poison_allocator(4 * x.size)
    q = jax.jit(functools.partial(qs.quantize, **kw))(x)
    if shape[0] * shape[1] <= 1152 * 896 or mode in ("row_rne", "col_rht_sr"):
        ref_cpu = on_cpu(functools.partial(ref_quantize, **kw), x)
        assert_same(q, ref_cpu, f"{mode} {shape} vs CPU reference")
    assert_same(q, ref_gpu, f"{mode} {shape} vs GPU reference")
    given = jax.jit(functools.partial(qs.quantize, amax=ref_gpu.amax, **kw))(x)
    assert_same(given, ref_gpu, f"{mode} {shape} amax given")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["row_rne", "row_sr", "row_2d", "col_rht_sr", "col_2d"])
def test_gpu_narrow_tiles(mode):
    """The single-output kernels on narrow 64 × 64 tiles (their register layouts differ:
    `tma_pipeline.engine_layouts`) give the reference's bits, amax computed and given."""
    kw = GPU_MODES[mode]
    x = data((384, 640), seed=7)
    cfg = dataclasses.replace(qs.COLUMNWISE_CONFIG, block_cols=64, ctas_per_sm=4)
    ref = jax.jit(functools.partial(ref_quantize, **kw))(x)
    poison_allocator(4 * x.size)
    assert_same(jax.jit(functools.partial(qs.quantize, config=cfg, **kw))(x), ref, mode)
    given = jax.jit(functools.partial(qs.quantize, config=cfg, amax=ref.amax, **kw))(x)
    assert_same(given, ref, f"{mode} amax given")


@gpu
@pytest.mark.gpu
def test_gpu_float16_and_nonfinite():
    x = data((384, 640), jnp.float16, seed=5)
    for kw in ({"rounding": "stochastic", "key": _KEY}, {"axis": 0, "hadamard": True}):
        assert_same(jax.jit(functools.partial(qs.quantize, **kw))(x),
                    on_cpu(functools.partial(ref_quantize, **kw), x), f"f16 {kw}")
    y = data((384, 640), seed=6).at[5, 7].set(jnp.nan).at[100, 9].set(-jnp.inf)
    for kw in ({}, {"amax": jnp.float32(50.0)}, {"axis": 0, "hadamard": True}):
        assert_same(jax.jit(functools.partial(qs.quantize, **kw))(y),
                    on_cpu(functools.partial(ref_quantize, **kw), y), f"nonfinite {kw}")


@gpu
@pytest.mark.gpu
def test_gpu_sr_same_key_same_bits():
    x = data((1152, 896), seed=8)
    f = jax.jit(functools.partial(qs.quantize, axis=0, hadamard=True, rounding="stochastic"))
    a, b = f(x, key=jax.random.key(11)), f(x, key=jax.random.key(11))
    c = f(x, key=jax.random.key(12))
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    assert (np.asarray(a.data) != np.asarray(c.data)).any()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(384, 640), (1152, 896)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_columnwise_sr_report(shape, capsys):
    """Locates columnwise-SR mismatches (if any): per 64x128 tile, and whether the GPU
    reference itself equals the CPU one. Prints a report (run with -s to see it)."""
    x = data(shape, seed=3)
    kw = {"axis": 0, "hadamard": True, "rounding": "stochastic", "key": _KEY}
    q = jax.jit(functools.partial(qs.quantize, **kw))(x)
    r_gpu = jax.jit(functools.partial(ref_quantize, **kw))(x)
    r_cpu = on_cpu(functools.partial(ref_quantize, **kw), x)
    codes = {n: np.asarray(a.codes()) for n, a in (("kernel", q), ("gpu", r_gpu), ("cpu", r_cpu))}
    rne = np.asarray(jax.jit(functools.partial(qs.quantize, axis=0, hadamard=True))(x).codes())
    bad = np.argwhere(codes["kernel"] != codes["cpu"])
    tiles = sorted({(int(i) // 64, int(j) // 128) for i, j in bad})
    there = [(int(codes["kernel"][i, j]), int(codes["cpu"][i, j]), int(rne[i, j]))
             for i, j in bad[:6]]
    with capsys.disabled():
        print(f"\n[{shape}] kernel!=cpu: {len(bad)}, kernel!=gpu_ref: "
              f"{int((codes['kernel'] != codes['gpu']).sum())}, gpu_ref!=cpu: "
              f"{int((codes['gpu'] != codes['cpu']).sum())}, tiles {tiles[:8]}, "
              f"first {bad[:6].tolist()}, kernel/cpu/rne codes there: {there}")
    assert len(bad) == 0


def test_sr_paths_lower_for_cuda():
    """The Mosaic GPU lowering of both engines' SR (register layouts of the block-reduced
    hashes, their broadcast and word selection), alone and together, runs on a CPU host:
    interpret mode ignores layouts, so this catches what it cannot."""
    from pallas_kernels import quantize_two_output as q2

    sds = jax.ShapeDtypeStruct
    for shape, kw in (((64, 384), {}), ((128, 640), {"axis": 0, "hadamard": True})):
        f = jax.jit(functools.partial(qs.quantize, **kw, **_SR))
        f.trace(sds(shape, jnp.bfloat16)).lower(lowering_platforms=("cuda",))
    f = jax.jit(functools.partial(q2.quantize_rowwise_columnwise, rounding="stochastic",
                                  row_key=_KEY, col_key=_KEY))
    f.trace(sds((128, 640), jnp.bfloat16)).lower(lowering_platforms=("cuda",))
