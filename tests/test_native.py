"""The Blackwell (native block-scaled) GEMM path, tested for layout on CPU.

`jax.nn.scaled_matmul` has a reference lowering off-GPU, so the re-layout of every
operand form fp4jax produces can be checked here; cuDNN on sm_100 is untested.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax


def _cases():
    x = jax.random.normal(jax.random.key(0), (40, 72))
    w = jax.random.normal(jax.random.key(1), (72, 24))
    g = jax.random.normal(jax.random.key(2), (40, 24))
    pad = lambda t: jnp.pad(t, ((0, 8), (0, 0)))  # noqa: E731
    return {
        "fprop": (fp4jax.quantize(x), fp4jax.quantize(w, axis=0, block_2d=True)),
        "dgrad": (fp4jax.quantize(g), fp4jax.quantize(w, axis=0, block_2d=True).T),
        "wgrad": (fp4jax.quantize(pad(x), axis=0, hadamard=True).T,
                  fp4jax.quantize(pad(g), axis=0, hadamard=True)),
        "2d_lhs_packed_along_m": (fp4jax.quantize(x, axis=0, block_2d=True),
                                  fp4jax.quantize(w, axis=0)),
        "batched": (fp4jax.quantize(jax.random.normal(jax.random.key(3), (2, 3, 16, 32))),
                    fp4jax.quantize(jax.random.normal(jax.random.key(4), (2, 3, 32, 8)), axis=2)),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_native_layout_matches_emulation(name):
    """impl='native' (jax.nn.scaled_matmul) equals the emulated GEMM for every layout."""
    a, b = _cases()[name]
    want = np.asarray(fp4jax.matmul(a, b, impl="xla"))
    got = np.asarray(fp4jax.matmul(a, b, impl="native"))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_unknown_impl_rejected():
    a, b = _cases()["fprop"]
    with pytest.raises(ValueError, match="impl"):
        fp4jax.matmul(a, b, impl="cublas")
