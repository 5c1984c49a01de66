"""Bit-exactness of the Mosaic GPU NVFP4 quantize kernels against `fp4jax.quantize`.

CPU/CI: the kernels run in Mosaic GPU interpret mode on small shapes (one or two tiles).
GPU (``-m gpu``, skipped without a GPU): the compiled kernels at several shapes, outputs
poisoned first, compared bit for bit with the reference on the same device and on CPU.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from pallas_kernels import quantize as qk

_ON_GPU = jax.devices()[0].platform == "gpu"


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


def _mismatch(a, b) -> str:
    a, b = _bits(a), _bits(b)
    bad = np.argwhere(a != b)
    return f"{len(bad)} of {a.size} differ, first at {bad[:4].tolist()}"


def _assert_same(q: fp4jax.NVFP4Array, r: fp4jax.NVFP4Array, what: str = ""):
    assert (q.shape, q.axis, q.block_2d, q.hadamard, jnp.dtype(q.dtype)) == (
        r.shape, r.axis, r.block_2d, r.hadamard, jnp.dtype(r.dtype)), what
    assert q.data.shape == r.data.shape and q.scales.shape == r.scales.shape, what
    for name in ("data", "scales", "amax"):
        a, b = getattr(q, name), getattr(r, name)
        assert np.array_equal(_bits(a), _bits(b)), f"{name} {what}: {_mismatch(a, b)}"


def _data(shape, dtype=jnp.bfloat16, seed=0):
    """Wide dynamic range, zeros, -0, tiny values and a whole zero block."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(k1, shape, jnp.float32) * jnp.exp2(
        jax.random.uniform(k2, shape, minval=-10, maxval=10))
    x = x.astype(dtype)
    flat = x.reshape(-1, shape[-1])
    flat = flat.at[0, :16].set(0).at[1, 3].set(-0.0).at[2, 5].set(1e-30).at[3, 16:32].multiply(1e-5)
    return flat.reshape(shape)


# ----------------------------------------------------------------------------------------
# CPU / CI: interpret mode (small shapes; the interpreter is slow).
# ----------------------------------------------------------------------------------------

_KEY = jax.random.key(7)

INTERPRET_CASES = [
    # (name, shape, nonfinite, kwargs): together with the two-output test they cover both
    # engines, both amax passes, the RHT, 2D blocks, SR, batch dims, given/computed amax
    # and non-finite inputs. (The RHT along the last axis, run on x.T, is in GPU_MODES.)
    ("row_sr_batched_nonfinite_amax_given", (2, 16, 128), True,
     dict(rounding="stochastic", key=_KEY, amax=jnp.float32(300.0))),
    ("col_rht_sr", (64, 128), False, dict(axis=0, hadamard=True, rounding="stochastic", key=_KEY)),
    ("col_2d", (64, 128), True, dict(axis=0, block_2d=True)),
    ("row_2d", (32, 128), False, dict(block_2d=True)),
]


@pytest.mark.parametrize("name,shape,nonfinite,kw", INTERPRET_CASES,
                         ids=[c[0] for c in INTERPRET_CASES])
def test_interpret_matches_reference(name, shape, nonfinite, kw):
    x = _data(shape)
    if nonfinite:
        flat = x.reshape(-1, shape[-1]).at[5, 7].set(jnp.nan).at[6, 9].set(-jnp.inf)
        x = flat.reshape(shape)
    _assert_same(qk.quantize(x, interpret=True, **kw), fp4jax.quantize(x, **kw), name)


def test_interpret_two_output_sr():
    x = _data((64, 128), seed=1)
    kw = dict(rounding="stochastic", row_key=jax.random.key(1), col_key=jax.random.key(2))
    rows, cols = qk.quantize_rowwise_columnwise(x, interpret=True, **kw)
    ref_rows, ref_cols = qk.reference_rowwise_columnwise(x, **kw)
    _assert_same(rows, ref_rows, "rowwise")
    _assert_same(cols, ref_cols, "columnwise")


def test_sr_is_unbiased_in_distribution():
    # The kernel's SR is the reference's bit for bit (tests above); check the rounding
    # helper is unbiased: E[round(v)] == v over many counters.
    v = jnp.full((1 << 16,), 0.3, jnp.float32)
    u24 = jax.random.randint(jax.random.key(0), v.shape, 0, 1 << 24).astype(jnp.uint32)
    codes = jax.jit(qk._nibble_stochastic)(v, jnp.float32(1.0), u24)
    vals = jnp.asarray(fp4jax.formats.E2M1_VALUES)[codes]
    assert abs(float(vals.mean()) - 0.3) < 0.005


@pytest.mark.parametrize(
    "shape,dtype,kw,match",
    [
        ((64, 100), jnp.bfloat16, dict(), "multiple of 128"),
        ((24, 128), jnp.bfloat16, dict(), "multiple of 16"),
        ((32, 128), jnp.bfloat16, dict(axis=0), "multiple of\n?.*64|64"),
        ((64, 128), jnp.float32, dict(), "bfloat16 or float16"),
        ((128,), jnp.bfloat16, dict(), "rank >= 2"),
        ((2, 64, 128), jnp.bfloat16, dict(axis=0), "last two axes"),
        ((64, 128), jnp.bfloat16, dict(hadamard=True, block_2d=True), "cannot be combined"),
        ((64, 128), jnp.bfloat16, dict(rounding="stochastic"), "key"),
        ((64, 128), jnp.bfloat16, dict(rounding="up"), "rounding"),
    ],
)
def test_value_errors(shape, dtype, kw, match):
    with pytest.raises(ValueError, match=match):
        qk.quantize(jnp.zeros(shape, dtype), interpret=True, **kw)


def test_two_output_value_errors():
    with pytest.raises(ValueError, match="2D"):
        qk.quantize_rowwise_columnwise(jnp.zeros((2, 64, 128), jnp.bfloat16), interpret=True)
    with pytest.raises(ValueError, match="64"):
        qk.quantize_rowwise_columnwise(jnp.zeros((48, 128), jnp.bfloat16), interpret=True)
    with pytest.raises(ValueError, match="row_key"):
        qk.quantize_rowwise_columnwise(jnp.zeros((64, 128), jnp.bfloat16), rounding="stochastic",
                                       interpret=True)


def test_config_validation():
    with pytest.raises(ValueError):
        qk.QuantizeConfig(block_cols=100)
    with pytest.raises(ValueError):
        qk.QuantizeConfig(stages=0)


# ----------------------------------------------------------------------------------------
# GPU: compiled kernels, bit-exact vs the reference on the same device and on CPU.
# ----------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not _ON_GPU, reason="needs a GPU")
GPU_SHAPES = [(384, 640), (1152, 896), (8192, 8192)]


def _poison_allocator(nbytes: int):
    """Fills and frees device memory with a sentinel so fresh outputs start as garbage.

    Output buffers of the next call are typically carved from the freed block, so any
    element the kernel fails to write shows up as 0xA5 bytes (best effort).
    """
    junk = jnp.full((nbytes,), 0xA5, jnp.uint8)
    junk.block_until_ready()
    del junk


def _cpu(fn, *args):
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        return jax.jit(fn)(*jax.device_put(args, cpu))


GPU_MODES = {
    "row_rne": dict(),
    "row_sr": dict(rounding="stochastic", key=_KEY),
    "col_rht_rne": dict(axis=0, hadamard=True),
    "col_rht_sr": dict(axis=0, hadamard=True, rounding="stochastic", key=_KEY),
    "row_2d": dict(block_2d=True),
    "col_2d": dict(axis=0, block_2d=True),
    "col_sr": dict(axis=0, rounding="stochastic", key=_KEY),
    "row_rht": dict(hadamard=True),
}


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mode", list(GPU_MODES))
def test_gpu_quantize(shape, mode):
    kw = GPU_MODES[mode]
    x = _data(shape, seed=3)
    ref_gpu = jax.jit(functools.partial(fp4jax.quantize, **kw))(x)
    _poison_allocator(4 * x.size)
    q = jax.jit(functools.partial(qk.quantize, **kw))(x)
    if shape[0] * shape[1] <= 1152 * 896 or mode in ("row_rne", "col_rht_sr"):
        ref_cpu = _cpu(functools.partial(fp4jax.quantize, **kw), x)
        _assert_same(q, ref_cpu, f"{mode} {shape} vs CPU reference")
    _assert_same(q, ref_gpu, f"{mode} {shape} vs GPU reference")
    given = jax.jit(functools.partial(qk.quantize, amax=ref_gpu.amax, **kw))(x)
    _assert_same(given, ref_gpu, f"{mode} {shape} amax given")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_gpu_two_output(shape, rounding):
    x = _data(shape, seed=4)
    kw = dict(rounding=rounding, row_key=jax.random.key(1), col_key=jax.random.key(2))
    ref = jax.jit(functools.partial(qk.reference_rowwise_columnwise, **kw))(x)
    _poison_allocator(4 * x.size)
    got = jax.jit(functools.partial(qk.quantize_rowwise_columnwise, **kw))(x)
    for g, r, what in zip(got, ref, ("rowwise", "columnwise")):
        _assert_same(g, r, f"{what} {shape} {rounding} vs GPU reference")
    if shape == (384, 640):
        for g, r in zip(got, _cpu(functools.partial(qk.reference_rowwise_columnwise, **kw), x)):
            _assert_same(g, r, f"{shape} vs CPU")


@gpu
@pytest.mark.gpu
def test_gpu_float16_and_nonfinite():
    x = _data((384, 640), jnp.float16, seed=5)
    for kw in (dict(rounding="stochastic", key=_KEY), dict(axis=0, hadamard=True)):
        _assert_same(jax.jit(functools.partial(qk.quantize, **kw))(x),
                     _cpu(functools.partial(fp4jax.quantize, **kw), x), f"f16 {kw}")
    y = _data((384, 640), seed=6).at[5, 7].set(jnp.nan).at[100, 9].set(-jnp.inf)
    for kw in (dict(), dict(amax=jnp.float32(50.0)), dict(axis=0, hadamard=True)):
        _assert_same(jax.jit(functools.partial(qk.quantize, **kw))(y),
                     _cpu(functools.partial(fp4jax.quantize, **kw), y), f"nonfinite {kw}")


@gpu
@pytest.mark.gpu
def test_gpu_sr_same_key_same_bits():
    x = _data((1152, 896), seed=8)
    f = jax.jit(functools.partial(qk.quantize, axis=0, hadamard=True, rounding="stochastic"))
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
    x = _data(shape, seed=3)
    kw = dict(axis=0, hadamard=True, rounding="stochastic", key=_KEY)
    q = jax.jit(functools.partial(qk.quantize, **kw))(x)
    r_gpu = jax.jit(functools.partial(fp4jax.quantize, **kw))(x)
    r_cpu = _cpu(functools.partial(fp4jax.quantize, **kw), x)
    codes = {n: np.asarray(a.codes()) for n, a in (("kernel", q), ("gpu", r_gpu), ("cpu", r_cpu))}
    rne = np.asarray(jax.jit(functools.partial(qk.quantize, axis=0, hadamard=True))(x).codes())
    bad = np.argwhere(codes["kernel"] != codes["cpu"])
    tiles = sorted({(int(i) // 64, int(j) // 128) for i, j in bad})
    there = [(int(codes["kernel"][i, j]), int(codes["cpu"][i, j]), int(rne[i, j]))
             for i, j in bad[:6]]
    with capsys.disabled():
        print(f"\n[{shape}] kernel!=cpu: {len(bad)}, gpu_ref!=cpu: "
              f"{int((codes['gpu'] != codes['cpu']).sum())}, tiles {tiles[:8]}, "
              f"first {bad[:6].tolist()}, kernel/cpu/rne codes there: {there}")
    assert len(bad) == 0
