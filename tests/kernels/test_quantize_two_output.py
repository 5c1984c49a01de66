"""Bit-exactness of the two-output quantize kernel (`pallas_kernels.quantize_two_output`:
rowwise + columnwise-RHT copies from one read) against two reference quantizes, and its
`supports`.

CPU/CI: interpret mode on one small shape. GPU (``-m gpu``, skipped without a GPU): the
compiled kernel at several shapes, outputs poisoned first.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import quantize_two_output as q2
from tests.kernels.nvfp4_bits import ON_GPU, assert_same, data, on_cpu, poison_allocator


def test_interpret_two_output_sr():
    x = data((64, 128), seed=1)
    kw = {"rounding": "stochastic", "row_key": jax.random.key(1), "col_key": jax.random.key(2)}
    rows, cols = q2.quantize_rowwise_columnwise(x, interpret=True, **kw)
    ref_rows, ref_cols = q2.reference(x, **kw)
    assert_same(rows, ref_rows, "rowwise")
    assert_same(cols, ref_cols, "columnwise")


def test_interpret_two_output_sr_on_several_tiles():
    """SR bits of both copies on 2 x 5 tiles of 64x128 (K = 640: 40 rowwise blocks per row,
    tile origins along both axes), amaxes given: bit-identical to the reference."""
    x = data((128, 640), seed=5)
    kw = {"rounding": "stochastic", "row_key": jax.random.key(3), "col_key": jax.random.key(4)}
    ref_rows, ref_cols = q2.reference(x, **kw)
    rows, cols = q2.quantize_rowwise_columnwise(x, row_amax=ref_rows.amax,
                                                col_amax=ref_cols.amax, interpret=True, **kw)
    assert_same(rows, ref_rows, "rowwise")
    assert_same(cols, ref_cols, "columnwise")


@pytest.mark.parametrize("shape,dtype,supported", [
    ((64, 128), jnp.bfloat16, True),
    ((128, 256), jnp.float16, True),
    ((2, 64, 128), jnp.bfloat16, False),  # batched: 2D only
    ((48, 128), jnp.bfloat16, False),  # M not a multiple of 64
    ((64, 128), jnp.float32, False),
])
def test_supports_agrees_with_the_wrapper(shape, dtype, supported):
    """None for shapes the kernel takes (the wrapper traces), else a one-line reason naming
    the shape, which is exactly the wrapper's ValueError."""
    reason = q2.supports(shape, dtype)
    if supported:
        assert reason is None
        abstract = jax.ShapeDtypeStruct(shape, dtype)
        row, col = jax.eval_shape(q2.quantize_rowwise_columnwise, abstract)
        assert row.shape == col.shape == shape
    else:
        assert isinstance(reason, str) and "\n" not in reason and str(shape) in reason
        with pytest.raises(ValueError) as err:
            q2.quantize_rowwise_columnwise(jnp.zeros(shape, dtype), interpret=True)
        assert str(err.value) == reason


def test_two_output_value_errors():
    with pytest.raises(ValueError, match="2D"):
        q2.quantize_rowwise_columnwise(jnp.zeros((2, 64, 128), jnp.bfloat16), interpret=True)
    with pytest.raises(ValueError, match="64"):
        q2.quantize_rowwise_columnwise(jnp.zeros((48, 128), jnp.bfloat16), interpret=True)
    with pytest.raises(ValueError, match="row_key"):
        q2.quantize_rowwise_columnwise(jnp.zeros((64, 128), jnp.bfloat16), rounding="stochastic",
                                       interpret=True)
    with pytest.raises(TypeError, match="col_key"):
        q2.quantize_rowwise_columnwise(jnp.zeros((64, 128), jnp.bfloat16), col_key=3,
                                       interpret=True)


gpu = pytest.mark.skipif(not ON_GPU, reason="needs a GPU")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(384, 640), (1152, 896), (8192, 8192)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_gpu_two_output(shape, rounding):
    x = data(shape, seed=4)
    kw = {"rounding": rounding, "row_key": jax.random.key(1), "col_key": jax.random.key(2)}
    ref = jax.jit(functools.partial(q2.reference, **kw))(x)
    poison_allocator(4 * x.size)
    got = jax.jit(functools.partial(q2.quantize_rowwise_columnwise, **kw))(x)
    for g, r, what in zip(got, ref, ("rowwise", "columnwise")):
        assert_same(g, r, f"{what} {shape} {rounding} vs GPU reference")
    if shape == (384, 640):
        for g, r in zip(got, on_cpu(functools.partial(q2.reference, **kw), x)):
            assert_same(g, r, f"{shape} vs CPU")


def _assert_decoded(got, want_rows, what: str):
    """``got`` (a DecodedNVFP4) holds the reference rowwise copy's BF16 ``code · s`` bit for
    bit (NaN blocks: NaN) and its amax."""
    from fp4jax.reference import quantization

    want = quantization.decoded(want_rows)
    g = np.asarray(got.values).view(np.uint16)
    w = np.asarray(want.values).view(np.uint16)
    nan = np.isnan(np.asarray(want.values, np.float32))
    assert np.array_equal(np.isnan(np.asarray(got.values, np.float32)), nan), what
    assert np.array_equal(g[~nan], w[~nan]), f"{what}: {(g != w).sum()} of {g.size} differ"
    assert np.array_equal(np.asarray(got.amax), np.asarray(want.amax), equal_nan=True), what


@pytest.mark.parametrize("rounding", ["stochastic"])  # the decode follows any rounding
def test_interpret_decoded_rowwise_is_the_reference_decoded(rounding):
    """``row_decoded``: the rowwise copy comes as BF16 ``code · s`` (zeros, -0, tiny values,
    2 x 2 tiles) equal to decoding the reference's rowwise copy, and the columnwise copy is
    unchanged; with a NaN in the input and the amaxes given, as the reference: the NaN
    counts as zero in its block and the amax is NaN (which makes the GEMM's output NaN)."""
    x = data((128, 256), seed=6)
    kw = {"rounding": rounding, "row_key": jax.random.key(5), "col_key": jax.random.key(6)}
    ref_rows, ref_cols = q2.reference(x, **kw)
    rows, cols = q2.quantize_rowwise_columnwise(x, row_decoded=True, interpret=True, **kw)
    _assert_decoded(rows, ref_rows, f"{rounding} rowwise")
    assert_same(cols, ref_cols, f"{rounding} columnwise")
    bad = x.at[70, 33].set(jnp.nan)
    amaxes = {"row_amax": ref_rows.amax, "col_amax": ref_cols.amax}
    rows, _ = q2.quantize_rowwise_columnwise(bad, row_decoded=True, interpret=True, **amaxes,
                                             **kw)
    assert np.isnan(np.asarray(rows.amax))
    _assert_decoded(rows, q2.reference(bad, **amaxes, **kw)[0], f"{rounding} NaN input")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(384, 640), (1152, 896)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_gpu_decoded_rowwise(shape, rounding):
    """Compiled: the decoded rowwise copy equals the decoded GPU reference and the CPU one."""
    x = data(shape, seed=7)
    kw = {"rounding": rounding, "row_key": jax.random.key(1), "col_key": jax.random.key(2)}
    ref_rows, ref_cols = jax.jit(functools.partial(q2.reference, **kw))(x)
    poison_allocator(4 * x.size)
    rows, cols = jax.jit(functools.partial(q2.quantize_rowwise_columnwise, row_decoded=True,
                                           **kw))(x)
    _assert_decoded(rows, ref_rows, f"{shape} {rounding} vs GPU reference")
    assert_same(cols, ref_cols, f"columnwise {shape} {rounding}")
    _assert_decoded(rows, on_cpu(functools.partial(q2.reference, **kw), x)[0], "vs CPU")
