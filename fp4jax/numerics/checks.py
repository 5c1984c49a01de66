"""Argument validation shared by every implementation (one check of each kind).

The reference, the Pallas kernels and the implementation choice all validate with
these functions, so a bad argument gets the same `TypeError`/`ValueError`, naming the
shape, dtype or option at fault, whichever path it takes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fp4jax.numerics import hadamard as hadamard_lib
from fp4jax.numerics import layout, random_bits
from fp4jax.numerics.constants import BLOCK, SUPPORTED_INPUT_DTYPES
from fp4jax.numerics.nvfp4_array import DecodedNVFP4, NVFP4Array
from fp4jax.numerics.rounding import ROUNDINGS
from fp4jax.numerics.scales import SCALE_RULES


def check_input_dtype(dtype: Any, what: str) -> jnp.dtype:
    """Returns ``dtype`` as a numpy dtype or raises `TypeError` naming ``what``."""
    dtype = jnp.dtype(dtype)
    if dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(
            f"{what} has dtype {dtype}; NVFP4 quantization takes float32, bfloat16 or "
            "float16 inputs"
        )
    return dtype


def check_amax(amax: Any) -> jax.Array | None:
    """Validates a precomputed global amax: None, or a float scalar (returned as float32)."""
    if amax is None:
        return None
    amax = jnp.asarray(amax)
    if amax.shape != ():
        raise ValueError(f"amax must be a scalar, got shape {amax.shape}")
    if not jnp.issubdtype(amax.dtype, jnp.floating):
        raise TypeError(f"amax must be a float scalar, got dtype {amax.dtype}")
    return amax.astype(jnp.float32)


def check_quantize_options(
    *, rounding: str, key: Any, hadamard: bool, block_2d: bool, hadamard_signs: Any,
    scale_rule: str = "six",
) -> tuple[int, ...] | None:
    """Validates the quantize options that do not depend on the array.

    Returns the validated sign vector when ``hadamard`` (default signs for None), else
    None.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {scale_rule!r}")
    if scale_rule == "four_over_six" and (hadamard or rounding == "stochastic"):
        raise ValueError(
            "scale_rule='four_over_six' cannot be combined with hadamard=True or "
            f"rounding='stochastic' (got hadamard={hadamard}, rounding={rounding!r}); "
            "as in Transformer Engine, 4/6 applies to round-to-nearest operands without the RHT"
        )
    if rounding == "stochastic" and key is None:
        raise ValueError("rounding='stochastic' needs a jax.random key: pass key=...")
    if hadamard and block_2d:
        raise ValueError("hadamard=True and block_2d=True cannot be combined")
    if hadamard_signs is not None and not hadamard:
        raise ValueError("hadamard_signs given but hadamard=False")
    if key is not None:
        random_bits.key_words(key)  # validates
    return hadamard_lib.check_signs(hadamard_signs) if hadamard else None


class QuantizeArguments(NamedTuple):
    """What `check_quantize_arguments` returns: the validated, normalized arguments."""

    x: jax.Array  # the input as an array
    axis: int  # the block axis, non-negative
    hadamard_signs: tuple[int, ...] | None  # the sign vector when hadamard, else None
    amax: jax.Array | None  # the given global amax as float32, or None


def check_quantize_arguments(
    x: Any,
    *,
    axis: int,
    block_2d: bool,
    rounding: str,
    key: Any,
    hadamard: bool,
    hadamard_signs: Any,
    amax: Any,
    scale_rule: str = "six",
) -> QuantizeArguments:
    """Validates every argument of a quantize call (the one check all implementations use).

    Raises:
      TypeError: a non-float dtype, a non-int axis, a bad key or amax type.
      ValueError: a scalar or empty input, an axis out of range, options that do not
        combine, a 2D tile off the last two axes, or a Hadamard axis whose length is
        not a multiple of 16.
    """
    x = jnp.asarray(x)
    check_input_dtype(x.dtype, "x")
    if x.ndim == 0:
        raise ValueError("quantize needs an array of rank >= 1, got a scalar")
    if x.size == 0:
        raise ValueError(f"quantize needs a non-empty array, got shape {x.shape}")
    axis = layout.normalize_axis(axis, x.ndim)
    signs = check_quantize_options(
        rounding=rounding, key=key, hadamard=hadamard, block_2d=block_2d,
        hadamard_signs=hadamard_signs, scale_rule=scale_rule)
    if block_2d:
        layout.tile_axis_for(axis, x.ndim)  # validates the tile placement
    if hadamard and x.shape[axis] % BLOCK:
        raise ValueError(
            f"hadamard=True needs the length of axis {axis} to be a multiple of 16 "
            f"(the rotation would mix padding into values); got shape {x.shape}"
        )
    return QuantizeArguments(x, axis, signs, check_amax(amax))


def check_gemm_operands(lhs: NVFP4Array | DecodedNVFP4, rhs: NVFP4Array | DecodedNVFP4) -> None:
    """Raises `ValueError`/`TypeError` unless ``lhs @ rhs`` is a valid NVFP4 GEMM.

    ``lhs`` is logically ``(..., M, K)`` and ``rhs`` ``(..., K, N)`` with equal batch
    dims; each operand's 16-blocks must run along K (or be 16×16 tiles), and the
    Hadamard transform must be on both or neither.
    """
    for name, q in (("lhs", lhs), ("rhs", rhs)):
        if not isinstance(q, (NVFP4Array, DecodedNVFP4)):
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
