"""`DecodedNVFP4`: a GEMM operand handed over already decoded (BF16 ``code · s``) computes
the same product as its NVFP4Array, and is refused where codes are needed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax import implementation
from fp4jax.numerics.nvfp4_array import DecodedNVFP4
from fp4jax.reference import quantization


def _operands():
    x = jax.random.normal(jax.random.key(0), (48, 64), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (64, 32), jnp.bfloat16)
    return x, fp4jax.quantize(w, axis=0, block_2d=True)


def test_decoded_lhs_gives_the_same_product_bit_for_bit():
    """The XLA GEMM reads a decoded lhs as it would decode the NVFP4Array itself."""
    x, qw = _operands()
    qx = fp4jax.quantize(x)
    want = implementation.matmul(qx, qw)
    got = implementation.matmul(quantization.decoded(qx), qw, impl="auto")
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                  np.asarray(want).view(np.uint32))


def test_decode_rowwise_copy_is_the_decoded_rowwise_copy():
    """``quantize_rowwise_columnwise(decode_rowwise=True)`` (XLA path): the rowwise copy is
    `decoded` of the plain call's, the columnwise copy the same, odd M padded as before."""
    x = jax.random.normal(jax.random.key(2), (40, 64), jnp.bfloat16)
    row, col = implementation.quantize_rowwise_columnwise(x)
    drow, dcol = implementation.quantize_rowwise_columnwise(x, decode_rowwise=True)
    assert isinstance(drow, DecodedNVFP4) and drow.shape == (40, 64)
    np.testing.assert_array_equal(np.asarray(drow.values).view(np.uint16),
                                  np.asarray(quantization.decoded(row).values).view(np.uint16))
    np.testing.assert_array_equal(np.asarray(dcol.data), np.asarray(col.data))


def test_decoded_lhs_is_refused_where_codes_are_needed():
    """The Pallas and native GEMMs read codes: a decoded lhs raises, naming the option."""
    x, qw = _operands()
    d = quantization.decoded(fp4jax.quantize(x))
    for impl in ("pallas", "native"):
        with pytest.raises(ValueError, match="already decoded"):
            implementation.matmul(d, qw, impl=impl)
    with pytest.raises(TypeError, match="rhs must be an NVFP4Array"):
        implementation.matmul(fp4jax.quantize(x), d)
    with pytest.raises(ValueError, match="16x16 tiles"):
        quantization.decoded(qw)


def test_leading_axis_views():
    """take_leading and expand_leading keep the values, the amax and the block axis."""
    d = quantization.decoded(fp4jax.quantize(jnp.ones((8, 32))))
    e = d.expand_leading()
    assert e.shape == (1, 8, 32) and e.axis == 2 and e.ndim == 3
    t = d.take_leading(3)
    assert t.shape == (3, 32) and bool(t.amax == d.amax)
    with pytest.raises(ValueError, match="cannot take 9"):
        d.take_leading(9)
