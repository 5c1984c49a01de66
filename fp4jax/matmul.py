"""The NVFP4 GEMM: ``NVFP4Array @ NVFP4Array -> float`` (RECIPE.md §6, §9)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fp4jax import dispatch
from fp4jax import native
from fp4jax import quantize as quantize_lib
from fp4jax.formats import NVFP4Array


def check_operands(lhs: NVFP4Array, rhs: NVFP4Array) -> None:
    """Raises `ValueError`/`TypeError` unless ``lhs @ rhs`` is a valid NVFP4 GEMM.

    ``lhs`` is logically ``(..., M, K)`` and ``rhs`` ``(..., K, N)`` with equal batch
    dims; each operand's 16-blocks must run along K (or be 16×16 tiles), and the
    Hadamard transform must be on both or neither.
    """
    for name, q in (("lhs", lhs), ("rhs", rhs)):
        if not isinstance(q, NVFP4Array):
            raise TypeError(f"{name} must be an NVFP4Array, got {type(q).__name__}")
        if q.ndim < 2:
            raise ValueError(f"{name} must have rank >= 2, got shape {q.shape}")
    if lhs.ndim != rhs.ndim or lhs.shape[:-2] != rhs.shape[:-2]:
        raise ValueError(f"batch dims differ: lhs {lhs.shape}, rhs {rhs.shape}")
    if lhs.shape[-1] != rhs.shape[-2]:
        raise ValueError(f"contraction sizes differ: lhs {lhs.shape} @ rhs {rhs.shape}")
    if not (lhs.axis == lhs.ndim - 1 or lhs.block_2d):
        raise ValueError(
            f"lhs {lhs.shape} is blocked along axis {lhs.axis}, not along the contraction "
            "axis (last); quantize it along K or with 2D blocks"
        )
    if not (rhs.axis == rhs.ndim - 2 or rhs.block_2d):
        raise ValueError(
            f"rhs {rhs.shape} is blocked along axis {rhs.axis}, not along the contraction "
            "axis (second to last); quantize it along K or with 2D blocks"
        )
    if lhs.hadamard != rhs.hadamard:
        raise ValueError(
            "the Hadamard transform was applied to one operand only "
            f"(lhs.hadamard={lhs.hadamard}, rhs.hadamard={rhs.hadamard})"
        )


def output_scale(lhs: NVFP4Array, rhs: NVFP4Array) -> jax.Array:
    """``fl(gds_lhs · gds_rhs)``: the float32 factor applied to the accumulator."""
    return quantize_lib.global_decode_scale(lhs.amax) * quantize_lib.global_decode_scale(rhs.amax)


def matmul(
    lhs: NVFP4Array,
    rhs: NVFP4Array,
    *,
    preferred_element_type: Any = jnp.float32,
    impl: str = "xla",
) -> jax.Array:
    """Multiplies two NVFP4 tensors: ``lhs (..., M, K) @ rhs (..., K, N)``.

    Emulated exactly on hardware without FP4 tensor cores (RECIPE.md §9): each
    operand is decoded to ``code · s`` in BF16 (exact), multiplied with FP32
    accumulation, and the accumulator is scaled by ``fl(gds_lhs · gds_rhs)``.

    Args:
      lhs: ``(..., M, K)`` blocked along K (or 2D-tiled).
      rhs: ``(..., K, N)`` blocked along K (or 2D-tiled).
      preferred_element_type: output dtype.
      impl: ``"xla"``: decode to BF16 in HBM and use XLA's dot (exact emulation);
        ``"pallas"``: the Hopper kernel (`pallas_kernels.matmul`, decode in-kernel);
        ``"native"``: the block-scaled GEMM of `jax.nn.scaled_matmul` (cuDNN on
        Blackwell; untested there, see `fp4jax.native`); ``"auto"``: see
        `fp4jax.dispatch`.

    Returns:
      ``(..., M, N)`` array of ``preferred_element_type``.

    Mathematically equivalent to::

      dequantize(lhs) @ dequantize(rhs)   # up to float32 rounding

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> a = fp4jax.quantize(jax.random.normal(jax.random.key(0), (8, 32)))
      >>> b = fp4jax.quantize(jax.random.normal(jax.random.key(1), (32, 4)), axis=0)
      >>> fp4jax.matmul(a, b).shape
      (8, 4)
    """
    check_operands(lhs, rhs)
    out_dtype = jnp.dtype(preferred_element_type)
    which = dispatch.resolve(impl)
    m, k, n = lhs.shape[-2], lhs.shape[-1], rhs.shape[-1]
    if which == "pallas" or (which == "auto-pallas" and dispatch.auto_uses_gemm_kernel(m, n, k)):
        from pallas_kernels import matmul as kernel  # lazy: the kernels import fp4jax

        try:
            return kernel.matmul(lhs, rhs, preferred_element_type=out_dtype)
        except ValueError:
            if which == "pallas":
                raise
    if which == "native":
        return _matmul_native(lhs, rhs, out_dtype=out_dtype)
    return _matmul_xla(lhs, rhs, out_dtype=out_dtype)


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def _matmul_native(lhs: NVFP4Array, rhs: NVFP4Array, *, out_dtype) -> jax.Array:
    return native.matmul_native(lhs, rhs, out_dtype)


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def _matmul_xla(lhs: NVFP4Array, rhs: NVFP4Array, *, out_dtype) -> jax.Array:
    a = quantize_lib.scaled_codes_bf16(lhs)
    b = quantize_lib.scaled_codes_bf16(rhs)
    nd = lhs.ndim
    batch = tuple(range(nd - 2))
    acc = lax.dot_general(
        a, b, (((nd - 1,), (nd - 2,)), (batch, batch)), preferred_element_type=jnp.float32
    )
    return (acc * output_scale(lhs, rhs)).astype(out_dtype)
