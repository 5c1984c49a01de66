"""The two-level NVFP4 scale formulas (docs/RECIPE.md §2.2, §2.4, §2.5, §2.7, §9).

Every formula is float32 with the rounding order the recipe fixes, and every division
is `rounding.div_rn` (correctly rounded on every backend), so the scales are the same
bits on CPU and GPU, in the reference and in the kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax.numerics import rounding
from fp4jax.numerics.constants import (
    E4M3_MAX,
    FLT_MAX,
    GLOBAL_SCALE_NUMERATOR,
    INV_E2M1_MAX,
    INV_GLOBAL_SCALE_NUMERATOR,
)

_F32 = jnp.float32


def global_encode_scale(amax: jax.typing.ArrayLike) -> jax.Array:
    """``ges = min(fl(2688 / amax), FLT_MAX)``, or 1 when ``amax == 0`` or that is 0.

    A non-finite ``amax`` gives NaN (non-finite inputs poison the whole tensor). Written
    with comparisons only (no ``isfinite``/``isnan``), so that it also lowers inside a
    Mosaic GPU kernel (`pallas_kernels.scale_kernels`).

    Example:
      >>> float(global_encode_scale(2688.0))
      1.0
    """
    mag = jnp.abs(jnp.asarray(amax, _F32))
    finite = mag < np.float32(np.inf)  # False for NaN and inf
    safe = jnp.where(finite, mag, np.float32(1.0))
    ges = rounding.div_rn(np.float32(GLOBAL_SCALE_NUMERATOR), safe)
    ges = jnp.minimum(ges, np.float32(FLT_MAX))
    ges = jnp.where((safe == 0) | (ges == 0), np.float32(1.0), ges)
    return jnp.where(finite, ges, np.float32(np.nan))


def global_decode_scale(amax: jax.typing.ArrayLike) -> jax.Array:
    """``gds = fl(1 / ges)``: the factor an NVFP4 GEMM applies per operand.

    Example:
      >>> float(global_decode_scale(2688.0))
      1.0
    """
    ges = global_encode_scale(amax)
    nan = ges != ges  # noqa: PLR0124 - a NaN test (as above: lowers in a kernel)
    return jnp.where(nan, ges, rounding.div_rn(np.float32(1.0), jnp.where(nan, 1, ges)))


def block_decode_scale(bamax: jax.Array, ges: jax.Array) -> jax.Array:
    """The E4M3 block decode scale ``s = e4m3_rne(min(fl(bamax · fl(ges · fl(1/6))), 448))``.

    Returns a float32 holding the exact E4M3 value. Note the multiplication order: not
    ``fl(bamax / 6) · ges`` and not ``bamax · fl(ges / 6)``; each differs by an ulp.
    """
    d = jnp.minimum(bamax * (ges * INV_E2M1_MAX), np.float32(E4M3_MAX))
    return rounding.round_to_e4m3(d)


def block_encode_scale(s: jax.Array, gds: jax.Array) -> jax.Array:
    """Per-block encode scale ``min(fl(1 / fl(s · gds)), FLT_MAX)``.

    ``s`` is the float32 value of the E4M3 block decode scale; ``s == 0`` gives
    ``FLT_MAX`` (nonzero elements then saturate to codes 7/15).
    """
    return jnp.minimum(rounding.div_rn(np.float32(1.0), s * gds), np.float32(FLT_MAX))


E4M3_CODES = 128
"""Non-negative ``float8_e4m3fn`` codes (sign bit clear); code 127 is NaN."""


def e4m3_code(s: jax.Array) -> jax.Array:
    """The 7-bit E4M3 code (int32) of a float32 holding an exact non-negative E4M3 value.

    A conversion of an exactly representable value, then a bitcast: nothing to round,
    so nothing for a compiler to elide.
    """
    bits = jax.lax.bitcast_convert_type(s.astype(jnp.float8_e4m3fn), jnp.uint8)
    return (bits & 0x7F).astype(jnp.int32)


def block_encode_scale_table(gds: jax.Array) -> jax.Array:
    """`block_encode_scale` of every non-negative E4M3 value: a (128,) float32 table.

    The per-block encode scale depends only on the block's 7-bit E4M3 code and the
    tensor's global decode scale, so one correctly rounded division per code (128 per
    tensor) replaces one per block; ``table[e4m3_code(s)] == block_encode_scale(s, gds)``
    bit for bit. Entry 127 (NaN) is never looked up.

    Example:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([0.0, 0.5, 448.0], jnp.float32)
      >>> t = block_encode_scale_table(jnp.float32(1.0))
      >>> bool((t[e4m3_code(s)] == block_encode_scale(s, jnp.float32(1.0))).all())
      True
    """
    codes = jnp.arange(E4M3_CODES, dtype=jnp.uint8)
    values = jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn).astype(_F32)
    values = jnp.where(codes == E4M3_CODES - 1, np.float32(0.0), values)
    return block_encode_scale(values, gds)


def lookup_encode_scales(table: jax.Array, s: jax.Array) -> jax.Array:
    """``table[e4m3_code(s)]``: the encode scales of blocks with decode scales ``s``.

    The gather's output takes the sharding of ``s``, so it works under explicit meshes.
    """
    code = e4m3_code(s)
    return table.at[code].get(out_sharding=jax.typeof(code).sharding)


def element_decode_factor(s: jax.Array, amax: jax.Array) -> jax.Array:
    """What one E2M1 value is multiplied by on decode (docs/RECIPE.md §2.7).

    Transformer Engine's ``fl(fl(s · amax) · fl(1/2688))``, bit for bit, wherever that is
    finite. For ``amax`` above ``FLT_MAX / 448`` (≈ 7.6e35) the first product can
    overflow although the decoded value is representable; there the factor is
    ``fl(s · fl(amax · fl(1/2688)))`` instead, so a finite input always decodes finite.
    A NaN ``amax`` (a poisoned tensor) stays NaN.

    Example:
      >>> import jax.numpy as jnp
      >>> bool(jnp.isfinite(element_decode_factor(jnp.float32(448.0), jnp.float32(1e36))))
      True
    """
    te = (s * amax) * INV_GLOBAL_SCALE_NUMERATOR
    reordered = s * (amax * INV_GLOBAL_SCALE_NUMERATOR)
    return jnp.where(jnp.isinf(s * amax) & jnp.isfinite(amax), reordered, te)


def output_scale(lhs_amax: jax.Array, rhs_amax: jax.Array) -> jax.Array:
    """``fl(gds_lhs · gds_rhs)``: the float32 factor an NVFP4 GEMM applies to its accumulator.

    Both global decode scales come from one (vectorized) pass of the division, and the
    result goes through an optimization barrier: it is computed once, not fused into
    (repeated for) every element of the accumulator it scales.

    Example:
      >>> float(output_scale(2688.0, 5376.0))
      2.0
    """
    return output_scales([(lhs_amax, rhs_amax)])[0]


def output_scales(pairs: Sequence[tuple[jax.typing.ArrayLike, jax.typing.ArrayLike]]
                  ) -> jax.Array:
    """`output_scale` of several GEMMs' ``(lhs_amax, rhs_amax)`` pairs: float32[n].

    One vectorized pass of the divisions for all of them: each correctly rounded
    division is a large part of a quantized step's program (compile time), so the
    backward pass computes its two GEMMs' scales together.

    Example:
      >>> output_scales([(2688.0, 5376.0), (2688.0, 2688.0)]).tolist()
      [2.0, 1.0]
    """
    amaxes = jnp.stack([jnp.asarray(a, _F32) for pair in pairs for a in pair])
    gds = global_decode_scale(amaxes).reshape(len(pairs), 2)
    return jax.lax.optimization_barrier(gds[:, 0] * gds[:, 1])


ScaleRule = Literal["six", "four_over_six"]
"""How a block's E4M3 decode scale is chosen: ``"six"`` maps the block amax to 6 (§2.4);
``"four_over_six"`` also tries mapping it to 4 and keeps the lower-error candidate (§2.8)."""

SCALE_RULES: tuple[str, ...] = ("six", "four_over_six")


def block_decode_scale_four(bamax: jax.Array, ges: jax.Array) -> jax.Array:
    """The 4/6 rule's second candidate ``s4 = e4m3_rne(min(fl(bamax · fl(ges · 0.25)), 448))``.

    `block_decode_scale` with the block amax mapped to 4 instead of 6 (docs/RECIPE.md §2.8):
    ``fl(ges · 0.25)`` is exact, so ``s4`` is never below ``s6``.

    Example:
      >>> import jax.numpy as jnp
      >>> float(block_decode_scale_four(jnp.float32(8.0), jnp.float32(1.0)))
      2.0
    """
    d = jnp.minimum(bamax * (ges * np.float32(0.25)), np.float32(E4M3_MAX))
    return rounding.round_to_e4m3(d)


def block_squared_error(
    x: jax.Array, values: jax.Array, s: jax.Array, ges: jax.Array
) -> jax.Array:
    """Sum of squared quantization errors of 16-blocks in scaled units (docs/RECIPE.md §2.8).

    ``t_i = fl(x_i · ges)``, ``d_i = fl(fl(values_i · s) - t_i)``, ``e_i = fl(d_i · d_i)``,
    summed in float32 from element 0 to 15. ``values · s`` is exact (E2M1 × E4M3); the
    inexact products ``t`` and ``e`` pass an optimization barrier, so they are rounded to
    float32 before they are subtracted or added: no FMA contraction can fuse them.

    Args:
      x: (..., 16) finite float32 inputs.
      values: (..., 16) their signed E2M1 values under the candidate scale.
      s: (...) the candidate's E4M3 decode scales (float32).
      ges: the global encode scale (scalar).

    Returns:
      (...) float32 block errors.

    Example:
      >>> import jax.numpy as jnp
      >>> x = jnp.full((16,), 5.0, jnp.float32)
      >>> float(block_squared_error(x, jnp.full((16,), 6.0), jnp.float32(1.0), jnp.float32(1.0)))
      16.0
    """
    t = lax.optimization_barrier(x * ges)
    e = lax.optimization_barrier(jnp.square(values * s[..., None] - t))
    total = e[..., 0]
    for i in range(1, e.shape[-1]):
        total = total + e[..., i]
    return total


def tile_error(row_errors: jax.Array, axis: int) -> jax.Array:
    """Sums the 16 row-block errors of 16×16 tiles along ``axis`` (length 16) as a tree.

    ``r_i + r_{i+8}``, then ``+4``, ``+2``, ``+1`` (docs/RECIPE.md §2.8), in float32.

    Example:
      >>> import jax.numpy as jnp
      >>> float(tile_error(jnp.arange(16.0), 0))
      120.0
    """
    r = jnp.moveaxis(row_errors, axis, -1)
    while r.shape[-1] > 1:
        h = r.shape[-1] // 2
        r = r[..., :h] + r[..., h:]
    return r[..., 0]
