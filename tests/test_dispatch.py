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
