"""Chex-style assertions for NVFP4 code: call them in your own test suite.

Each assertion raises `AssertionError` with a message that names the element, block,
GEMM or parameter that broke the property, and by how much. They run on the host
(outside ``jit``), like ``chex.assert_trees_all_close``.

* `assert_quantization_error_bounded`: per element, the NVFP4 rounding error is
  within the format's bound relative to its block's decode scale.
* `assert_roundtrip_idempotent`, `assert_sign_symmetric`: ``quantize(dequantize(q))
  == q`` and ``quantize(-x) == -quantize(x)``, bit for bit.
* `assert_stochastic_rounding_unbiased` (with `stochastic_rounding_target` and
  `unbiasedness_sample_size`): a rounding function is unbiased, with a sample size
  computed from the bias it must detect.
* `assert_conforms_to_recipe`: each GEMM of an `fp4jax.dot_general` call (or of a
  layer's ``dot_general``) equals the GEMM rebuilt from `fp4jax.quantize` and
  `fp4jax.matmul` as the `fp4jax.Recipe` says.
* `assert_gradients_close_to_unquantized`: a sanity check of a quantized model's
  gradients against its high-precision twin, per parameter.
* `assert_bitwise_equal_across`: the same function gives the same bits with and
  without ``jit`` and on several backends.

Example:
  >>> import jax, jax.numpy as jnp, fp4jax, fp4jax.testing
  >>> x = jax.random.normal(jax.random.key(0), (4, 64), jnp.bfloat16)
  >>> fp4jax.testing.assert_quantization_error_bounded(x)
"""

from fp4jax.testing.conformance import assert_conforms_to_recipe as assert_conforms_to_recipe
from fp4jax.testing.conformance import rebuild_gemms as rebuild_gemms
from fp4jax.testing.models import assert_bitwise_equal_across as assert_bitwise_equal_across
from fp4jax.testing.models import (
    assert_gradients_close_to_unquantized as assert_gradients_close_to_unquantized,
)
from fp4jax.testing.quantization import (
    assert_quantization_error_bounded as assert_quantization_error_bounded,
)
from fp4jax.testing.quantization import assert_roundtrip_idempotent as assert_roundtrip_idempotent
from fp4jax.testing.quantization import assert_sign_symmetric as assert_sign_symmetric
from fp4jax.testing.quantization import quantization_error_bound as quantization_error_bound
from fp4jax.testing.stochastic import (
    assert_stochastic_rounding_unbiased as assert_stochastic_rounding_unbiased,
)
from fp4jax.testing.stochastic import stochastic_rounding_target as stochastic_rounding_target
from fp4jax.testing.stochastic import unbiasedness_sample_size as unbiasedness_sample_size
