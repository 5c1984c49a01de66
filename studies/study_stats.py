"""Interval math of the validation study (issue 12): Student-t intervals of a mean, with
seeds treated as independent or clustered by what they share, a permutation test of
whether they cluster at all, Welch intervals of a difference, the seeds a target
half-width needs, and Stein's two-stage interval, whose total seeds a first stage's
spread fixes.

The study reports each gap as a mean over seeds with a 95% interval; an interval wider
than ±`WIDE_PP` percentage points does not resolve it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

T_975 = {
    1: 12.706204736, 2: 4.30265273, 3: 3.182446305, 4: 2.776445105, 5: 2.570581836,
    6: 2.446911851, 7: 2.364624252, 8: 2.306004135, 9: 2.262157163, 10: 2.228138852,
    11: 2.20098516, 12: 2.17881283, 13: 2.160368656, 14: 2.144786688, 15: 2.131449546,
    16: 2.119905299, 17: 2.109815578, 18: 2.10092204, 19: 2.093024054, 20: 2.085963447,
    21: 2.079613845, 22: 2.073873068, 23: 2.06865761, 24: 2.063898562, 25: 2.059538553,
    26: 2.055529439, 27: 2.051830516, 28: 2.048407142, 29: 2.045229642, 30: 2.042272456,
}
"""Two-sided 95% quantiles of Student's t (the 0.975 quantile) by degrees of freedom."""


Z_975 = 1.959963985
"""The 0.975 quantile of the standard normal distribution."""


WIDE_PP = 0.3
"""An interval half-width above this many percentage points is too wide (issue 12)."""


def t_critical(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom.

    `T_975` up to 30; above, the normal quantile with the first two Cornish-Fisher terms,
    ``z + (z³ + z) / (4 df) + (5z⁵ + 16z³ + 3z) / (96 df²)`` (within 1e-4 of the exact
    quantile from 31 degrees of freedom on: the study's seed batches reach tens of seeds).

    Example:
      >>> t_critical(2)
      4.30265273
      >>> round(t_critical(47), 4)
      2.0117
    """
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be an int >= 1 (seeds - 1), got {df!r}")
    if df in T_975:
        return T_975[df]
    z = Z_975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclasses.dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values with the half-width of its 95% t-interval (None for n < 2)."""

    mean: float
    half_width: float | None
    n: int
    sd: float | None

    @property
    def wide(self) -> bool:
        """Wider than ±`WIDE_PP` percentage points (for relative gaps), or unknown."""
        return self.half_width is None or self.half_width * 100 > WIDE_PP


def _finite_values(values: Sequence[float]) -> np.ndarray:
    """``values`` as a float64 vector; a ValueError unless one or more, all finite."""
    x = np.asarray(values, np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"need one or more finite values, got {values!r}")
    return x


def mean_interval(values: Sequence[float]) -> Interval:
    """Mean and 95% Student-t interval half-width ``t(0.975, n-1) · sd / √n``.

    Example:
      >>> iv = mean_interval([1.0, 2.0, 3.0])
      >>> iv.mean, round(iv.half_width, 6)
      (2.0, 2.484138)
    """
    x = _finite_values(values)
    if x.size == 1:
        return Interval(float(x[0]), None, 1, None)
    sd = float(np.std(x, ddof=1))
    return Interval(float(np.mean(x)), t_critical(x.size - 1) * sd / math.sqrt(x.size),
                    int(x.size), sd)


def clustered_interval(values: Sequence[float], clusters: Sequence[object]) -> Interval:
    """The mean of ``values`` with a 95% interval that treats each cluster as one draw.

    Values in one cluster (seeds trained as one seed batch) may share a component that
    `mean_interval`, which treats each value as independent, would miss. This is the
    cluster-robust (CR1 sandwich) standard error of the mean,
    ``√(G/(G-1) · Σ_c (Σ_{i∈c} (xᵢ - x̄))²) / n`` over ``G`` clusters, with ``t(0.975,
    G-1)``. With every value a cluster of its own it is `mean_interval`'s; a component
    shared within clusters widens it. ``n`` is the number of values, ``sd`` None, and the
    half-width None with fewer than two clusters.

    Example:
      >>> x = [1.0, 2.0, 3.0, 4.0]
      >>> round(clustered_interval(x, [0, 1, 2, 3]).half_width, 6) == round(
      ...     mean_interval(x).half_width, 6)
      True
      >>> iv = clustered_interval(x, ["a", "a", "b", "b"])  # two clusters: t(1)
      >>> iv.mean, round(iv.half_width, 4)
      (2.5, 12.7062)
    """
    x = _finite_values(values)
    ids = _cluster_ids(clusters, x.size)
    g = int(ids.max()) + 1
    mean = float(np.mean(x))
    if g < 2:
        return Interval(mean, None, int(x.size), None)
    se = float(_clustered_se(x[None, :], ids)[0])
    return Interval(mean, t_critical(g - 1) * se, int(x.size), None)


def cluster_se_ratio(values: Sequence[float], clusters: Sequence[object]) -> float:
    """The cluster-robust standard error of the mean (`clustered_interval`'s, CR1) over
    the independent one, ``sd / √n``: near 1 (or below) when the clusters share nothing,
    above 1 when values in a cluster move together. Needs two or more clusters and values
    that are not all equal.

    Example:
      >>> round(cluster_se_ratio([1.0, 1.1, 3.0, 3.1], ["a", "a", "b", "b"]), 3)
      1.73
    """
    x = _finite_values(values)
    ids = _two_or_more(_cluster_ids(clusters, x.size))
    return float(_se_ratios(x[None, :], ids)[0])


def cluster_permutation_p(values: Sequence[float], clusters: Sequence[object], *,
                          draws: int = 20_000, seed: int = 0) -> float:
    """The chance of a `cluster_se_ratio` at least the observed one if the values were
    exchangeable: the same cluster sizes, the values dealt out at random.

    It asks whether the values cluster at all, free of the cluster-robust error's own
    small-sample spread and of any assumption on the values' distribution (a heavy tail
    is dealt out with them). The p-value is ``(1 + k) / (1 + draws)`` over ``draws``
    random deals of which ``k`` reach the observed ratio; ``seed`` fixes the deals, so a
    report regenerates it exactly.

    Example:
      >>> x = [0.0, 0.1, 0.2, 5.0, 5.1, 5.2, 9.0, 9.1, 9.2]
      >>> cluster_permutation_p(x, [0, 0, 0, 1, 1, 1, 2, 2, 2], draws=2000) < 0.01
      True
    """
    x = _finite_values(values)
    ids = _two_or_more(_cluster_ids(clusters, x.size))
    if not (isinstance(draws, int) and draws >= 1):
        raise ValueError(f"draws must be an int >= 1, got {draws!r}")
    observed = _se_ratios(x[None, :], ids)[0]
    rng = np.random.default_rng(seed)
    reached = 0
    for start in range(0, draws, 4096):  # bounded memory: 4096 deals at a time
        deals = rng.permuted(np.broadcast_to(x, (min(4096, draws - start), x.size)), axis=1)
        # Equal ratios computed in another order differ in the last bits; count them.
        reached += int(np.sum(_se_ratios(deals, ids) >= observed * (1 - 1e-12)))
    return (1 + reached) / (1 + draws)


def _cluster_ids(clusters: Sequence[object], n: int) -> np.ndarray:
    """Cluster labels as 0-based ints in order of first appearance; a ValueError unless
    there is one label per value."""
    if len(clusters) != n:
        raise ValueError(f"need one cluster per value: {n} values, {len(clusters)} clusters")
    index = {c: i for i, c in enumerate(dict.fromkeys(clusters))}
    return np.array([index[c] for c in clusters])


def _two_or_more(ids: np.ndarray) -> np.ndarray:
    """``ids``, or a ValueError where they name fewer than two clusters."""
    if ids.max() < 1:
        raise ValueError(f"need two or more clusters, got {int(ids.max()) + 1}")
    return ids


def _clustered_se(rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The cluster-robust (CR1) standard error of each row's mean over the clusters
    ``ids`` (two or more), ``√(G/(G-1) · Σ_c (Σ_{i∈c} (xᵢ - x̄))²) / n``."""
    n, g = rows.shape[1], int(ids.max()) + 1
    sums = np.zeros((rows.shape[0], g))
    np.add.at(sums, (slice(None), ids), rows - rows.mean(axis=1, keepdims=True))
    return np.sqrt(g / (g - 1) * np.sum(sums**2, axis=1)) / n


def _se_ratios(rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`cluster_se_ratio` of each row of ``rows`` (one deal of the values per row)."""
    n = rows.shape[1]
    independent = np.std(rows, axis=1, ddof=1) / math.sqrt(n)
    if np.any(independent == 0.0):
        raise ValueError("the values are all equal: no spread to compare clusters by")
    return _clustered_se(rows, ids) / independent


def difference_interval(first: Sequence[float], second: Sequence[float]) -> Interval:
    """``mean(second) - mean(first)`` of two independent samples, with a 95% Welch interval.

    The half-width is ``t(0.975, ⌊ν⌋) · √(s₁²/n₁ + s₂²/n₂)`` with the Welch-Satterthwaite
    ``ν`` rounded down (a slightly wider, conservative interval). It compares runs that
    share no trajectory, e.g. one recipe's gaps at two run lengths: the same seed trains
    under a different schedule there, so pairing by seed has no basis. ``n`` is the
    smaller sample's size and ``sd`` is None.

    Example:
      >>> iv = difference_interval([1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
      >>> iv.mean, round(iv.half_width, 4)  # ν = 4: t = 2.7764, √(1/3 + 1/3)
      (2.0, 2.267)
    """
    a, b = (np.asarray(x, np.float64) for x in (first, second))
    for name, x in (("first", a), ("second", b)):
        if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
            raise ValueError(f"{name}: need two or more finite values, got {x.tolist()!r}")
    va, vb = np.var(a, ddof=1) / a.size, np.var(b, ddof=1) / b.size
    mean = float(np.mean(b) - np.mean(a))
    if va + vb == 0.0:
        return Interval(mean, 0.0, int(min(a.size, b.size)), None)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    # Rounded down, but not a whole degree below an integer ν that rounding error
    # put a hair under it (equal variances and sizes give ν = 2(n-1) exactly).
    df = math.floor(df + 1e-9)
    return Interval(mean, t_critical(max(1, df)) * math.sqrt(va + vb),
                    int(min(a.size, b.size)), None)


def seeds_for_half_width(sd: float, target: float) -> int:
    """The fewest seeds whose 95% t-interval of the mean has half-width <= ``target``
    when the per-seed values have standard deviation ``sd``.

    The t quantiles are `t_critical`'s.

    Example:
      >>> seeds_for_half_width(0.010, 0.003)
      46
    """
    if not (sd >= 0 and target > 0):
        raise ValueError(f"need sd >= 0 and target > 0, got sd={sd!r}, target={target!r}")
    n = 2
    while t_critical(n - 1) * sd / math.sqrt(n) > target:
        n += 1
    return n


def stein_seeds(stage_one: Sequence[float], target: float) -> int:
    """The seeds Stein's two-stage rule fixes from a first stage's values: the fewest
    ``N >= n₁`` with ``t(0.975, n₁-1) · s₁ / √N <= target``, where ``s₁`` is the sd of the
    ``n₁`` first-stage values.

    Seeds added until the interval is narrow enough would make the stopping point depend
    on the values themselves; this count depends on the first stage's sd alone, so the
    interval `stein_interval` builds on all ``N`` keeps its 95% coverage.

    Example:
      >>> stein_seeds([1.0, 2.0, 3.0], 0.5)  # t(2) = 4.3027, s₁ = 1: ⌈(4.3027 / 0.5)²⌉
      75
    """
    x = _finite_values(stage_one)
    if x.size < 2 or not target > 0:
        raise ValueError(f"need two or more first-stage values and target > 0, got "
                         f"{x.size} values, target={target!r}")
    reach = t_critical(x.size - 1) * float(np.std(x, ddof=1)) / target
    return max(int(x.size), math.ceil(reach * reach - 1e-9))


def stein_interval(values: Sequence[float], first_stage: int) -> Interval:
    """The mean of all ``values`` with Stein's two-stage 95% half-width
    ``t(0.975, n₁-1) · s₁ / √n``: the first ``first_stage`` values (``n₁``) are the
    first stage, whose sd ``s₁`` the interval keeps however the later values spread.

    Where ``n₁`` normal values fixed ``n`` (`stein_seeds`), the mean of the ``n`` is
    independent of ``s₁``, so ``(mean - μ) √n / s₁`` is t with ``n₁ - 1`` degrees of
    freedom and the coverage is exactly 95%; with ``n`` at `stein_seeds`'s count the
    half-width is at most its target by construction. With no second stage
    (``n = n₁``) it is `mean_interval`'s. ``sd`` is ``s₁``.

    Example:
      >>> iv = stein_interval([1.0, 2.0, 3.0, 2.5], first_stage=3)
      >>> iv.mean, round(iv.half_width, 6)  # t(2) · 1 / √4
      (2.125, 2.151326)
    """
    x = _finite_values(values)
    if not (isinstance(first_stage, int) and 2 <= first_stage <= x.size):
        raise ValueError(f"first_stage must be an int from 2 to the {x.size} values, "
                         f"got {first_stage!r}")
    sd = float(np.std(x[:first_stage], ddof=1))
    return Interval(float(np.mean(x)), t_critical(first_stage - 1) * sd / math.sqrt(x.size),
                    int(x.size), sd)
