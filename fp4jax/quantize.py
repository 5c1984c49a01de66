"""NVFP4 quantize / dequantize: the pure-JAX reference (RECIPE.md §2–§5).

These functions are exact to the bit with Transformer Engine's reference quantizer
(global scales, E4M3 block-scale bits, E2M1 codes, dequantized values) on float32,
bfloat16 and float16 inputs, eagerly and under ``jit`` on CPU and GPU: every
rounding is written so that XLA cannot elide it (see `fp4jax.rounding`). The Pallas
kernels are tested against this module.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax import dispatch
from fp4jax import formats
from fp4jax import hadamard as hadamard_lib
from fp4jax import random_bits
from fp4jax import rounding as rnd
from fp4jax.formats import BLOCK, NVFP4Array

Rounding = Literal["nearest", "stochastic"]

_F32 = jnp.float32
_FLT_MAX = np.float32(formats.FLT_MAX)
_INV_6 = np.float32(1.0) / np.float32(6.0)  # fl(1/6)
_INV_2688 = np.float32(1.0) / np.float32(2688.0)  # fl(1/2688)


def global_encode_scale(amax: jax.Array) -> jax.Array:
    """``ges = min(fl(2688 / amax), FLT_MAX)``, or 1 when ``amax == 0`` or that is 0.

    NaN ``amax`` gives NaN (non-finite inputs poison the whole tensor).
    """
    amax = jnp.asarray(amax, _F32)
    finite = jnp.isfinite(amax)
    safe = jnp.where(finite, jnp.abs(amax), np.float32(1.0))
    ges = jnp.minimum(rnd.div_rn(np.float32(2688.0), safe), _FLT_MAX)
    ges = jnp.where((safe == 0) | (ges == 0), np.float32(1.0), ges)
    return jnp.where(finite, ges, np.float32(np.nan))


def global_decode_scale(amax: jax.Array) -> jax.Array:
    """``gds = fl(1 / ges)``: the factor an NVFP4 GEMM applies per operand."""
    ges = global_encode_scale(amax)
    return jnp.where(jnp.isnan(ges), ges, rnd.div_rn(np.float32(1.0), jnp.where(jnp.isnan(ges), 1, ges)))


def block_encode_scale(s: jax.Array, gds: jax.Array) -> jax.Array:
    """Per-block encode scale ``min(fl(1 / fl(s * gds)), FLT_MAX)`` (RECIPE.md §2.5).

    ``s`` is the float32 value of the E4M3 block decode scale; ``s == 0`` gives
    ``FLT_MAX`` (nonzero elements then saturate to codes 7/15).
    """
    return jnp.minimum(rnd.div_rn(np.float32(1.0), s * gds), _FLT_MAX)


def check_options(
    *, rounding: str, key: Any, hadamard: bool, block_2d: bool, hadamard_signs: Any
) -> tuple[int, ...] | None:
    """Validates the quantize options that do not depend on the array.

    Shared by `quantize` and the Pallas kernel's wrapper. Returns the validated sign
    vector when ``hadamard`` (default signs for None), else None.
    """
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    if rounding == "stochastic" and key is None:
        raise ValueError("rounding='stochastic' needs a jax.random key: pass key=...")
    if hadamard and block_2d:
        raise ValueError("hadamard=True and block_2d=True cannot be combined")
    if hadamard_signs is not None and not hadamard:
        raise ValueError("hadamard_signs given but hadamard=False")
    if key is not None:
        random_bits.key_words(key)  # validates
    return hadamard_lib.check_signs(hadamard_signs) if hadamard else None


def _canonical_perm(ndim: int, axis: int, tile_axis: int | None) -> tuple[int, ...]:
    """Moves ``axis`` last and, for 2D blocks, the tile axis just before it."""
    tail = [axis] if tile_axis is None else [tile_axis, axis]
    return tuple(a for a in range(ndim) if a not in tail) + tuple(tail)


def _pad_axis(x: jax.Array, axis: int, length: int) -> jax.Array:
    extra = length - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def check_amax(amax: Any) -> jax.Array | None:
    """Validates a precomputed global amax: None, or a float scalar (returned as float32)."""
    if amax is None:
        return None
    amax = jnp.asarray(amax)
    if amax.shape != ():
        raise ValueError(f"amax must be a scalar, got shape {amax.shape}")
    if not jnp.issubdtype(amax.dtype, jnp.floating):
        raise TypeError(f"amax must be a float scalar, got dtype {amax.dtype}")
    return amax.astype(_F32)


def quantize(
    x: jax.typing.ArrayLike,
    *,
    axis: int = -1,
    block_2d: bool = False,
    rounding: Rounding = "nearest",
    key: jax.Array | None = None,
    hadamard: bool = False,
    hadamard_signs: Sequence[int] | None = None,
    amax: jax.typing.ArrayLike | None = None,
    impl: str = "xla",
) -> NVFP4Array:
    """Quantizes ``x`` to NVFP4 with 16-element blocks along ``axis``.

    Steps (RECIPE.md §2, every step in float32): global amax; global encode scale
    ``ges``; per-block amax; block decode scale ``s = e4m3(min(bamax * fl(ges *
    fl(1/6)), 448))``; per-block encode scale ``min(1 / (s * gds), FLT_MAX)``;
    elements ``clamp(x * enc, -6, 6)`` rounded to E2M1 (nearest-even or stochastic),
    the sign taken from ``v < 0``.

    A partial last block along ``axis`` is **zero-padded** (zeros change no amax);
    the padding is stored in ``data`` but `dequantize` drops it. With
    ``hadamard=True`` the length of ``axis`` must be a multiple of 16
    (`ValueError` otherwise), because the rotation would mix padding into real
    values.

    Non-finite inputs: if ``x`` holds a NaN or ±inf, the stored ``amax`` is NaN, so
    every dequantized element and every GEMM output using this tensor is NaN — a
    non-finite input is never turned into finite values.

    Args:
      x: float32, bfloat16 or float16 array of rank >= 1.
      axis: the block (contraction) axis.
      block_2d: one scale per 16×16 tile spanning ``axis`` and the other of the last
        two axes (for weights, RECIPE.md §3). ``axis`` must be one of the last two.
      rounding: ``"nearest"`` (round-to-nearest-even) or ``"stochastic"`` (unbiased;
        needs ``key``; RECIPE.md §5).
      key: a ``jax.random`` key, required for stochastic rounding. The same key gives
        the same bits.
      hadamard: quantize ``RHT(x)`` along ``axis`` (amax taken after the transform);
        `dequantize` then returns rotated-domain values.
      hadamard_signs: the RHT sign vector (16 entries ±1); default
        `fp4jax.hadamard.DEFAULT_SIGNS`.
      amax: a precomputed global amax (float scalar), e.g. reduced across devices.
        Must be at least ``max|x|`` (of the rotated ``x`` with ``hadamard``).
      impl: ``"xla"`` (this reference), ``"pallas"`` (the fused Hopper kernel,
        `pallas_kernels.quantize`; bit-identical) or ``"auto"`` (see `fp4jax.dispatch`).

    Returns:
      An `NVFP4Array`.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> x = jax.random.normal(jax.random.key(0), (4, 64), jnp.bfloat16)
      >>> q = fp4jax.quantize(x)
      >>> y = fp4jax.dequantize(q)
      >>> bool(jnp.all(fp4jax.dequantize(fp4jax.quantize(y)) == y))  # idempotent
      True
    """
    x = jnp.asarray(x)
    dtype = formats.check_input_dtype(x.dtype, "x")
    if x.ndim == 0:
        raise ValueError("quantize needs an array of rank >= 1, got a scalar")
    axis = formats.normalize_axis(axis, x.ndim)
    hadamard_signs = check_options(rounding=rounding, key=key, hadamard=hadamard,
                                   block_2d=block_2d, hadamard_signs=hadamard_signs)
    if block_2d:
        formats.tile_axis_for(axis, x.ndim)  # validates the tile placement
    if hadamard and x.shape[axis] % BLOCK:
        raise ValueError(
            f"hadamard=True needs the length of axis {axis} to be a multiple of 16 "
            f"(the rotation would mix padding into values); got shape {x.shape}"
        )
    amax = check_amax(amax)
    which = dispatch.resolve(impl)
    if which == "pallas" or (which == "auto-pallas" and dispatch.auto_uses_quantize_kernel(
            columnwise=axis != x.ndim - 1, stochastic=rounding == "stochastic")):
        from pallas_kernels import quantize as kernel  # lazy: the kernels import fp4jax

        try:
            return kernel.quantize(
                x, axis=axis, block_2d=block_2d, rounding=rounding, key=key, hadamard=hadamard,
                hadamard_signs=hadamard_signs, amax=amax)
        except ValueError:
            if which == "pallas":
                raise
    return _quantize(
        x, key if rounding == "stochastic" else None, amax, axis=axis, block_2d=bool(block_2d),
        rounding=rounding, hadamard=bool(hadamard), signs=hadamard_signs,
    )


@functools.partial(
    jax.jit, static_argnames=("axis", "block_2d", "rounding", "hadamard", "signs")
)
def _quantize(x, key, amax, *, axis, block_2d, rounding, hadamard, signs) -> NVFP4Array:
    dtype = x.dtype
    tile_axis = formats.tile_axis_for(axis, x.ndim) if block_2d else None
    n = x.shape[axis]
    xf = x.astype(_F32)
    if hadamard:
        xf = hadamard_lib.rht(xf, axis, signs, round_to=dtype)
    padded = formats.num_blocks(n) * BLOCK
    xf = _pad_axis(xf, axis, padded)

    # Non-finite inputs poison the stored amax (so every decoded value is NaN), while
    # codes and scales are computed from the finite values only: their bits never depend
    # on a backend's NaN semantics for min/max.
    finite = jnp.isfinite(xf)
    xf = jnp.where(finite, xf, np.float32(0.0))
    amax_x = jnp.max(jnp.abs(xf))
    poisoned = ~jnp.all(finite)
    if amax is not None:
        poisoned = poisoned | ~jnp.isfinite(amax)
        amax_x = jnp.where(jnp.isfinite(amax), amax, amax_x)
    ges = global_encode_scale(amax_x)
    gds = rnd.div_rn(np.float32(1.0), ges)
    amax = jnp.where(poisoned, np.float32(np.nan), amax_x).astype(_F32)

    perm = _canonical_perm(x.ndim, axis, tile_axis)
    inv = tuple(int(i) for i in np.argsort(perm))
    xc = jnp.transpose(xf, perm)  # (..., [T,] L) with L = padded, quantized axis last
    lead = xc.shape[:-1]
    nb = padded // BLOCK
    blocks = xc.reshape(*lead, nb, BLOCK)
    absb = jnp.abs(blocks)

    if block_2d:
        t = lead[-1]
        tb = formats.num_blocks(t)
        tiles = _pad_axis(absb, absb.ndim - 3, tb * BLOCK)
        tiles = tiles.reshape(*lead[:-1], tb, BLOCK, nb, BLOCK)
        bamax = jnp.max(tiles, axis=(-3, -1))  # (..., tb, nb): one per 16x16 tile
    else:
        bamax = jnp.max(absb, axis=-1)  # (..., nb)

    d = jnp.minimum(bamax * (ges * _INV_6), np.float32(formats.E4M3_MAX))
    s = rnd.round_to_e4m3(d)  # float32 holding the exact E4M3 block decode scale
    s_el = jnp.repeat(s, BLOCK, axis=-2)[..., : lead[-1], :] if block_2d else s
    enc = block_encode_scale(s_el, gds)
    v = jnp.clip(blocks * enc[..., None], -6.0, 6.0)
    a = jnp.abs(v)
    if rounding == "nearest":
        mag = rnd.e2m1_code_nearest(a)
    else:
        bits = random_bits.uniform_bits24(key, tuple(xf.shape))
        mag = rnd.e2m1_code_stochastic(a, jnp.transpose(bits, perm).reshape(blocks.shape))
    codes = (mag | jnp.where(v < 0, jnp.uint8(8), jnp.uint8(0))).reshape(*lead, padded)

    data = jnp.transpose(formats.pack_codes(codes, -1), inv)
    scales = jnp.transpose(s.astype(jnp.float8_e4m3fn), inv)
    return NVFP4Array(
        data=data,
        scales=scales,
        amax=amax,
        shape=tuple(x.shape),
        dtype=dtype,
        axis=axis,
        block_2d=block_2d,
        hadamard=hadamard,
    )


def dequantize(q: NVFP4Array, dtype: Any = jnp.float32) -> jax.Array:
    """Decodes an `NVFP4Array` to a dense array (RECIPE.md §2.7).

    ``x̂ = fl(e2m1(code) * fl(fl(f32(s) * amax) * fl(1/2688)))`` per element, then cast
    to ``dtype``. Padding is dropped. For ``q.hadamard`` the result is in the rotated
    domain.

    Args:
      q: the quantized tensor.
      dtype: output dtype (a float type).

    Returns:
      Array of shape ``q.shape`` and dtype ``dtype``.

    Example:
      >>> import jax.numpy as jnp, fp4jax
      >>> x = jnp.array([[0.0, 1.0, -2.0, 6.0] * 4])
      >>> fp4jax.dequantize(fp4jax.quantize(x))[0, :4].tolist()
      [0.0, 1.0, -2.0, 6.0]
    """
    if not isinstance(q, NVFP4Array):
        raise TypeError(f"dequantize expects an NVFP4Array, got {type(q).__name__}")
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"dequantize needs a floating output dtype, got {dtype}")
    return _dequantize(q, dtype=dtype)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _dequantize(q: NVFP4Array, *, dtype) -> jax.Array:
    vals = formats.e2m1_to_f32(formats.unpack_codes(q.data, q.axis))
    factor = (formats.e4m3_to_f32(q.scales) * q.amax) * _INV_2688
    x = lax.slice_in_dim(vals * q.per_element(factor), 0, q.shape[q.axis], axis=q.axis)
    return x.astype(dtype)


def scaled_codes_bf16(q: NVFP4Array) -> jax.Array:
    """``code · s`` per element in bfloat16, without the global scale (exact).

    This is the operand an emulated NVFP4 GEMM feeds to a BF16 matrix unit
    (RECIPE.md §9): E2M1 × E4M3 has at most 6 significant bits and fits BF16's range,
    so the product is exact. Padding is dropped.
    """
    vals = formats.e2m1_to_bf16(formats.unpack_codes(q.data, q.axis))
    s = q.per_element(q.scales.astype(jnp.bfloat16))
    return lax.slice_in_dim(vals * s, 0, q.shape[q.axis], axis=q.axis)
