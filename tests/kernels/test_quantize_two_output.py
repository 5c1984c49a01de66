"""Bit-exactness of the two-output quantize kernel (`pallas_kernels.quantize_two_output`:
rowwise + columnwise-RHT copies from one read) against two reference quantizes, and its
`supports`.

CPU/CI: interpret mode on one small shape. GPU (``-m gpu``, skipped without a GPU): the
compiled kernel at several shapes, outputs poisoned first.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import quantize_two_output as q2
from pallas_kernels.quantize_single import TWO_OUTPUT_CONFIG
from tests.kernels.nvfp4_bits import ON_GPU, assert_same, data, on_cpu, poison_allocator

WIDE = dataclasses.replace(TWO_OUTPUT_CONFIG, block_cols=128, ctas_per_sm=2)
"""64 × 128 tiles: the wide register layouts (the default is 64 × 64, the narrow ones;
`tma_pipeline.engine_layouts`)."""


def test_interpret_two_output_sr():
    x = data((64, 128), seed=1)
    kw = {"rounding": "stochastic", "row_key": jax.random.key(1), "col_key": jax.random.key(2)}
    rows, cols = q2.quantize_rowwise_columnwise(x, interpret=True, **kw)
    ref_rows, ref_cols = q2.reference(x, **kw)
    assert_same(rows, ref_rows, "rowwise")
    assert_same(cols, ref_cols, "columnwise")


def test_interpret_two_output_sr_on_several_tiles():
    """SR bits of both copies on 2 x 10 tiles of 64x64 (K = 640: 40 rowwise blocks per row,
    tile origins along both axes), amaxes given: bit-identical to the reference."""
    x = data((128, 640), seed=5)
    kw = {"rounding": "stochastic", "row_key": jax.random.key(3), "col_key": jax.random.key(4)}
    ref_rows, ref_cols = q2.reference(x, **kw)
    rows, cols = q2.quantize_rowwise_columnwise(x, row_amax=ref_rows.amax,
                                                col_amax=ref_cols.amax, interpret=True, **kw)
    assert_same(rows, ref_rows, "rowwise")
    assert_same(cols, ref_cols, "columnwise")


def test_interpret_wide_tiles():
    """64 × 128 tiles (2 × 2 of them: SR block numbers from tile origins along both axes)
    give the reference's bits, amaxes computed."""
    x = data((128, 256), seed=6)
    kw = {"rounding": "stochastic", "row_key": jax.random.key(5), "col_key": jax.random.key(6)}
    rows, cols = q2.quantize_rowwise_columnwise(x, config=WIDE, interpret=True, **kw)
    ref_rows, ref_cols = q2.reference(x, **kw)
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
@pytest.mark.parametrize("config", [None, WIDE], ids=["default", "wide"])
def test_gpu_two_output(shape, rounding, config):
    x = data(shape, seed=4)
    kw = {"rounding": rounding, "row_key": jax.random.key(1), "col_key": jax.random.key(2)}
    ref = jax.jit(functools.partial(q2.reference, **kw))(x)
    poison_allocator(4 * x.size)
    got = jax.jit(functools.partial(q2.quantize_rowwise_columnwise, config=config, **kw))(x)
    for g, r, what in zip(got, ref, ("rowwise", "columnwise")):
        assert_same(g, r, f"{what} {shape} {rounding} vs GPU reference")
    if shape == (384, 640):
        for g, r in zip(got, on_cpu(functools.partial(q2.reference, **kw), x)):
            assert_same(g, r, f"{shape} vs CPU")


def _vmapped_equals_each_slice(shape, interpret: bool):
    """The kernel vmapped over a stack of two inputs (Mosaic GPU's batching rule: one more
    grid axis) gives each slice exactly the kernel's own result for that slice."""
    xs = jnp.stack([data(shape, seed=1), data(shape, seed=2)])
    row_keys = jax.random.split(jax.random.key(1), 2)
    col_keys = jax.random.split(jax.random.key(2), 2)

    def one(x, rk, ck):
        return q2.quantize_rowwise_columnwise(x, rounding="stochastic", row_key=rk, col_key=ck,
                                              interpret=interpret)

    rows, cols = jax.jit(jax.vmap(one))(xs, row_keys, col_keys)
    for i in range(2):
        r, c = jax.jit(one)(xs[i], row_keys[i], col_keys[i])
        assert_same(jax.tree.map(lambda a, i=i: a[i], rows), r, f"rowwise, slice {i}")
        assert_same(jax.tree.map(lambda a, i=i: a[i], cols), c, f"columnwise, slice {i}")


def test_interpret_vmapped_kernel_equals_each_slice():
    """Seed batches (`fp4jax.train.TrainStep.vmapped`) vmap the kernels: per slice, the same
    bits as the unbatched kernel (interpret mode)."""
    _vmapped_equals_each_slice((64, 128), interpret=True)


@gpu
@pytest.mark.gpu
def test_gpu_vmapped_kernel_equals_each_slice():
    """As above, compiled: the batched grid's TMA copies of sliced refs."""
    _vmapped_equals_each_slice((1152, 896), interpret=False)


def _decoded_copies_match(shape, rounding, decoded, interpret):
    from fp4jax.numerics.nvfp4_array import DecodedNVFP4
    from fp4jax.reference.quantization import scaled_codes_bf16

    x = data(shape, seed=7)
    kw = {"rounding": rounding, "row_key": jax.random.key(5), "col_key": jax.random.key(6)}
    refs = jax.jit(functools.partial(q2.reference, **kw))(x)
    got = jax.jit(functools.partial(q2.quantize_rowwise_columnwise, interpret=interpret,
                                    decoded=decoded, **kw))(x)
    for g, r, as_values, what in zip(got, refs, decoded, ("rowwise", "columnwise")):
        if not as_values:
            assert_same(g, r, what)
            continue
        assert isinstance(g, DecodedNVFP4) and g.axis == r.axis and g.hadamard == r.hadamard
        want = jax.lax.bitcast_convert_type(scaled_codes_bf16(r), jnp.uint16)
        have = jax.lax.bitcast_convert_type(g.values, jnp.uint16)
        assert have.shape == want.shape and bool((have == want).all()), (
            f"{what} {shape} {rounding}: {int((have != want).sum())} values differ")
        assert jnp.array_equal(g.amax, r.amax)


@pytest.mark.parametrize("decoded", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_interpret_decoded_copies_are_the_references_decode(rounding, decoded):
    """A copy the kernel writes decoded (`DecodedNVFP4`: code · s in BF16, for an XLA GEMM)
    holds bit for bit the reference's `scaled_codes_bf16` of that copy, with its amax; the
    other copy stays codes and scales equal to the reference (2 × 10 tiles)."""
    _decoded_copies_match((128, 640), rounding, decoded, interpret=True)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(384, 640), (1152, 896)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_gpu_decoded_copies_are_the_references_decode(shape, rounding):
    """As above, compiled on the GPU, both copies decoded."""
    poison_allocator(16 * shape[0] * shape[1])
    _decoded_copies_match(shape, rounding, (True, True), interpret=False)


@pytest.mark.skipif(ON_GPU, reason="the CPU host lowering; on a GPU the kernel runs")
@pytest.mark.parametrize("decoded", [False, True], ids=["codes", "decoded"])
def test_gpu_kernel_lowers_for_cuda_with_hardware_casts(decoded):
    """The compiled (not interpret-mode) two-output RHT+SR kernel, writing codes or decoded
    copies, lowers for the GPU from this host, and rounds the RHT output with a float
    conversion (`arith.truncf`) there: Mosaic GPU layout errors of the GPU-only code path
    show here, not first on the GPU."""
    f = functools.partial(q2.quantize_rowwise_columnwise, rounding="stochastic",
                          row_key=jax.random.key(0), col_key=jax.random.key(1),
                          decoded=(decoded, decoded), interpret=False)
    text = jax.jit(f).trace(jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "fp4jax_quantize_row_sr_col_rht_sr" in text
    assert "truncf" in text


