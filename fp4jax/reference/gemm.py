"""The emulated NVFP4 GEMM in pure JAX (docs/RECIPE.md §6, §9).

Each operand is decoded to ``code · s`` in BF16 (exact: E2M1 × E4M3 has at most 6
significant bits), multiplied by XLA's dot with FP32 accumulation, and the
accumulator is scaled by ``fl(gds_lhs · gds_rhs)``. On Hopper this is cuBLAS at BF16
speed plus one decode pass per operand.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fp4jax.numerics import checks, scales
from fp4jax.numerics.nvfp4_array import DecodedNVFP4, NVFP4Array
from fp4jax.reference.quantization import scaled_codes_bf16


def matmul(
    lhs: NVFP4Array | DecodedNVFP4, rhs: NVFP4Array | DecodedNVFP4, *,
    preferred_element_type: Any = jnp.float32,
    out_sharding: Any = None, lhs_from_mT: bool = False,  # noqa: N803 - mirrors jax.Array.mT
    single_device: bool = False, output_scale: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    """``lhs (..., M, K) @ rhs (..., K, N)`` by decoding to BF16 and XLA's dot.

    Args:
      lhs: ``(..., M, K)`` blocked along K (or 2D-tiled); an `NVFP4Array`, or a
        `DecodedNVFP4` (taken as it is: no decode pass).
      rhs: ``(..., K, N)`` blocked along K (or 2D-tiled); likewise.
      preferred_element_type: output dtype.
      out_sharding: output sharding, as in `jax.lax.dot_general`.
      lhs_from_mT: ``lhs`` is the ``.mT`` view of an array blocked along its rows
        (wgrad's Xᵀ): it is decoded in that array's stored orientation. A ``rhs``
        blocked along N is taken to be such a view too (dgrad's Wᵀ). Results do not
        depend on either.
      single_device: the program runs on one device: column-packed operands are then
        decoded without a transpose (`scaled_codes_bf16`'s ``column_pairs``). Results
        do not depend on it.
      output_scale: ``scales.output_scale(lhs.amax, rhs.amax)`` when the caller has
        already computed it (e.g. with `scales.output_scales` for several GEMMs at once).

    Returns:
      ``(..., M, N)`` array of ``preferred_element_type``.

    Mathematically equivalent to::

      dequantize(lhs) @ dequantize(rhs)   # up to float32 summation order

    Example:
      >>> import jax, fp4jax
      >>> from fp4jax.reference import gemm
      >>> a = fp4jax.quantize(jax.random.normal(jax.random.key(0), (8, 32)))
      >>> b = fp4jax.quantize(jax.random.normal(jax.random.key(1), (32, 4)), axis=0)
      >>> gemm.matmul(a, b).shape
      (8, 4)
    """
    checks.check_gemm_operands(lhs, rhs)
    return _matmul(lhs, rhs, out_dtype=jnp.dtype(preferred_element_type),
                   out_sharding=out_sharding, lhs_from_mT=bool(lhs_from_mT),
                   single_device=bool(single_device), output_scale=output_scale)


def _decode_view(q: NVFP4Array | DecodedNVFP4, from_mT: bool, pairs: bool  # noqa: N803
                 ) -> jax.Array:
    if isinstance(q, DecodedNVFP4):  # already the GEMM's operand, in its logical layout
        return q.values
    # A .mT view's data is a transpose of the stored codes: decoding the view's .mT
    # cancels it, and the swap of the decoded result becomes the GEMM's operand layout.
    if from_mT:
        return jnp.swapaxes(scaled_codes_bf16(q.mT, column_pairs=pairs), -1, -2)
    return scaled_codes_bf16(q, column_pairs=pairs)


@functools.partial(jax.jit, static_argnames=("out_dtype", "out_sharding", "lhs_from_mT",
                                             "single_device"))
def _matmul(lhs: NVFP4Array, rhs: NVFP4Array, output_scale=None, *, out_dtype, out_sharding,
            lhs_from_mT: bool, single_device: bool) -> jax.Array:  # noqa: N803
    nd = lhs.ndim
    a = _decode_view(lhs, lhs_from_mT, single_device)
    b = _decode_view(rhs, rhs.axis == nd - 1, single_device)
    batch = tuple(range(nd - 2))
    acc = lax.dot_general(
        a, b, (((nd - 1,), (nd - 2,)), (batch, batch)), preferred_element_type=jnp.float32,
        out_sharding=out_sharding,
    )
    if output_scale is None:
        output_scale = scales.output_scale(lhs.amax, rhs.amax)
    return (acc * output_scale).astype(out_dtype)
