"""The per-tensor scale math as tiny kernels (`pallas_kernels.scale_kernels`): bit for bit
the XLA computation, lowerable for CUDA, and the quantize kernels (which take their
scales from them) still equal the reference.

CPU/CI: interpret mode, and lowering for CUDA on the host (no GPU needed). GPU (``-m
gpu``): the compiled kernels against XLA on the device.
"""

import functools

import jax
import numpy as np
import pytest

from benchmarks import compile_time
from fp4jax.numerics import scales
from pallas_kernels import amax as amax_pass
from pallas_kernels import quantize_engines as engines
from pallas_kernels import quantize_single as qs
from pallas_kernels import quantize_two_output as q2
from pallas_kernels import scale_kernels as sk
from tests.kernels.nvfp4_bits import ON_GPU, assert_same, data

# Zero, a float32 subnormal, tiny, ordinary, the format's 2688, huge: every branch of the
# global encode scale (1 for zero; the FLT_MAX clamp; a subnormal quotient). 1.0 and the
# last two need `div_rn`'s digit correction (an estimate one too big) in some reciprocal:
# the path the compiled kernel once got wrong.
AMAXES = [np.float32(v) for v in (0.0, 1e-40, 3.5e-30, 1.0, 2688.0, 7.25, 3.0e38, 123456.7,
                                  7.5772885e-05, 6.2650645e18)]
PAIRS = [(np.float32(a), np.float32(b)) for a in (0.0, 1e-40, 3.5, 2688.0, 3e38, np.nan)
         for b in (1.0, 6.5e-20, np.nan, 0.0)]


# The same formulas in XLA: `amax.global_scales` + `quantize_engines.scale_params`.
_xla_scale_params = jax.jit(lambda *a: engines.scale_params(*amax_pass.global_scales(list(a))))


def _bits(a):
    return np.asarray(a).view(np.uint32)


def test_scale_params_kernel_is_the_xla_computation_bit_for_bit():
    """gds, mult and the 8 encode-scale reciprocals of each amax: the kernel's values are
    the same formulas' in XLA (`amax.global_scales`, `quantize_engines.scale_params`)."""
    got = jax.jit(lambda *a: sk.scale_params(list(a), interpret=True))(*AMAXES)
    want = _xla_scale_params(*AMAXES)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_output_scales_kernel_is_the_xla_computation_bit_for_bit():
    """fl(gds_lhs * gds_rhs) per pair, NaN amaxes poisoning their pair only."""
    got = jax.jit(lambda p: sk.output_scales(p, interpret=True))(PAIRS)
    want = jax.jit(scales.output_scales)(PAIRS)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert np.isnan(np.asarray(got)[[i for i, p in enumerate(PAIRS) if np.isnan(p).any()]]).all()


def test_one_output_calls_are_padded_to_the_shared_kernel_with_the_same_bits():
    """A call with one amax (one pair) runs the kernel of `sk.LAUNCH_COUNT` amaxes (pairs)
    on zero padding: each value is still the XLA computation's, bit for bit (here the
    amaxes that need `div_rn`'s digit correction, and a NaN pair)."""
    amaxes, pairs = [AMAXES[3], AMAXES[6]], [PAIRS[3], PAIRS[21]]
    one = jax.jit(lambda *a: [sk.scale_params([x], interpret=True) for x in a])(*amaxes)
    np.testing.assert_array_equal(_bits(np.concatenate(one)), _bits(_xla_scale_params(*amaxes)))
    got = jax.jit(lambda p: [sk.output_scales([q], interpret=True) for q in p])(pairs)
    np.testing.assert_array_equal(_bits(np.concatenate(got)),
                                  _bits(jax.jit(scales.output_scales)(pairs)))


def test_call_sites_of_one_and_two_outputs_lower_one_kernel_each():
    """Lowered for CUDA, a program that takes the scale parameters of one and of two
    outputs and the output scales of one and of two GEMMs holds two distinct kernels (one
    `fp4jax_scale_params`, one `fp4jax_output_scales`), not four."""
    def program(a, b, c, d):
        return (sk.scale_params([a]), sk.scale_params([a, b]), sk.output_scales([(a, b)]),
                sk.output_scales([(a, b), (c, d)]))

    text = jax.jit(program).trace(*AMAXES[:4]).lower(lowering_platforms=("cuda",)).as_text()
    assert compile_time.mosaic_kernels(text)[1] == 2


@pytest.mark.parametrize("fn,args", [
    (lambda *a: sk.scale_params(list(a)), AMAXES[:2]),
    (lambda p: sk.output_scales(p), [PAIRS[:2]]),
], ids=["scale_params", "output_scales"])
def test_the_kernels_lower_for_cuda(fn, args):
    """Every operation used has a Mosaic GPU lowering (no floor, isfinite or isnan)."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


def test_quantize_kernels_with_in_kernel_scales_equal_the_reference():
    """Single-output (2D tiles) and two-output (SR) quantization with
    in-kernel scales: the reference's codes, scales and amax."""
    x = data((64, 128), seed=7)
    got = qs.quantize(x, block_2d=True, interpret=True)
    assert_same(got, qs.reference(x, block_2d=True), "single, 2D tiles")
    kw = {"rounding": "stochastic", "row_key": jax.random.key(1), "col_key": jax.random.key(2)}
    rows, cols = q2.quantize_rowwise_columnwise(x, interpret=True, **kw)
    ref_rows, ref_cols = q2.reference(x, **kw)
    assert_same(rows, ref_rows, "two-output rowwise")
    assert_same(cols, ref_cols, "two-output columnwise")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gpu_scale_kernels_equal_xla_on_the_device():
    """Compiled on the GPU: the same bits as XLA's computation on the same device, and the
    two-output quantizer with in-kernel scales equals the reference at 384x640."""
    got = jax.jit(lambda *a: sk.scale_params(list(a)))(*AMAXES)
    want = _xla_scale_params(*AMAXES)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    np.testing.assert_array_equal(_bits(jax.jit(sk.output_scales)(PAIRS)),
                                  _bits(jax.jit(scales.output_scales)(PAIRS)))
    x = data((384, 640), seed=4)
    kw = {"rounding": "stochastic", "row_key": jax.random.key(1), "col_key": jax.random.key(2)}
    got = jax.jit(functools.partial(q2.quantize_rowwise_columnwise, **kw))(x)
    ref = jax.jit(functools.partial(q2.reference, **kw))(x)
    for g, r, what in zip(got, ref, ("rowwise", "columnwise")):
        assert_same(g, r, what)
