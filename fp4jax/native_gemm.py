"""The native block-scaled NVFP4 GEMM (Blackwell, sm_100+) via `jax.nn.scaled_matmul`.

On GPUs with FP4 tensor cores, cuDNN multiplies E2M1 operands with per-16 E4M3
scales directly. This module only re-lays out an `NVFP4Array` pair into
`jax.nn.scaled_matmul`'s operands — ``(B, M, K)`` and ``(B, N, K)`` float4_e2m1fn
with K contiguous, scales ``(B, M, K/16)`` and ``(B, N, K/16)`` — and applies the two
global decode scales to the result.

**Untested on Blackwell**: we have no sm_100 GPU. What is tested (on CPU, where
`jax.nn.scaled_matmul` has a reference lowering) is the argument plumbing: packed
codes reinterpreted as float4 (low nibble = even element), 2D tile scales expanded
per row, the K-major re-layout of every operand layout fp4jax produces, and the
result equal to the emulated GEMM up to float32 summation order. cuDNN's own
constraints on sizes (e.g. multiples of 128 rows) are not checked here.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from fp4jax.numerics import checks, layout, scales
from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.nvfp4_array import NVFP4Array, pack_codes


def _k_major(q: NVFP4Array, k_axis: int) -> tuple[jax.Array, jax.Array]:
    """Codes as float4 ``(..., R, Kp)`` and E4M3 scales ``(..., R, Kp/16)``.

    ``k_axis`` is the logical contraction axis of ``q`` (one of its last two axes); R
    is the other of the last two axes.
    """
    nd = q.ndim
    r_axis = nd - 1 if k_axis == nd - 2 else nd - 2
    if q.axis == k_axis:
        data, scales = q.data, q.scales
    else:  # a 2D-tiled operand packed along its other axis: repack along K
        data = pack_codes(layout.pad_to_block(q.codes(), k_axis), k_axis)
        scales = q.scales
    if k_axis == nd - 2:  # move K last
        data, scales = jnp.swapaxes(data, -1, -2), jnp.swapaxes(scales, -1, -2)
    if q.block_2d:  # one scale per 16x16 tile -> one per row
        scales = jnp.repeat(scales, BLOCK, axis=-2)[..., : q.shape[r_axis], :]
    f4 = jax.lax.bitcast_convert_type(data, jnp.float4_e2m1fn)
    f4 = f4.reshape(*data.shape[:-1], data.shape[-1] * 2)
    return f4, scales


def matmul(
    lhs: NVFP4Array, rhs: NVFP4Array, *, preferred_element_type: Any = jnp.float32,
    output_scale: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    """``lhs (..., M, K) @ rhs (..., K, N)`` through `jax.nn.scaled_matmul`.

    Same contract as `fp4jax.reference.gemm.matmul`; the result agrees with it up to
    float32 summation order. ``output_scale``: as there.
    """
    checks.check_gemm_operands(lhs, rhs)
    return _matmul(lhs, rhs, output_scale, out_dtype=jnp.dtype(preferred_element_type))


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def _matmul(lhs: NVFP4Array, rhs: NVFP4Array, output_scale=None, *, out_dtype) -> jax.Array:
    a, sa = _k_major(lhs, lhs.ndim - 1)
    b, sb = _k_major(rhs, rhs.ndim - 2)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"padded contraction lengths differ: lhs {lhs.shape} -> {a.shape[-1]}, "
            f"rhs {rhs.shape} -> {b.shape[-1]}"
        )
    batch = lhs.shape[:-2]
    flat = lambda t: t.reshape(-1, *t.shape[-2:])  # noqa: E731
    acc = jax.nn.scaled_matmul(
        flat(a), flat(b), flat(sa), flat(sb), preferred_element_type=jnp.float32
    )
    acc = acc.reshape(*batch, *acc.shape[-2:])
    if output_scale is None:
        output_scale = scales.output_scale(lhs.amax, rhs.amax)
    return (acc * output_scale).astype(out_dtype)
