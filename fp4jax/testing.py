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

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fp4jax import implementation
from fp4jax.numerics import hadamard, layout, scales
from fp4jax.numerics.constants import BLOCK as _BLOCK
from fp4jax.numerics.constants import E2M1_MAX as _E2M1_MAX
from fp4jax.numerics.nvfp4_array import NVFP4Array
from fp4jax.quantized_dot import ROLE_IDS as _ROLE_IDS
from fp4jax.quantized_dot import dot_general
from fp4jax.recipe import Recipe

# Format constants beyond the table in fp4jax.numerics.constants (docs/RECIPE.md §1).
_E4M3_MIN_NORMAL = 2.0**-6  # smallest normal float8_e4m3fn; below it steps are 2**-9
_E4M3_HALF_SUBNORMAL_STEP = 2.0**-10  # largest rounding error of a subnormal E4M3 scale
_FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal float32 (XLA:CPU flushes below)
_SIGN_BIT = 8  # bit 3 of an E2M1 code


# A relative slack for float32 arithmetic (a few ulps of the scale products), far below
# any NVFP4 rounding step (>= 1/12 of the value in the top binade).
_F32_SLACK = 2.0**-18


# ---------------------------------------------------------------- small helpers


def _f64(a: Any) -> np.ndarray:
    return np.asarray(jnp.asarray(a).astype(jnp.float32), dtype=np.float64)


def _bits(a: Any) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def _block_of(idx: tuple[int, ...], q: NVFP4Array) -> tuple[int, ...]:
    """The block (1D) or tile (2D) index of element ``idx``: its scale's index."""
    b = list(idx)
    b[q.axis] //= _BLOCK
    if q.block_2d:
        b[q.tile_axis] //= _BLOCK
    return tuple(b)


class _Decoded(NamedTuple):
    """Host copies of what the checks read from an `NVFP4Array`, in its logical shape."""

    values: np.ndarray  # float64: dequantize(q)
    scales: np.ndarray  # float64: each element's block decode scale s
    codes: np.ndarray  # uint8 E2M1 codes
    gds: float  # the global decode scale


def _per_element(per_block: np.ndarray, q: NVFP4Array) -> np.ndarray:
    """Broadcasts an array shaped like ``q.scales`` to ``q.shape`` (one value per element)."""
    out = per_block
    for a in (q.axis, q.tile_axis):
        if a is not None:
            out = np.take(np.repeat(out, _BLOCK, axis=a), np.arange(q.shape[a]), axis=a)
    return out


def _decode(q: NVFP4Array) -> _Decoded:
    """Codes and scales unpacked on the host (RECIPE.md §1 packing), values from
    `fp4jax.dequantize`."""
    data = np.moveaxis(np.asarray(q.data), q.axis, -1)
    codes = np.stack([data & 0xF, data >> 4], axis=-1).reshape(*data.shape[:-1], -1)
    codes = np.moveaxis(codes[..., : q.shape[q.axis]], -1, q.axis)
    scales = _per_element(np.asarray(q.scales).astype(np.float64), q)
    values = np.asarray(implementation.dequantize(q), np.float64)
    return _Decoded(values, scales, codes, float(_global_decode_scale(q.amax)))


# One compiled program instead of the division's many eager ops.
_global_decode_scale = jax.jit(scales.global_decode_scale)


_rht = jax.jit(hadamard.rht, static_argnums=(1, 2))


def _reference(x: jax.Array, q: NVFP4Array, signs: Sequence[int] | None) -> np.ndarray:
    """The values ``q`` encodes, in float64: ``x``, or ``rht(x)`` for a rotated ``q``."""
    if q.hadamard:
        return _f64(_rht(x, q.axis, None if signs is None else tuple(int(v) for v in signs)))
    return _f64(x)


def _options(x, q, axis, block_2d, hadamard, rounding, key, hadamard_signs):
    """``q``, or ``fp4jax.quantize(x, ...)``; checks that given options agree with ``q``."""
    if q is None:
        return implementation.quantize(
            x, axis=-1 if axis is None else axis, block_2d=bool(block_2d), rounding=rounding,
            key=key, hadamard=bool(hadamard), hadamard_signs=hadamard_signs)
    if not isinstance(q, NVFP4Array):
        raise TypeError(f"q must be an fp4jax.NVFP4Array, got {type(q).__name__}")
    if tuple(x.shape) != tuple(q.shape):
        raise ValueError(f"x has shape {x.shape} but q has shape {q.shape}")
    for name, given, actual in (("axis", axis, q.axis), ("block_2d", block_2d, q.block_2d),
                                ("hadamard", hadamard, q.hadamard)):
        if given is None:
            continue
        if name == "axis":
            given = int(given) % x.ndim
        if given != actual:
            raise ValueError(f"{name}={given!r} was given but q has {name}={actual!r}")
    return q


def _grid_spacing(u: np.ndarray) -> np.ndarray:
    """Distance between the E2M1 grid neighbours of magnitudes ``u`` (0.5, 1 or 2)."""
    return np.where(u < 2.0, 0.5, np.where(u < 4.0, 1.0, 2.0))


def _decode_steps(q: NVFP4Array) -> tuple[np.ndarray, np.ndarray, float]:
    """Per element: the block decode scale ``s`` and ``s · gds``; and ``gds``."""
    d = _decode(q)
    return d.scales, d.scales * d.gds, d.gds


def _describe(idx, q, extra: str = "") -> str:
    return f"element {idx} (block {_block_of(idx, q)} along axis {q.axis}{extra})"


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
    ref = np.abs(_reference(x, q, hadamard_signs))
    s, step, gds = _decode_steps(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(step > 0, ref / step, np.inf)
    spacing = _grid_spacing(np.minimum(u * (1 + _F32_SLACK), _E2M1_MAX))
    bound = step * (spacing if rounding == "stochastic" else spacing / 2)
    bound = bound + np.where(s < _E4M3_MIN_NORMAL, _E2M1_MAX * _E4M3_HALF_SUBNORMAL_STEP * gds, 0.0)
    bound = bound * (1 + _F32_SLACK) + ref * _F32_SLACK + 7 * _FLT_MIN
    if not gds >= _FLT_MIN:
        bound = ref + _E2M1_MAX * step * (1 + _F32_SLACK) + 7 * _FLT_MIN
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
    q = _options(x, q, axis, block_2d, hadamard, rounding, key, hadamard_signs)
    xhat = _decode(q).values
    nonfinite = ~np.isfinite(_f64(x))
    if not nonfinite.any() and np.isnan(float(q.amax)):
        raise AssertionError("x is finite but q.amax is NaN: every element decodes to NaN")
    if nonfinite.any():
        ok = np.isnan(xhat)
        if ok.all():
            return
        first = _index(int(np.argmax(nonfinite)), x.shape)
        bad = _index(int(np.argmin(ok)), x.shape)
        raise AssertionError(
            f"non-finite input handling: x has {int(nonfinite.sum())} non-finite elements "
            f"(first at {first}) and q.amax={float(q.amax)}; every dequantized element must "
            f"be NaN, but {_describe(bad, q)} dequantizes to {xhat[bad]}"
        )
    err = np.abs(_reference(x, q, hadamard_signs) - xhat)
    bound = quantization_error_bound(x, q, rounding=rounding, hadamard_signs=hadamard_signs)
    over = err > bound
    if not over.any():
        return
    ratio = np.where(over, err / np.maximum(bound, np.finfo(np.float64).tiny), 0)
    idx = _index(int(np.argmax(ratio)), x.shape)
    s, step, gds = _decode_steps(q)
    ref = _reference(x, q, hadamard_signs)
    kind = ("zero" if s[idx] == 0 else "E4M3-subnormal" if s[idx] < _E4M3_MIN_NORMAL
            else "normal")
    hint = ""
    if step[idx] > 0 and abs(ref[idx]) / step[idx] > 7:
        hint = (" (|x|/(s·gds) > 7: the block scale is too small for its values — a "
                "global amax below max|x|, or a corrupted scale?)")
    raise AssertionError(
        f"NVFP4 quantization error exceeds its bound at {int(over.sum())} of {over.size} "
        f"elements; worst: {_describe(idx, q)}: x={ref[idx]!r}, dequantized={xhat[idx]!r}, "
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
    d = _decode(q)
    q2 = implementation.quantize(d.values.astype(np.float32), axis=q.axis, block_2d=q.block_2d,
                         amax=q.amax)
    if np.isnan(float(q.amax)):
        if not np.isnan(float(q2.amax)):
            raise AssertionError(
                f"q.amax is NaN (non-finite input) but its requantization has amax={q2.amax}")
        return
    chex.assert_shape([q2.data, q2.scales], [q.data.shape, q.scales.shape])
    d2 = _decode(q2)
    checked = d.scales >= _E4M3_MIN_NORMAL  # per element: normal E4M3 block scale
    zero = d.scales == 0
    changed = (_bits(d.scales.astype(np.float32)) != _bits(d2.scales.astype(np.float32)))
    bad = np.argwhere(changed & (checked | zero))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        block = _block_of(idx, q)
        blocked = (q.axis, q.tile_axis)
        in_block = np.all(np.stack([
            np.indices(q.shape)[a] // (_BLOCK if a in blocked else 1) == block[a]
            for a in range(q.ndim)]), axis=0)
        top = int((d.codes[in_block] & (_SIGN_BIT - 1)).max())
        hint = "" if top == 7 else (
            f"; the block's largest code magnitude is {top}, not 7 (6.0): round-to-nearest "
            "always rounds a block's largest element to ±6 — was q stochastically rounded?")
        raise AssertionError(
            f"round trip changed the block scale of {int(changed.sum())} elements; first: "
            f"block {block} along axis {q.axis}: scale {d.scales[idx]!r} requantized to "
            f"{d2.scales[idx]!r}{hint}"
        )
    magnitude = lambda c: c & (_SIGN_BIT - 1)  # noqa: E731
    c1, c2 = d.codes, d2.codes
    same = np.where(zero, magnitude(c2) == 0,
                    (c1 == c2) | ((magnitude(c1) == 0) & (magnitude(c2) == 0)))
    bad = np.argwhere(~same & (checked | zero))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        raise AssertionError(
            f"round trip changed {len(bad)} codes; first: {_describe(idx, q)}: code "
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
        ba, bb = _bits(a), _bits(b)
        if not np.array_equal(ba, bb):
            where = tuple(int(i) for i in np.argwhere(ba != bb)[0]) if ba.ndim else ()
            raise AssertionError(
                f"quantize(-x) changed the {what}: at {where}: "
                f"{np.asarray(a.astype(jnp.float32))[where]!r} vs "
                f"{np.asarray(b.astype(jnp.float32))[where]!r}")
    c, cn = _decode(q).codes, _decode(qn).codes
    ref = np.abs(_reference(x, q, hadamard_signs))
    zero_like = ~(ref >= _FLT_MIN)  # ±0, subnormal, NaN (inf: rht/abs give inf or NaN)
    zero_like |= ~np.isfinite(_f64(x)) if not hadamard else ~np.isfinite(ref)
    ok = (cn == c ^ _SIGN_BIT) | (zero_like & (cn == c))
    if not ok.all():
        idx = _index(int(np.argmin(ok)), x.shape)
        raise AssertionError(
            f"sign symmetry broken at {int((~ok).sum())} of {ok.size} elements; first: "
            f"{_describe(idx, q)}: x={_reference(x, q, hadamard_signs)[idx]!r} has code "
            f"{int(c[idx])} but -x has code {int(cn[idx])} (expected {int(c[idx] ^ _SIGN_BIT)})"
        )


# ---------------------------------------------------------------- stochastic rounding


def unbiasedness_sample_size(
    detectable_bias: float,
    num_elements: int,
    *,
    false_alarm_rate: float = 1e-6,
    power: float = 0.999,
) -> int:
    """Samples needed to detect a rounding bias of ``detectable_bias`` steps.

    One rounding of an element with step ``h`` (the distance between its two grid
    neighbours) gives ``lo`` or ``hi``; the error in steps has variance ``p(1-p) <=
    1/4``, so the mean of ``n`` draws has standard deviation ``<= 1/(2√n)``. Each of
    ``N`` elements is tested two-sided at ``z_a = Φ⁻¹(1 - α/(2N))`` (Bonferroni: the
    probability that an unbiased function fails is at most ``α``); a bias ``δ`` is
    then found with probability ``>= power`` when ``2δ√n >= z_a + z_b``,
    ``z_b = Φ⁻¹(power)``::

        n = ceil(((z_a + z_b) / (2 δ))²)

    Args:
      detectable_bias: ``δ``, the bias to detect, in rounding steps (0 < δ < 0.5).
      num_elements: ``N``, the number of elements tested at once.
      false_alarm_rate: ``α``.
      power: the probability of detecting a bias ``δ``.

    Returns:
      ``n``.

    Example:
      >>> from fp4jax.testing import unbiasedness_sample_size
      >>> unbiasedness_sample_size(0.1, 256)
      2016
    """
    if not 0 < detectable_bias < 0.5:
        raise ValueError(f"detectable_bias must be in (0, 0.5) steps, got {detectable_bias}")
    if not 0 < false_alarm_rate < 1 or not 0 < power < 1:
        raise ValueError(
            f"false_alarm_rate and power must be in (0, 1), got {false_alarm_rate}, {power}")
    if num_elements < 1:
        raise ValueError(f"num_elements must be >= 1, got {num_elements}")
    phi_inv = statistics.NormalDist().inv_cdf
    z_a = phi_inv(1 - false_alarm_rate / (2 * num_elements))
    z_b = phi_inv(power)
    return math.ceil(((z_a + z_b) / (2 * detectable_bias)) ** 2)


def stochastic_rounding_target(
    x: jax.typing.ArrayLike,
    *,
    axis: int = -1,
    block_2d: bool = False,
    hadamard: bool = False,
    hadamard_signs: Sequence[int] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """What NVFP4 stochastic rounding of ``x`` must equal on average, and its step.

    The block and global scales do not depend on the rounding, so they are taken
    from a round-to-nearest quantization. Per element (RECIPE.md §2, §5), with the
    decode step ``f = s·gds``: the expected decoded value is ``x`` clamped to the
    block's range ``±6f`` (a value just above the range clamps to 6 before rounding),
    and the rounding step is ``f`` times the E2M1 grid spacing at ``|x|/f``. With
    ``hadamard`` both are in the rotated domain. Blocks with a zero scale have
    expected value 0 and step 0.

    Returns:
      ``(expected, step)``, float32 arrays of ``x``'s shape, for
      `assert_stochastic_rounding_unbiased`.

    Example:
      >>> import jax.numpy as jnp
      >>> from fp4jax.testing import stochastic_rounding_target
      >>> expected, step = stochastic_rounding_target(jnp.array([[0.7, 2.5, 5.0, 6.0] * 4]))
      >>> expected[0, :4].tolist(), step[0, :4].tolist()
      ([0.699999988079071, 2.5, 5.0, 6.0], [0.5, 1.0, 2.0, 2.0])
    """
    x = jnp.asarray(x)
    q = implementation.quantize(x, axis=axis, block_2d=block_2d, hadamard=hadamard,
                        hadamard_signs=hadamard_signs)
    ref = _reference(x, q, hadamard_signs)
    _, f, _ = _decode_steps(q)
    expected = np.sign(ref) * np.minimum(np.abs(ref), _E2M1_MAX * f)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(f > 0, np.abs(ref) / f, 0.0)
    step = f * _grid_spacing(np.minimum(u, _E2M1_MAX))
    return jnp.asarray(expected, jnp.float32), jnp.asarray(step, jnp.float32)


def assert_stochastic_rounding_unbiased(
    fn: Callable[[jax.Array], jax.Array],
    key_sampler: Callable[[jax.Array], jax.Array],
    *,
    expected: jax.typing.ArrayLike,
    step: jax.typing.ArrayLike,
    detectable_bias: float,
    false_alarm_rate: float = 1e-6,
    power: float = 0.999,
    max_samples: int = 1_000_000,
) -> int:
    """Asserts that a stochastic rounding ``fn(key)`` equals ``expected`` on average.

    Draws ``n = unbiasedness_sample_size(detectable_bias, N, false_alarm_rate,
    power)`` keys ``key_sampler(i)``, ``i = 0..n-1`` (rounded up to whole chunks) and
    tests, per element, the mean of ``(fn(key) - expected) / step``: an unbiased
    function fails with probability at most ``false_alarm_rate``; a bias of
    ``detectable_bias`` steps in any element is caught with probability ``power``.
    Elements whose ``step`` is 0 must equal ``expected`` exactly in every draw.

    Args:
      fn: ``key -> rounded array``; traced with `jax.vmap` (must be vmappable).
      key_sampler: ``i -> key`` for an int32 index (vmapped), e.g.
        ``lambda i: jax.random.fold_in(base_key, i)``.
      expected: the exact value each element must have on average
        (see `stochastic_rounding_target`).
      step: per element, the distance between its two rounding candidates: the unit
        of ``detectable_bias``.
      detectable_bias: the bias (in steps) the test must detect, e.g. 0.1.
      false_alarm_rate: the probability that an unbiased function fails.
      power: the probability of detecting a bias of ``detectable_bias``.
      max_samples: refuse (`ValueError`) to run more samples than this.

    Returns:
      The number of samples drawn.

    Raises:
      AssertionError: naming the element with the largest bias, in steps and in
        standard errors, and the threshold.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import (assert_stochastic_rounding_unbiased,
      ...                             stochastic_rounding_target)
      >>> x = jax.random.normal(jax.random.key(0), (2, 32))
      >>> expected, step = stochastic_rounding_target(x)
      >>> n = assert_stochastic_rounding_unbiased(
      ...     lambda k: fp4jax.dequantize(fp4jax.quantize(x, rounding="stochastic", key=k)),
      ...     lambda i: jax.random.fold_in(jax.random.key(1), i),
      ...     expected=expected, step=step, detectable_bias=0.2)
    """
    expected = jnp.asarray(expected, jnp.float32)
    step = jnp.broadcast_to(jnp.asarray(step, jnp.float32), expected.shape)
    num = max(expected.size, 1)
    n = unbiasedness_sample_size(detectable_bias, num, false_alarm_rate=false_alarm_rate,
                                 power=power)
    if n > max_samples:
        raise ValueError(
            f"detecting a bias of {detectable_bias} steps over {num} elements needs {n} "
            f"samples, more than max_samples={max_samples}")
    chunk = max(1, min(n, 2**22 // num))
    chunks = -(-n // chunk)
    safe_step = jnp.where(step > 0, step, 1.0)

    @jax.jit
    def moments(start):
        keys = jax.vmap(key_sampler)(start + jnp.arange(chunk, dtype=jnp.int32))
        samples = jax.vmap(fn)(keys)
        chex.assert_shape(samples, (chunk,) + expected.shape)
        d = samples.astype(jnp.float32) - expected
        return jnp.sum(d / safe_step, axis=0), jnp.max(jnp.abs(d), axis=0)

    total = np.zeros(expected.shape, np.float64)
    worst_abs = np.zeros(expected.shape, np.float64)
    for c in range(chunks):
        s, m = moments(jnp.int32(c * chunk))
        total += np.asarray(s, np.float64)
        worst_abs = np.maximum(worst_abs, np.asarray(m, np.float64))
    n = chunks * chunk
    step_np = np.asarray(step, np.float64)
    exact = step_np == 0
    if (exact & (worst_abs > 0)).any():
        idx = _index(int(np.argmax(np.where(exact, worst_abs, -1))), expected.shape)
        raise AssertionError(
            f"element {idx} has rounding step 0 (expected exactly {float(expected[idx])!r}) "
            f"but a draw differed by {worst_abs[idx]:.6g}")
    bias = np.where(exact, 0.0, total / n)  # mean error in steps
    z_a = statistics.NormalDist().inv_cdf(1 - false_alarm_rate / (2 * num))
    threshold = z_a / (2 * math.sqrt(n))
    if np.nanmax(np.abs(bias), initial=0.0) > threshold or np.isnan(bias).any():
        idx = _index(int(np.argmax(np.where(np.isnan(bias), np.inf, np.abs(bias)))),
                     expected.shape)
        raise AssertionError(
            f"stochastic rounding is biased: element {idx} averages {bias[idx]:+.4f} steps "
            f"(step {step_np[idx]:.6g}, expected value {float(expected[idx])!r}) over {n} "
            f"draws, {abs(bias[idx]) * 2 * math.sqrt(n):.1f} standard errors; threshold "
            f"{threshold:.4f} steps (z={z_a:.2f}, false-alarm rate {false_alarm_rate:g} over "
            f"{num} elements; sized to detect {detectable_bias} steps with power {power})"
        )
    return n


# ---------------------------------------------------------------- recipe conformance


def _normalize_dn(dn, lhs_ndim: int, rhs_ndim: int):
    (lc, rc), (lb, rb) = dn
    norm = lambda dims, nd: tuple(int(d) % nd for d in dims)  # noqa: E731
    return (norm(lc, lhs_ndim), norm(rc, rhs_ndim)), (norm(lb, lhs_ndim), norm(rb, rhs_ndim))


@dataclasses.dataclass(frozen=True)
class _Canonical:
    """``lhs``/``rhs`` as ``(B, M, K) × (B, K, N)``, as `fp4jax.dot_general` sees them."""

    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    lhs_perm: tuple[int, ...]
    rhs_perm: tuple[int, ...]
    bmkn: tuple[int, int, int, int]
    out_shape: tuple[int, ...]

    @classmethod
    def of(cls, lhs_shape, rhs_shape, dn) -> _Canonical:
        (lc, rc), (lb, rb) = dn
        lf = tuple(d for d in range(len(lhs_shape)) if d not in lb + lc)
        rf = tuple(d for d in range(len(rhs_shape)) if d not in rb + rc)
        size = lambda shape, dims: math.prod(shape[d] for d in dims)  # noqa: E731
        bmkn = (size(lhs_shape, lb), size(lhs_shape, lf), size(lhs_shape, lc),
                size(rhs_shape, rf))
        out = tuple(lhs_shape[d] for d in lb + lf) + tuple(rhs_shape[d] for d in rf)
        return cls(tuple(lhs_shape), tuple(rhs_shape), lb + lf + lc, rb + rc + rf, bmkn, out)

    def lhs(self, x):
        b, m, k, _ = self.bmkn
        return jnp.transpose(x, self.lhs_perm).reshape(b, m, k)

    def rhs(self, w):
        b, _, k, n = self.bmkn
        return jnp.transpose(w, self.rhs_perm).reshape(b, k, n)

    def lhs_back(self, da):
        shape = tuple(self.lhs_shape[d] for d in self.lhs_perm)
        return jnp.transpose(da.reshape(shape), np.argsort(self.lhs_perm))

    def rhs_back(self, db):
        shape = tuple(self.rhs_shape[d] for d in self.rhs_perm)
        return jnp.transpose(db.reshape(shape), np.argsort(self.rhs_perm))


def rebuild_gemms(
    lhs: jax.Array,
    rhs: jax.Array,
    cotangent: jax.Array,
    dimension_numbers: Any,
    recipe: Recipe,
    key: jax.Array | None,
) -> dict[str, jax.Array]:
    """The fprop, dgrad and wgrad results of a quantized ``dot_general``, from public parts.

    Per RECIPE.md §6 and the `fp4jax.Recipe`: operands are brought to ``(B, M, K) ×
    (B, K, N)``; each NVFP4 operand is ``fp4jax.quantize``-d along its GEMM's
    contraction axis with its role's options (Hadamard operands zero-padded to whole
    16-runs; stochastic ones keyed ``fold_in(key, role_id)`` with `fp4jax.dot_general`'s
    role numbers), dgrad reuses fprop's 16×16-tiled weight when the recipe gives both
    the same tiled operand, and each GEMM is ``fp4jax.matmul`` (or a float32-accumulated
    ``lax.dot_general`` for a bf16 GEMM).

    Returns:
      ``{"fprop": y, "dgrad": d_lhs, "wgrad": d_rhs}`` in the shapes and dtypes
      ``jax.vjp(fp4jax.dot_general)`` gives for ``cotangent``.
    """
    lhs, rhs, g = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(cotangent)
    dn = _normalize_dn(dimension_numbers, lhs.ndim, rhs.ndim)
    c = _Canonical.of(lhs.shape, rhs.shape, dn)
    r = recipe
    a, b = c.lhs(lhs), c.rhs(rhs)
    gc = g.reshape(c.bmkn[0], c.bmkn[1], c.bmkn[3])

    def q(t, axis, role):
        op = getattr(r, role)
        if op.hadamard:
            t = layout.pad_to_block(t, axis)
        return implementation.quantize(
            t, axis=axis, block_2d=op.block_2d, rounding=op.rounding,
            key=jax.random.fold_in(key, _ROLE_IDS[role]) if op.stochastic else None,
            hadamard=op.hadamard, hadamard_signs=r.hadamard_signs if op.hadamard else None)

    def gemm(u, v):  # (B, M, K) x (B, K, N) -> float32
        if isinstance(u, NVFP4Array):
            return implementation.matmul(u, v, preferred_element_type=jnp.float32)
        return jax.lax.dot_general(u, v, (((2,), (1,)), ((0,), (0,))),
                                   preferred_element_type=jnp.float32)

    quantized = r.fprop_lhs.quantized
    qa = q(a, 2, "fprop_lhs") if quantized else a
    qb = q(b, 1, "fprop_rhs") if quantized else b
    y = gemm(qa, qb).reshape(c.out_shape).astype(g.dtype)

    if not r.dgrad_grad.quantized:
        dgrad = gemm(gc, jnp.swapaxes(b, 1, 2))
    else:
        # RECIPE.md §6: dgrad uses "the same 2D quantization" of W as fprop.
        shared = r.dgrad_rhs == r.fprop_rhs and r.fprop_rhs.block_2d
        w = qb if shared else q(b, 2, "dgrad_rhs")
        dgrad = gemm(q(gc, 2, "dgrad_grad"), w.mT)
    if not r.wgrad_grad.quantized:
        wgrad = gemm(jnp.swapaxes(a, 1, 2), gc)
    else:
        shared = r.wgrad_lhs == r.fprop_lhs and r.fprop_lhs.block_2d
        xq = qa if shared else q(a, 1, "wgrad_lhs")
        wgrad = gemm(xq.mT, q(gc, 1, "wgrad_grad"))
    return {"fprop": y, "dgrad": c.lhs_back(dgrad).astype(lhs.dtype),
            "wgrad": c.rhs_back(wgrad).astype(rhs.dtype)}


_GEMM_NAMES = {
    "fprop": ("forward Y = X·W", "fprop_lhs", "fprop_rhs"),
    "dgrad": ("data gradient dX = dY·Wᵀ", "dgrad_grad", "dgrad_rhs"),
    "wgrad": ("weight gradient dW = Xᵀ·dY", "wgrad_lhs", "wgrad_grad"),
}


def _first_difference(got, want) -> tuple[int, tuple[int, ...]] | None:
    got, want = np.asarray(got), np.asarray(want)
    both_nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    diff = (_bits(got) != _bits(want)) & ~both_nan
    if not diff.any():
        return None
    return int(diff.sum()), _index(int(np.argmax(diff)), got.shape)


def _call(fn, a, b, dn, recipe, key):
    if fn is None:
        return dot_general(a, b, dn, recipe=recipe, key=key)
    return fn(a, b, dn)


def _conformance(lhs, rhs, cotangent, key, *, fn, dn, recipe):
    """(fn's forward output, its two gradients, the cotangent), rebuild_gemms(...)."""
    y, vjp = jax.vjp(lambda a, b: _call(fn, a, b, dn, recipe, key), lhs, rhs)
    if cotangent is None:
        cotangent = jax.random.normal(jax.random.key(0), y.shape, jnp.float32)
    chex.assert_shape(cotangent, y.shape)
    cotangent = cotangent.astype(y.dtype)
    return (y, *vjp(cotangent), cotangent), rebuild_gemms(
        lhs, rhs, cotangent, dn, recipe, key)


_conformance_jit = jax.jit(_conformance, static_argnames=("fn", "dn", "recipe"))


def assert_conforms_to_recipe(
    lhs: jax.typing.ArrayLike,
    rhs: jax.typing.ArrayLike,
    dimension_numbers: Any,
    recipe: Recipe,
    key: jax.Array | None,
    *,
    fn: Callable[[jax.Array, jax.Array, Any], jax.Array] | None = None,
    cotangent: jax.typing.ArrayLike | None = None,
    jit: bool = True,
) -> None:
    """Asserts that each GEMM of a quantized ``dot_general`` is quantized as ``recipe`` says.

    Runs ``jax.vjp(fn, lhs, rhs)`` and compares the forward output and both
    gradients, bit for bit, with `rebuild_gemms` (each operand quantized with
    `fp4jax.quantize` per its role in ``recipe``, multiplied with `fp4jax.matmul`).

    Args:
      lhs, rhs, dimension_numbers: the ``dot_general`` call.
      recipe: the `fp4jax.Recipe` the call must follow.
      key: the call's stochastic-rounding key (None if the recipe has no SR).
      fn: the function under test, ``fn(lhs, rhs, dimension_numbers)``; default
        ``dot_general(..., recipe=recipe, key=key)``. For a layer's op, e.g.
        `fp4jax.flax.DotGeneral`, call it inside a ``step_scope`` and pass that
        layer's key, ``fp4jax.layer_key(step_key, name)``.
      cotangent: the output cotangent for the backward GEMMs; default a standard
        normal array (fixed seed) of the output's shape and dtype.
      jit: run ``fn``'s forward and backward and the rebuilt GEMMs as one jitted
        program (compiled once per shape, and cached across calls when ``fn`` is the
        same object, e.g. None); False calls them one by one, as written.

    Raises:
      AssertionError: naming the GEMM (and its two operand roles) that differs, the
        number of differing elements and the first of them.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import assert_conforms_to_recipe
      >>> x = jax.random.normal(jax.random.key(0), (32, 48), jnp.bfloat16)
      >>> w = jax.random.normal(jax.random.key(1), (48, 16), jnp.bfloat16)
      >>> assert_conforms_to_recipe(x, w, (((1,), (0,)), ((), ())), fp4jax.Recipe.nvfp4(),
      ...                           jax.random.key(2))
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp4jax.Recipe, got {type(recipe).__name__}")
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    dn = _normalize_dn(dimension_numbers, lhs.ndim, rhs.ndim)
    cotangent = None if cotangent is None else jnp.asarray(cotangent)
    check = _conformance_jit if jit else _conformance
    (y, dlhs, drhs, _), want = check(lhs, rhs, cotangent, key, fn=fn, dn=dn, recipe=recipe)
    for gemm, got in (("fprop", y), ("dgrad", dlhs), ("wgrad", drhs)):
        chex.assert_shape(got, want[gemm].shape)
        chex.assert_type(got, want[gemm].dtype)
        found = _first_difference(got, want[gemm])
        if found is None:
            continue
        count, idx = found
        title, ra, rb = _GEMM_NAMES[gemm]
        g, w = np.asarray(got, np.float64)[idx], np.asarray(want[gemm], np.float64)[idx]
        raise AssertionError(
            f"{gemm} ({title}) does not conform to the recipe: {count} of {got.size} "
            f"elements differ from the GEMM rebuilt with {ra}={getattr(recipe, ra)} and "
            f"{rb}={getattr(recipe, rb)}; first at {idx}: got {g!r}, rebuilt {w!r} "
            f"(|diff| {abs(g - w):.6g})"
        )


# ---------------------------------------------------------------- model-level checks


def _leaf_name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".") or "<root>"


def assert_gradients_close_to_unquantized(
    loss_fn_quantized: Callable[[Any, Any], jax.Array],
    loss_fn_reference: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    *,
    max_relative_error: float,
    min_cosine: float | None = None,
) -> dict[str, tuple[float, float]]:
    """Asserts per parameter that quantized gradients stay close to high-precision ones.

    A sanity check before a long run: for each leaf ``p`` of ``params``, with ``g_q``
    the gradient of ``loss_fn_quantized`` and ``g`` that of ``loss_fn_reference`` on
    the same ``batch``,

    * relative error ``‖g_q − g‖ / ‖g‖ <= max_relative_error`` (Frobenius norms;
      a leaf with ``g = 0`` needs ``g_q = 0``), and
    * if given, cosine similarity ``⟨g_q, g⟩ / (‖g_q‖‖g‖) >= min_cosine``.

    A relative error ``e < 1`` already implies cosine ``>= √(1 − e²)``; ``min_cosine``
    is for checking direction more tightly than size. As a guide, one NVFP4 GEMM
    with two quantized operands has relative errors of about 0.13–0.2 on Gaussian
    data (``tests/test_dot_general.py``); deeper models compound them.

    Args:
      loss_fn_quantized: ``(params, batch) -> scalar loss`` of the quantized model
        (open a `fp4jax.flax.step_scope` inside it for stochastic rounding).
      loss_fn_reference: the same loss without quantization.
      params: the parameter pytree (e.g. an ``nnx.State``).
      batch: one batch.
      max_relative_error: the bound on the relative error, per leaf.
      min_cosine: optional bound on the cosine similarity, per leaf.

    Returns:
      ``{leaf name: (relative error, cosine)}``.

    Raises:
      AssertionError: naming every leaf out of bounds and by how much.

    Example:
      >>> import functools, jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import assert_gradients_close_to_unquantized
      >>> dn = (((1,), (0,)), ((), ()))
      >>> def loss(dot, p, x):
      ...   return jnp.mean(jnp.tanh(dot(x, p["w"], dn)) ** 2)
      >>> q = functools.partial(fp4jax.dot_general, recipe=fp4jax.Recipe.nvfp4_no_sr())
      >>> p = {"w": jax.random.normal(jax.random.key(1), (64, 32)) / 8}
      >>> x = jax.random.normal(jax.random.key(3), (128, 64))
      >>> stats = assert_gradients_close_to_unquantized(
      ...     functools.partial(loss, q), functools.partial(loss, jax.lax.dot_general),
      ...     p, x, max_relative_error=0.5, min_cosine=0.9)
      >>> {name: (round(err, 2), round(cos, 2)) for name, (err, cos) in stats.items()}
      {'w': (0.22, 0.98)}
    """
    if not max_relative_error > 0:
        raise ValueError(f"max_relative_error must be > 0, got {max_relative_error}")
    g_q = jax.jit(jax.grad(loss_fn_quantized))(params, batch)
    g_r = jax.jit(jax.grad(loss_fn_reference))(params, batch)
    leaves_q = jax.tree_util.tree_flatten_with_path(g_q)[0]
    leaves_r = jax.tree_util.tree_flatten_with_path(g_r)[0]
    if [p for p, _ in leaves_q] != [p for p, _ in leaves_r]:
        raise AssertionError("the two losses give gradients of different tree structures")
    stats, failures = {}, []
    for (path, a), (_, b) in zip(leaves_q, leaves_r, strict=True):
        name = _leaf_name(path)
        a, b = _f64(a).ravel(), _f64(b).ravel()
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            failures.append(f"{name}: non-finite gradient (quantized: "
                            f"{int((~np.isfinite(a)).sum())}, reference: "
                            f"{int((~np.isfinite(b)).sum())} non-finite of {a.size})")
            continue
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        rel = np.linalg.norm(a - b) / nb if nb > 0 else (0.0 if na == 0 else np.inf)
        cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else float(na == nb)
        stats[name] = (float(rel), cos)
        if rel > max_relative_error:
            failures.append(f"{name}: relative error {rel:.4f} > {max_relative_error} "
                            f"(‖g_q‖={na:.4g}, ‖g‖={nb:.4g}, cosine {cos:.4f})")
        elif min_cosine is not None and cos < min_cosine:
            failures.append(f"{name}: cosine similarity {cos:.4f} < {min_cosine} "
                            f"(relative error {rel:.4f})")
    if failures:
        raise AssertionError(
            f"quantized gradients are out of bounds for {len(failures)} of {len(stats)} "
            "parameters:\n  " + "\n  ".join(failures))
    return stats


def _devices(backends: Sequence[str]) -> list[jax.Device]:
    found = []
    for b in backends:
        try:
            found.append(jax.devices(b)[0])
        except RuntimeError:
            warnings.warn(f"assert_bitwise_equal_across: backend {b!r} is not present; "
                          "skipped", stacklevel=3)
    return found


def assert_bitwise_equal_across(
    fn: Callable[..., Any],
    *args: Any,
    backends: Sequence[str] = ("cpu", "gpu"),
    jit_variants: bool = True,
    op_by_op: bool = False,
) -> tuple[str, ...]:
    """Asserts that ``fn(*args)`` gives the same bits in every variant (chex.variants style).

    Variants, for each backend present (a missing one is skipped with a warning):
    ``without_jit`` (``fn`` called as is, arguments placed on the backend's device),
    and with ``jit_variants`` also ``with_jit`` (``jax.jit(fn)``); with ``op_by_op``
    also ``disable_jit`` (every operation dispatched alone, as under
    ``jax.disable_jit()``: the strictest check that no XLA fusion changes a
    rounding). All outputs must equal the first variant's bit for bit, except that
    a NaN equals any NaN. Pass the data as ``args``: a computation over closure constants
    is folded by XLA at compile time, where it may reassociate products of constants.
    Bind static arguments with `functools.partial`.

    Args:
      fn: the function.
      *args: its array (pytree) arguments, e.g. a ``jax.random`` key.
      backends: platform names to compare (``"cpu"``, ``"gpu"``, ``"tpu"``).
      jit_variants: also compare ``jax.jit(fn)``.
      op_by_op: also compare under ``jax.disable_jit()``.

    Returns:
      The names of the variants compared, e.g. ``("without_jit@cpu", "with_jit@cpu")``.

    Raises:
      AssertionError: naming the two variants, the output leaf, the number of
        differing elements and the first one, with both bit patterns.
      ValueError: if no backend is present.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import assert_bitwise_equal_across
      >>> x = jax.random.normal(jax.random.key(0), (4, 32))
      >>> assert_bitwise_equal_across(lambda x: fp4jax.dequantize(fp4jax.quantize(x)), x,
      ...                             backends=("cpu",))
      ('without_jit@cpu', 'with_jit@cpu')
    """
    devices = _devices(backends)
    if not devices:
        raise ValueError(f"none of the backends {tuple(backends)} is present")
    variants: list[tuple[str, Callable[..., Any]]] = [("without_jit", fn)]
    if jit_variants:
        variants.append(("with_jit", jax.jit(fn)))
    if op_by_op:
        def eager(*a):
            with jax.disable_jit():
                return fn(*a)
        variants.append(("disable_jit", eager))

    results = []
    for dev in devices:
        placed = jax.device_put(args, dev)
        for name, f in variants:
            with jax.default_device(dev):
                out = f(*placed)
            out = jax.tree_util.tree_map(
                lambda a: jax.random.key_data(a)
                if jnp.issubdtype(jnp.asarray(a).dtype, jax.dtypes.prng_key) else a, out)
            results.append((f"{name}@{dev.platform}", jax.device_get(out)))
    ref_name, ref = results[0]
    ref_leaves, ref_tree = jax.tree_util.tree_flatten_with_path(ref)
    for name, out in results[1:]:
        leaves, tree = jax.tree_util.tree_flatten_with_path(out)
        if tree != ref_tree:
            raise AssertionError(f"{name} returns a different tree than {ref_name}: "
                                 f"{tree} vs {ref_tree}")
        for (path, a), (_, b) in zip(leaves, ref_leaves, strict=True):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape or a.dtype != b.dtype:
                raise AssertionError(
                    f"{name} vs {ref_name}: output {_leaf_name(path)} is {a.dtype}{a.shape} "
                    f"vs {b.dtype}{b.shape}")
            found = (_first_difference(a, b) if jnp.issubdtype(a.dtype, jnp.floating)
                     else (None if np.array_equal(a, b) else
                           (int((a != b).sum()), _index(int(np.argmax(a != b)), a.shape))))
            if found is None:
                continue
            count, idx = found
            raise AssertionError(
                f"{name} differs from {ref_name} in output {_leaf_name(path)}: {count} of "
                f"{a.size} elements; first at {idx}: {a[idx]!r} (bits {_bits(a)[idx]:#x}) "
                f"vs {b[idx]!r} (bits {_bits(b)[idx]:#x})"
            )
    return tuple(name for name, _ in results)
