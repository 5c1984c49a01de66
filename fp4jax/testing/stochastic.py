"""Stochastic-rounding unbiasedness, with a sample size computed from the bias to detect."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fp4jax import implementation
from fp4jax.numerics.constants import E2M1_MAX
from fp4jax.testing.support import (
    decode_steps,
    grid_spacing,
    reference_values,
    unravel,
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
    ref = reference_values(x, q, hadamard_signs)
    _, f, _ = decode_steps(q)
    expected = np.sign(ref) * np.minimum(np.abs(ref), E2M1_MAX * f)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(f > 0, np.abs(ref) / f, 0.0)
    step = f * grid_spacing(np.minimum(u, E2M1_MAX))
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
        idx = unravel(int(np.argmax(np.where(exact, worst_abs, -1))), expected.shape)
        raise AssertionError(
            f"element {idx} has rounding step 0 (expected exactly {float(expected[idx])!r}) "
            f"but a draw differed by {worst_abs[idx]:.6g}")
    bias = np.where(exact, 0.0, total / n)  # mean error in steps
    z_a = statistics.NormalDist().inv_cdf(1 - false_alarm_rate / (2 * num))
    threshold = z_a / (2 * math.sqrt(n))
    if np.nanmax(np.abs(bias), initial=0.0) > threshold or np.isnan(bias).any():
        idx = unravel(int(np.argmax(np.where(np.isnan(bias), np.inf, np.abs(bias)))),
                     expected.shape)
        raise AssertionError(
            f"stochastic rounding is biased: element {idx} averages {bias[idx]:+.4f} steps "
            f"(step {step_np[idx]:.6g}, expected value {float(expected[idx])!r}) over {n} "
            f"draws, {abs(bias[idx]) * 2 * math.sqrt(n):.1f} standard errors; threshold "
            f"{threshold:.4f} steps (z={z_a:.2f}, false-alarm rate {false_alarm_rate:g} over "
            f"{num} elements; sized to detect {detectable_bias} steps with power {power})"
        )
    return n
