"""Quantization-error, round-trip and sign-symmetry assertions (`fp4jax.testing`)."""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fp4jax import implementation
from fp4jax.numerics.constants import BLOCK, E2M1_MAX
from fp4jax.numerics.nvfp4_array import NVFP4Array
from fp4jax.testing.support import (
    E4M3_HALF_SUBNORMAL_STEP,
    E4M3_MIN_NORMAL,
    F32_SLACK,
    FLT_MIN,
    SIGN_BIT,
    bits,
    block_of,
    decode,
    decode_steps,
    describe,
    f64,
    grid_spacing,
    quantize_options,
    reference_values,
    unravel,
)

# ---------------------------------------------------------------- quantization error


def quantization_error_bound(
    x: jax.typing.ArrayLike,
    q: NVFP4Array,
    *,
    rounding: str = "nearest",
    hadamard_signs: Sequence[int] | None = None,
) -> np.ndarray:
    """Per element of ``x``, the largest ``|x - dequantize(q)|`` NVFP4 allows.

    With the block decode scale ``s`` (E4M3) and the global decode scale ``gds``, an
    element is encoded as ``v = x / (s·gds)`` rounded to the E2M1 grid, so
    (RECIPE.md §2):

    * round-to-nearest: ``|error| <= h(|v|)/2 · s·gds``, ``h`` the grid spacing of
      ``|v|``'s binade (0.5 below 2, 1 below 4, 2 up to 6); stochastic rounding:
      ``< h(|v|) · s·gds``. Values a little above 6 (the block scale rounded down by
      at most 1/16) clamp to 6, within half the top spacing.
    * **scale underflow**: where ``s`` is an E4M3 subnormal (below 2⁻⁶) or zero, its
      own rounding error (up to 2⁻¹⁰) lets elements exceed the block's range
      ``6·s·gds`` by up to ``6·2⁻¹⁰·gds`` (they clamp to ±6, or decode to 0 when
      ``s = 0``); that much is added.
    * **float32 range**: a block whose decode step ``s·gds`` is below ``FLT_MIN``
      (the smallest normal float32) decodes to values XLA:CPU flushes to zero (the
      GPU does not), so ``7·FLT_MIN`` is added everywhere; if ``gds`` itself is not a
      normal float32 (tensor amax below ``2688·FLT_MIN ≈ 3.2e-35``) the scales are
      meaningless and the bound is the trivial ``|x| + 6·s·gds``.
    * float32 rounding of the scale products: a relative ``2⁻¹⁸``.

    Args:
      x: the tensor that was quantized (``q.shape``).
      q: its quantization.
      rounding: how ``q``'s elements were rounded (``"nearest"`` or ``"stochastic"``).
      hadamard_signs: the sign vector when ``q.hadamard`` (default signs if None);
        the bound is then for the rotated values ``hadamard.rht(x)``.

    Returns:
      float64 array of ``q.shape``.

    Example:
      >>> import jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import quantization_error_bound
      >>> x = jnp.array([[0.0, 1.2, 3.4, 6.0] * 4])
      >>> quantization_error_bound(x, fp4jax.quantize(x))[0, :4].round(4).tolist()
      [0.25, 0.25, 0.5, 1.0]
    """
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    x = jnp.asarray(x)
    ref = np.abs(reference_values(x, q, hadamard_signs))
    s, step, gds = decode_steps(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(step > 0, ref / step, np.inf)
    spacing = grid_spacing(np.minimum(u * (1 + F32_SLACK), E2M1_MAX))
    bound = step * (spacing if rounding == "stochastic" else spacing / 2)
    bound = bound + np.where(s < E4M3_MIN_NORMAL, E2M1_MAX * E4M3_HALF_SUBNORMAL_STEP * gds, 0.0)
    bound = bound * (1 + F32_SLACK) + ref * F32_SLACK + 7 * FLT_MIN
    if not gds >= FLT_MIN:
        bound = ref + E2M1_MAX * step * (1 + F32_SLACK) + 7 * FLT_MIN
    return bound


def assert_quantization_error_bounded(
    x: jax.typing.ArrayLike,
    q: NVFP4Array | None = None,
    *,
    axis: int | None = None,
    block_2d: bool | None = None,
    rounding: str = "nearest",
    key: jax.Array | None = None,
    hadamard: bool | None = None,
    hadamard_signs: Sequence[int] | None = None,
) -> None:
    """Asserts that ``|x - dequantize(q)|`` is within the NVFP4 bound, per element.

    The bound is `quantization_error_bound` (the E2M1 half-spacing at the element's
    binade times its block decode scale times the global decode scale, plus the
    honest allowances for E4M3 scale underflow and the float32 range). Inputs with a
    NaN or ±inf must give a tensor whose every dequantized value is NaN.

    Args:
      x: float32, bfloat16 or float16 array of any rank >= 1.
      q: its quantization; default ``implementation.quantize(x, ...)`` with the options below.
        When given, ``axis``/``block_2d``/``hadamard``, if passed, must match it.
      axis, block_2d, rounding, key, hadamard, hadamard_signs: as in
        `fp4jax.quantize`. ``rounding`` selects the bound (stochastic rounding may
        move an element to either grid neighbour).

    Raises:
      AssertionError: naming the worst element, its block, the error and the bound.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import assert_quantization_error_bounded
      >>> x = jax.random.normal(jax.random.key(0), (32, 48))
      >>> assert_quantization_error_bounded(x, axis=0, block_2d=True)
      >>> q = fp4jax.quantize(x)
      >>> bad = fp4jax.NVFP4Array(**{**vars(q), "data": q.data.at[3, 2].set(0x77)})
      >>> assert_quantization_error_bounded(x, bad)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      AssertionError: NVFP4 quantization error exceeds its bound at ... worst: element (3, ...
    """
    x = jnp.asarray(x)
    q = quantize_options(x, q, axis, block_2d, hadamard, rounding, key, hadamard_signs)
    xhat = decode(q).values
    nonfinite = ~np.isfinite(f64(x))
    if not nonfinite.any() and np.isnan(float(q.amax)):
        raise AssertionError("x is finite but q.amax is NaN: every element decodes to NaN")
    if nonfinite.any():
        ok = np.isnan(xhat)
        if ok.all():
            return
        first = unravel(int(np.argmax(nonfinite)), x.shape)
        bad = unravel(int(np.argmin(ok)), x.shape)
        raise AssertionError(
            f"non-finite input handling: x has {int(nonfinite.sum())} non-finite elements "
            f"(first at {first}) and q.amax={float(q.amax)}; every dequantized element must "
            f"be NaN, but {describe(bad, q)} dequantizes to {xhat[bad]}"
        )
    err = np.abs(reference_values(x, q, hadamard_signs) - xhat)
    bound = quantization_error_bound(x, q, rounding=rounding, hadamard_signs=hadamard_signs)
    over = err > bound
    if not over.any():
        return
    ratio = np.where(over, err / np.maximum(bound, np.finfo(np.float64).tiny), 0)
    idx = unravel(int(np.argmax(ratio)), x.shape)
    s, step, gds = decode_steps(q)
    ref = reference_values(x, q, hadamard_signs)
    kind = ("zero" if s[idx] == 0 else "E4M3-subnormal" if s[idx] < E4M3_MIN_NORMAL
            else "normal")
    hint = ""
    if step[idx] > 0 and abs(ref[idx]) / step[idx] > 7:
        hint = (" (|x|/(s·gds) > 7: the block scale is too small for its values — a "
                "global amax below max|x|, or a corrupted scale?)")
    raise AssertionError(
        f"NVFP4 quantization error exceeds its bound at {int(over.sum())} of {over.size} "
        f"elements; worst: {describe(idx, q)}: x={ref[idx]!r}, dequantized={xhat[idx]!r}, "
        f"|error|={err[idx]:.6g} > bound={bound[idx]:.6g} ({ratio[idx]:.3g}x the bound); "
        f"block decode scale s={s[idx]!r} ({kind}), global decode scale={gds!r}, "
        f"rounding={rounding!r}{hint}"
    )


# ---------------------------------------------------------------- round trip, sign


def assert_roundtrip_idempotent(q: NVFP4Array) -> None:
    """Asserts ``quantize(dequantize(q)) == q``, bit for bit, codes and scales.

    For ``q`` quantized with round-to-nearest (stochastic rounding may round a block's
    largest element down from 6 to 4, and the requantized scale then shrinks). The
    decoded values are requantized with ``q``'s axis, block layout and global
    amax (``amax=q.amax``), round-to-nearest (decoded values lie on the grid; a
    rotated ``q`` is requantized without rotating again). Where the format itself is
    not idempotent, the check is by value or skipped, as RECIPE.md §2 implies:

    * code 8 (−0, a tiny negative rounded to zero) decodes to −0.0, which
      requantizes to code 0 (the sign comes from ``v < 0``): both must be 0 or 8;
    * blocks with a zero scale hold saturated codes 7/15 that decode to 0: their
      requantized codes must decode to 0 too;
    * blocks whose E4M3 scale is subnormal (below 2⁻⁶) are skipped: the E4M3
      rounding step there (2⁻⁹) is coarse enough that the decoded block's amax can
      round to another scale;
    * a ``q`` with a NaN amax (non-finite input) must requantize to a NaN amax.

    Args:
      q: an `fp4jax.NVFP4Array`.

    Raises:
      AssertionError: naming the first differing scale (block) or code (element).

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import assert_roundtrip_idempotent
      >>> x = jax.random.normal(jax.random.key(0), (16, 32), jnp.float16)
      >>> assert_roundtrip_idempotent(fp4jax.quantize(x, axis=0, block_2d=True))
    """
    if not isinstance(q, NVFP4Array):
        raise TypeError(f"q must be an fp4jax.NVFP4Array, got {type(q).__name__}")
    d = decode(q)
    q2 = implementation.quantize(d.values.astype(np.float32), axis=q.axis, block_2d=q.block_2d,
                         amax=q.amax)
    if np.isnan(float(q.amax)):
        if not np.isnan(float(q2.amax)):
            raise AssertionError(
                f"q.amax is NaN (non-finite input) but its requantization has amax={q2.amax}")
        return
    chex.assert_shape([q2.data, q2.scales], [q.data.shape, q.scales.shape])
    d2 = decode(q2)
    checked = d.scales >= E4M3_MIN_NORMAL  # per element: normal E4M3 block scale
    zero = d.scales == 0
    changed = (bits(d.scales.astype(np.float32)) != bits(d2.scales.astype(np.float32)))
    bad = np.argwhere(changed & (checked | zero))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        block = block_of(idx, q)
        blocked = (q.axis, q.tile_axis)
        in_block = np.all(np.stack([
            np.indices(q.shape)[a] // (BLOCK if a in blocked else 1) == block[a]
            for a in range(q.ndim)]), axis=0)
        top = int((d.codes[in_block] & (SIGN_BIT - 1)).max())
        hint = "" if top == 7 else (
            f"; the block's largest code magnitude is {top}, not 7 (6.0): round-to-nearest "
            "always rounds a block's largest element to ±6 — was q stochastically rounded?")
        raise AssertionError(
            f"round trip changed the block scale of {int(changed.sum())} elements; first: "
            f"block {block} along axis {q.axis}: scale {d.scales[idx]!r} requantized to "
            f"{d2.scales[idx]!r}{hint}"
        )
    magnitude = lambda c: c & (SIGN_BIT - 1)  # noqa: E731
    c1, c2 = d.codes, d2.codes
    same = np.where(zero, magnitude(c2) == 0,
                    (c1 == c2) | ((magnitude(c1) == 0) & (magnitude(c2) == 0)))
    bad = np.argwhere(~same & (checked | zero))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        raise AssertionError(
            f"round trip changed {len(bad)} codes; first: {describe(idx, q)}: code "
            f"{int(c1[idx])} requantized to code {int(c2[idx])} (block scale "
            f"{d.scales[idx]!r})"
        )


def assert_sign_symmetric(
    x: jax.typing.ArrayLike,
    *,
    axis: int = -1,
    block_2d: bool = False,
    rounding: str = "nearest",
    key: jax.Array | None = None,
    hadamard: bool = False,
    hadamard_signs: Sequence[int] | None = None,
) -> None:
    """Asserts ``quantize(-x)`` is ``quantize(x)`` with every sign bit flipped.

    Scales and the global amax must be bitwise equal, and each code of ``-x`` must be
    the code of ``x`` with bit 3 (the sign) flipped — including tiny values that
    round to ±0 (codes 0 and 8). Elements that quantize treats as zero (``x = ±0``,
    non-finite values, and float32 subnormals, which XLA:CPU flushes) may keep their
    code instead. With stochastic rounding the same ``key`` is used for both (the
    random bits depend only on the element's position, so the magnitude rounds the
    same way).

    Args:
      x: the tensor; options as in `fp4jax.quantize`.

    Raises:
      AssertionError: naming the first element (and its block) that broke symmetry.

    Example:
      >>> import jax, fp4jax
      >>> from fp4jax.testing import assert_sign_symmetric
      >>> x = jax.random.normal(jax.random.key(0), (8, 64))
      >>> assert_sign_symmetric(x, rounding="stochastic", key=jax.random.key(1))
    """
    x = jnp.asarray(x)
    kw = {"axis": axis, "block_2d": block_2d, "rounding": rounding, "key": key,
          "hadamard": hadamard, "hadamard_signs": hadamard_signs}
    q, qn = implementation.quantize(x, **kw), implementation.quantize(-x, **kw)
    for what, a, b in (("global amax", q.amax, qn.amax), ("block scales", q.scales, qn.scales)):
        ba, bb = bits(a), bits(b)
        if not np.array_equal(ba, bb):
            where = tuple(int(i) for i in np.argwhere(ba != bb)[0]) if ba.ndim else ()
            raise AssertionError(
                f"quantize(-x) changed the {what}: at {where}: "
                f"{np.asarray(a.astype(jnp.float32))[where]!r} vs "
                f"{np.asarray(b.astype(jnp.float32))[where]!r}")
    c, cn = decode(q).codes, decode(qn).codes
    ref = np.abs(reference_values(x, q, hadamard_signs))
    zero_like = ~(ref >= FLT_MIN)  # ±0, subnormal, NaN (inf: rht/abs give inf or NaN)
    zero_like |= ~np.isfinite(f64(x)) if not hadamard else ~np.isfinite(ref)
    ok = (cn == c ^ SIGN_BIT) | (zero_like & (cn == c))
    if not ok.all():
        idx = unravel(int(np.argmin(ok)), x.shape)
        raise AssertionError(
            f"sign symmetry broken at {int((~ok).sum())} of {ok.size} elements; first: "
            f"{describe(idx, q)}: x={reference_values(x, q, hadamard_signs)[idx]!r} has code "
            f"{int(c[idx])} but -x has code {int(cn[idx])} (expected {int(c[idx] ^ SIGN_BIT)})"
        )
