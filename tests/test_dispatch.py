"""impl selection (fp4jax.dispatch)."""

import jax
import pytest

from fp4jax import dispatch


def test_auto_means_xla_off_gpu():
    """On a machine without a CUDA GPU, impl='auto' resolves to the XLA path."""
    if jax.devices()[0].platform == "gpu":
        pytest.skip("GPU present")
    assert dispatch.gpu_capability() is None
    assert dispatch.resolve("auto") == "xla"
    assert dispatch.resolve("pallas") == "pallas" and dispatch.resolve("native") == "native"


def test_unknown_impl_rejected():
    with pytest.raises(ValueError, match="impl must be one of"):
        dispatch.resolve("cuda")


def test_auto_policy_follows_the_measured_crossover():
    """The GEMM kernel is used for skinny and <= 4096 shapes, XLA at 8192^3 (H200 data)."""
    assert dispatch.auto_uses_gemm_kernel(16, 8192, 8192)
    assert dispatch.auto_uses_gemm_kernel(4096, 4096, 4096)
    assert not dispatch.auto_uses_gemm_kernel(8192, 8192, 8192)
    assert not dispatch.auto_uses_quantize_kernel(columnwise=True, stochastic=True)
    assert dispatch.auto_uses_quantize_kernel(columnwise=True, stochastic=False)
    assert dispatch.auto_uses_quantize_kernel(columnwise=False, stochastic=True)


def test_dot_general_pallas_quantization_matches_xla_bitwise():
    """The kernels dot_general uses (two-output X/dY copies, with token padding 56 -> 64)
    give the XLA path's bits, in Mosaic GPU interpret mode on CPU."""
    import sys

    import jax.numpy as jnp
    import numpy as np
    from jax._src.pallas.mosaic_gpu.interpret import params

    import fp4jax

    dg = sys.modules["fp4jax.dot_general"]
    r = fp4jax.Recipe.nvfp4()
    x = jax.random.normal(jax.random.key(0), (1, 56, 128), jnp.bfloat16)
    key = jax.random.key(3)
    with params.force_gpu_interpret_mode():
        for ops in ((r.fprop_lhs, r.wgrad_lhs, "fprop_lhs", "wgrad_lhs"),
                    (r.dgrad_grad, r.wgrad_grad, "dgrad_grad", "wgrad_grad")):
            got = dg._quantize_row_and_col(x, *ops[:2], key, *ops[2:], r, "pallas")
            want = dg._quantize_row_and_col(x, *ops[:2], key, *ops[2:], r, "xla")
            for a, b in zip(got, want):
                assert (a.shape, a.axis) == (b.shape, b.axis)
                np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
                np.testing.assert_array_equal(np.asarray(a.scales.view(jnp.uint8)),
                                              np.asarray(b.scales.view(jnp.uint8)))
                assert float(a.amax) == float(b.amax)
