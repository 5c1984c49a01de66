"""pallas_kernels.gemm_data: the training layouts' stored operands and their views."""

import jax
import jax.numpy as jnp
import pytest

from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm_data


@pytest.mark.parametrize("layout, lhs_shape, rhs_shape, kw", [
    ("fprop", (32, 48), (48, 64), {}),
    ("dgrad", (32, 48), (48, 64), {}),
    ("wgrad", (32, 48), (48, 64), {"lhs_from_mT": True}),
    ("wgrad_plain", (32, 48), (48, 64), {}),
])
def test_views_of_the_stored_operands_are_the_layouts_gemm(layout, lhs_shape, rhs_shape, kw):
    """Every layout's views of its stored operands multiply as (m, k) @ (k, n), and
    layout_operands returns those views (their shapes)."""
    stored = jax.eval_shape(lambda: gemm_data.stored_operands(quantize, layout, 32, 64, 48))
    lhs, rhs, got_kw = gemm_data.views(layout, *(jnp.zeros(s.shape) for s in stored))
    assert (lhs.shape, rhs.shape, got_kw) == (lhs_shape, rhs_shape, kw)
    a, b = jax.eval_shape(lambda: gemm_data.layout_operands(quantize, layout, 32, 64, 48)[:2])
    assert (a.shape, b.shape) == (lhs.shape, rhs.shape)


def test_an_unknown_layout_is_named_in_the_error():
    """A layout name that is none of the four raises a ValueError naming it."""
    with pytest.raises(ValueError, match="got 'fwd'"):
        gemm_data.stored_operands(quantize, "fwd", 32, 64, 48)
    with pytest.raises(ValueError, match="got 'bwd'"):
        gemm_data.views("bwd", None, None)
