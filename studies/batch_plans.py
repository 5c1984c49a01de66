"""Which seed batches a validation-study call runs, and how long each should take (issue 12).

`batch_plan` groups a study's unfinished units into seed batches (`seed_batch`);
`fork_units` are the BF16-forward-tail units a batch trains as a fork of its own runs
(`tail_variant`); `batch_wall_estimate` and `fork_wall_estimate` say, from the finished
batches' recorded wall times, whether a batch fits the time a call has left. No JAX here:
the estimates read the results' JSON only.

Example:
  >>> from study_specs import STUDIES
  >>> tail_variant(STUDIES["pure_llama"], "four_over_six", "python")
  'four_over_six_tail'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from study_specs import StudySpec, Unit  # first: it puts examples/ on sys.path

# isort: split
from unit_runs import finished, paused_s, result_path


def tail_variant(spec: StudySpec, variant: str, corpus: str) -> str | None:
    """The variant of ``spec`` on ``corpus`` that is ``variant`` with a BF16-forward tail
    (the same recipe and BF16 blocks), which a batch of ``variant`` can fork; or None.

    Example:
      >>> from study_specs import STUDIES
      >>> [tail_variant(STUDIES["pure_llama"], v, "python") for v in ("paper", "no_sr")]
      ['paper_tail', None]
    """
    base = spec.variant(variant)
    if base.bf16_forward_tail:
        return None
    for name in spec.variants_of(corpus):
        v = spec.variant(name)
        if v.bf16_forward_tail and (v.recipe, v.keep_last_share, v.keep_patterns) == (
                base.recipe, base.keep_last_share, base.keep_patterns):
            return name
    return None


def batch_plan(spec: StudySpec, results: Path, size: int, only: dict[str, set] | None = None
               ) -> list[list[Unit]]:
    """The unfinished units (those in ``only``) in seed batches of up to ``size``: units of
    one length, variant and corpus, in the study's order; a lone unit left over is not
    batched (`unit_runs.run_study` trains it)."""
    if size < 2:
        raise ValueError(f"a seed batch has two or more seeds, got size {size}")
    groups: dict[tuple, list[Unit]] = {}
    for u in spec.units():
        if result_path(results, u).exists() or not all(
                getattr(u, k) in v for k, v in (only or {}).items()):
            continue
        groups.setdefault((u.tokens_per_param, u.variant, u.corpus), []).append(u)
    return [chunk for units in groups.values()
            for chunk in (units[i:i + size] for i in range(0, len(units), size))
            if len(chunk) >= 2]


MORE_SEEDS_MARGIN = 1.1
"""How much longer than its own smaller batch scaled up (`scaled_to_seeds`) a variant's
batch of more seeds is assumed to take: the extrapolation's allowance for what the seed
count's other costs (memory, the evaluations' host work) may add."""

UNTIMED_VARIANT_MARGIN = 1.25
"""How much longer than the slowest timed batch a variant with no timed batch of its own
is assumed to take: a variant's recipe sets its cost (4/6 block scaling quantizes each
block twice), so another variant's time is only a guide."""


def diag_pause_estimate(spec: StudySpec, results: Path, tokens_per_param: float
                        ) -> float | None:
    """Seconds to allow for a batch's diagnostics samples (the first compiles the
    diagnostics step), from the finished units of this length.

    Where a seed batch sampled them and a batch of its variant did not, the largest
    difference of their pauses (what the sampling itself cost: the evaluations are in
    both); failing that, the longest pause of a unit that sampled them (its evaluations
    and checkpoints included, so an upper bound); None if none did.
    """
    sampled, plain, unit_pauses = [], {}, []
    for u in spec.units():
        r = finished(results, u) if u.tokens_per_param == tokens_per_param else None
        sb = r and not r.get("forked_from") and r.get("seed_batch")  # a fork: part of a run
        if sb and sb.get("samples_diagnostics"):
            sampled.append((u.variant, sb["paused_s"]))
        elif sb:
            plain[u.variant] = min(plain.get(u.variant, math.inf), sb["paused_s"])
        if r and r.get("diagnostics"):
            unit_pauses.append(sb["paused_s"] if sb else paused_s(r))
    costs = [max(p - plain[v], 0.0) for v, p in sampled if v in plain]
    if costs:
        return max(costs)
    return max(unit_pauses) if unit_pauses else None


def batch_wall_estimate(spec: StudySpec, results: Path, units: Sequence[Unit], *,
                        compiled: bool = False) -> float | None:
    """Seconds the seed batch ``units`` is expected to take, from the finished batches'
    recorded wall times (compilation included), or None when none of its length and kind
    (BF16 or NVFP4) ran.

    The last batch of the same variant and length with the fewest seeds of those with as
    many seeds or more; failing that, its largest batch of fewer seeds scaled up
    (`scaled_to_seeds`) times `MORE_SEEDS_MARGIN`; failing that, times
    `UNTIMED_VARIANT_MARGIN`, the slowest batch of the same length and seed count, or where
    none has that seed count, the slowest batch of the length, scaled up where it had fewer
    seeds (a batch of more seeds bounds it from above: the compilation and evaluations do
    not shrink with the seed count). An NVFP4 variant is estimated from NVFP4 batches only:
    with none of its length timed it gets None, like the study's first batch of a length. A
    BF16 batch is no guide to it: the quantization passes' share of a step differs by model
    (the noise pilot's 3-seed batches on the H200: 121 s BF16, 203 s the paper recipe,
    1.68×, where 1.25× would have started a batch that could not finish). A batch that
    samples diagnostics, estimated from one that did not, adds `diag_pause_estimate` (None
    where that is unknown). Where ``compiled`` (the batch runs on an earlier batch's
    programs: `BatchPrograms`), the own batch it is estimated from counts without its
    compilation (its first step); otherwise batches that ran on an earlier batch's programs
    or loaded theirs from the persistent compilation cache (``compile_cache_hits``) are no
    guide (they compiled nothing, or next to nothing).
    """
    tpp = units[0].tokens_per_param
    timed = [(u.variant, {**sb, "compile_s": r.get("compile_s") or 0.0})
             for u in spec.units() if u.tokens_per_param == tpp
             for r in [finished(results, u)] if r and r.get("seed_batch")
             for sb in [r["seed_batch"]]
             if (compiled or not (sb.get("reused_programs") or sb.get("compile_cache_hits")))
             and not r.get("forked_from")]
    n = len(units)
    mine = [sb for v, sb in timed if v == units[0].variant]
    own = [sb for sb in mine if len(sb["seeds"]) >= n]
    if own:
        # The closest size bounds it tightest: a larger batch's time would skip batches
        # that fit (pure_llama's paper recipe: 302 s for six seeds, 184 s for three).
        fewest = min(len(sb["seeds"]) for sb in own)
        ref, margin = [sb for sb in own if len(sb["seeds"]) == fewest][-1], 1.0
    elif mine:
        ref, margin = max(mine, key=lambda sb: len(sb["seeds"])), MORE_SEEDS_MARGIN
    else:
        quantized = spec.variant(units[0].variant).quantized
        kind = [sb for v, sb in timed if spec.variant(v).quantized == quantized]
        alike = [sb for sb in kind if len(sb["seeds"]) == n] or kind
        if not alike:
            return None
        ref, margin = max(alike, key=lambda sb: scaled_to_seeds(sb, n)), UNTIMED_VARIANT_MARGIN
    # Another variant's batch never ran on this batch's programs: its compilation counts.
    wall = scaled_to_seeds(ref, n, compiled=compiled and bool(mine))
    if any(spec.run_config(u).diag_every for u in units) and not ref.get(
            "samples_diagnostics", False):
        extra = diag_pause_estimate(spec, results, tpp)
        if extra is None:
            return None
        wall += extra
    return wall * margin


def fork_units(spec: StudySpec, results: Path, units: Sequence[Unit],
               only: dict[str, set] | None = None) -> list[Unit]:
    """The unfinished units (those in ``only``) of the batch's `tail_variant` on its seeds,
    which the batch trains as a fork (`train_seeds`)."""
    first = units[0]
    tail = tail_variant(spec, first.variant, first.corpus)
    if tail is None:
        return []
    planned = set(spec.units())
    return [t for u in units for t in [Unit(u.corpus, u.tokens_per_param, tail, u.seed)]
            if t in planned and not result_path(results, t).exists()
            and all(getattr(t, k) in v for k, v in (only or {}).items())]


def fork_wall_estimate(spec: StudySpec, results: Path, units: Sequence[Unit],
                       batch_s: float) -> float:
    """Seconds a fork adds to a batch estimated at ``batch_s``: the longest fork of a
    finished batch of this variant and length with as many seeds or more, else the
    share of the steps after the switch of ``batch_s`` plus the longest compilation of a
    precision switch recorded at this length (a whole batch's compilation if none was)."""
    first = units[0]
    tail = tail_variant(spec, first.variant, first.corpus)
    batches = [(u.variant, r) for u in spec.units()
               if u.tokens_per_param == first.tokens_per_param
               for r in [finished(results, u)] if r and r.get("seed_batch")]
    forked = [r["seed_batch"] for v, r in batches if v == tail and r.get("forked_from")
              and len(r["seed_batch"]["seeds"]) >= len(units)]
    if forked:
        return max(sb["train_wall_s"] for sb in forked)
    switches = [r["seed_batch"].get("mode_switch_s") or 0.0 for _, r in batches]
    compile_s = max(switches, default=0.0) or 0.3 * batch_s
    return spec.variant(tail).bf16_forward_tail * batch_s + compile_s


def scaled_to_seeds(batch: dict, seeds: int, *, compiled: bool = False) -> float:
    """A finished batch's wall time (its ``seed_batch`` record with the unit's
    ``compile_s``) with its training and evaluations (all but the compilations: the first
    step's and a precision switch's, ``mode_switch_s``) scaled up linearly to ``seeds``
    where it had fewer; without the compilations where ``compiled``.

    Linear is an upper bound on the H200: a seed's share of a batched step shrinks as
    seeds are added (pure_llama's paper recipe: 49.3 s per seed outside the compilation in
    batches of three, 45.4 s in batches of five), while the compilation hardly grows
    (49-51 s and 60 s).
    """
    rest = batch["train_wall_s"] - batch["compile_s"] - batch.get("mode_switch_s", 0.0)
    scale = max(1.0, seeds / len(batch["seeds"]))
    return rest * scale if compiled else batch["train_wall_s"] + rest * (scale - 1.0)
