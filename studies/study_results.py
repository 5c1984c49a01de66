"""A study's finished results, read and paired (issue 12): the units' JSON by group and
variant, and the relative gaps paired by seed (same seed = same initialization, data
order and SR keys).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from study_stats import Interval, difference_interval

BASELINE = "bf16"
"""The variant every gap to BF16 is relative to."""

FULL_RECIPE = "paper"
"""The variant the ablations and the proposed improvements are read against (issue 12:
each ablation should be worse than the full recipe)."""


def load_results(spec: Any, results: Path) -> list[dict[str, Any]]:
    """The finished units' JSON of a study, in the study's unit order."""
    out = []
    for unit in spec.units():
        p = Path(results) / f"{unit.name}.json"
        if p.exists():
            out.append(json.loads(p.read_text()))
    return out


Group = tuple[str, float]
"""(corpus, planned tokens per parameter)."""


def by_group(results: list[dict[str, Any]]) -> dict[Group, dict[str, dict[int, dict]]]:
    """``{(corpus, tokens/param): {variant: {seed: result}}}``."""
    out: dict[Group, dict[str, dict[int, dict]]] = {}
    for r in results:
        g = (r["corpus"], r["tokens_per_param_planned"])
        out.setdefault(g, {}).setdefault(r["variant"], {})[r["seed"]] = r
    return out


def finite_val(r: dict[str, Any]) -> bool:
    v = r.get("final_val_bpb")
    return v is not None and math.isfinite(v)


def paired_gaps(variants: dict[str, dict[int, dict]], baseline: str = BASELINE
                ) -> dict[str, dict[int, float]]:
    """``{variant: {seed: val / val_baseline - 1}}`` over the seeds both have finished with
    a finite validation loss (a diverged run is reported apart, `divergence_lines`)."""
    base = {s: r for s, r in variants.get(baseline, {}).items() if finite_val(r)}
    return {v: {s: r["final_val_bpb"] / base[s]["final_val_bpb"] - 1.0
                for s, r in sorted(runs.items()) if s in base and finite_val(r)}
            for v, runs in variants.items() if v != baseline}


def batch_clusters(*runs: dict[int, dict]) -> dict[int, int]:
    """``{seed: cluster}``: seeds linked through the seed batches they trained in (in any
    of ``runs``, each ``{seed: result}`` of one variant), each cluster named by its
    lowest seed. A paired gap draws on two batches, its variant's and BF16's, so two seeds
    are in one cluster where a chain of shared batches links them. Only seeds in every
    one of ``runs`` are placed; a run outside a seed batch is a batch of its own.

    Example:
        >>> run = lambda *seeds: {"seed_batch": {"seeds": list(seeds)}}
        >>> paper = {0: run(0, 1), 1: run(0, 1), 2: run(2, 3), 3: run(2, 3)}
        >>> bf16 = {0: run(0), 1: run(1, 2), 2: run(1, 2), 3: run(3)}
        >>> batch_clusters(paper, bf16), batch_clusters(paper)
        ({0: 0, 1: 0, 2: 0, 3: 0}, {0: 0, 1: 0, 2: 2, 3: 2})
    """
    seeds = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
    parent = {s: s for s in seeds}

    def root(s: int) -> int:
        while parent[s] != s:
            s = parent[s]
        return s

    for by_seed in runs:
        for s in seeds:
            linked = [t for t in (by_seed[s].get("seed_batch") or {}).get("seeds", [s])
                      if t in parent]
            for t in linked:
                a, b = sorted((root(s), root(t)))
                parent[b] = a
    return {s: root(s) for s in seeds}


def length_growth(groups: dict[Group, dict[str, dict[int, dict]]], corpus: str, variant: str,
                  short: float, long: float
                  ) -> tuple[dict[float, list[float]], Interval | None]:
    """A variant's paired gaps by run length on ``corpus`` (``groups``: `by_group`), and
    the gap at ``long`` minus the gap at ``short`` (`difference_interval`), None with
    fewer than two seeds at either length."""
    by_length = {}
    for (c, t), variants in groups.items():
        g = paired_gaps(variants).get(variant) if c == corpus else None
        if g:
            by_length[t] = list(g.values())
    if min(len(by_length.get(short, ())), len(by_length.get(long, ()))) < 2:
        return by_length, None
    return by_length, difference_interval(by_length[short], by_length[long])


def alike_through(a: dict, b: dict) -> int | None:
    """The last evaluation step through which two runs' validation values are equal, bit
    for bit, from the first evaluation on; None where they differ at the first.

    Two variants that differ only after a late switch (the BF16-forward tail) train alike
    up to the switch when they run on the same compiled kernels; their difference is then
    the tail's alone, free of trajectory noise.

    Example:
        >>> run = lambda *vals: {"val_curve": [[i, 0, v] for i, v in enumerate(vals, 1)]}
        >>> alike_through(run(2.0, 1.5, 1.2), run(2.0, 1.5, 1.1))
        2
    """
    return _equal_through(a["val_curve"], b["val_curve"], 2)


def _equal_through(rows: list, other: list, column: int) -> int | None:
    """The step (a row's first entry) of the last row through which two curves' values
    in ``column`` are equal from the first row on; None where the first rows differ."""
    step = None
    for row, twin in zip(rows, other):
        if row[column] != twin[column]:
            break
        step = row[0]
    return step


def repeats(runs: list[dict[str, Any]], earlier: list[dict[str, Any]]) -> list[str]:
    """Whether runs repeat the earlier runs of the same units bit for bit: a line per
    unit in both (how far its validation and training curves stay equal; for a run that
    differs, both final validation losses and how far apart they ended), then a count.

    A replay on the GPU repeats a run only where every kernel sums in the same order as
    it did: same code, same device kind and the same autotuning picks.

    Example:
        >>> run = lambda *vals: {"unit": "u", "val_curve": [[i, 0, v] for i, v in
        ...     enumerate(vals, 1)], "train_curve": [[i, v] for i, v in enumerate(vals, 1)],
        ...     "final_val_bpb": vals[-1]}
        >>> first, count = repeats([run(2.0, 1.5)], [run(2.0, 1.4)])
        >>> for part in first.split("; "):
        ...     print(part)
        u: validation equal through step 1 of 2, training loss through step 1 of 2
        differs: final val bpb 1.5000 against 1.4000 (+7.143%)
        >>> count
        '0 of 1 runs repeat bit for bit'
    """
    lines, same = [], 0
    by_unit = {r["unit"]: r for r in earlier}
    for r in runs:
        e = by_unit.get(r["unit"])
        if e is None:
            continue
        val = alike_through(r, e)
        train = _equal_through(r["train_curve"], e["train_curve"], 1)
        whole = r["val_curve"] == e["val_curve"] and r["train_curve"] == e["train_curve"]
        same += whole
        verdict = "repeats" if whole else "differs"
        a, b = r.get("final_val_bpb"), e.get("final_val_bpb")
        if not whole and a is not None and b:
            verdict += f": final val bpb {a:.4f} against {b:.4f} ({(a / b - 1) * 100:+.3f}%)"
        lines.append(f"{r['unit']}: validation equal through step {val or 'none'} of "
                     f"{r['val_curve'][-1][0]}, training loss through step {train or 'none'} "
                     f"of {r['train_curve'][-1][0]}; {verdict}")
    return lines + [f"{same} of {len(lines)} runs repeat bit for bit"]


def forward_costs(runs: dict[int, dict]) -> dict[int, float]:
    """``{seed: val / val_bf16_forward - 1}``: what quantizing the forward pass costs each
    run's final weights, against the same weights evaluated with BF16 forward GEMMs.

    It is measured on one set of weights, so free of the trajectory noise between runs: a
    positive cost in every seed shows the forward quantization active even where a run's
    gap to BF16 is at or below zero. BF16 runs have no such evaluation; runs that end
    with a BF16 forward pass (the tail variants) cost 0.

    Example:
        >>> forward_costs({0: {"final_val_bpb": 1.01, "final_val_bpb_bf16_forward": 1.0},
        ...                1: {"final_val_bpb": 1.0}})
        {0: 0.010000000000000009}
    """
    return {s: r["final_val_bpb"] / r["final_val_bpb_bf16_forward"] - 1
            for s, r in runs.items()
            if r.get("final_val_bpb_bf16_forward") is not None and finite_val(r)}


def val_at(r: dict[str, Any]) -> dict[int, float]:
    """``{step: validation bpb}`` of a unit's curve (rows ``[step, tokens, bpb]``)."""
    return {int(row[0]): float(row[2]) for row in r.get("val_curve", [])
            if row[2] is not None and math.isfinite(row[2])}
