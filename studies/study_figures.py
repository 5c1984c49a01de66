"""The validation study's figures (matplotlib, PNG) from its results (issue 12):
validation curves with seed bands and the gap to BF16 along training, gap bars with
their intervals, quantization diagnostics along training.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from study_results import BASELINE, paired_gaps
from study_stats import WIDE_PP, mean_interval


def _plt():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})


def curves_figure(title: str, variants: dict[str, dict[int, dict]], order: Sequence[str],
                  path: Path) -> None:
    """Validation bits per byte along training (mean over seeds, band: min–max) and the
    paired gap to BF16 along training (mean, band: min–max over seeds, and each seed as
    a thin line: a seed that leads or trails the others all along shows as one)."""
    plt = _plt()
    fig, (ax, ax_gap) = plt.subplots(1, 2, figsize=(12, 4.5))
    base = variants.get(BASELINE, {})
    for v in order:
        runs = variants.get(v)
        if not runs:
            continue
        steps = sorted(set.intersection(*(set(p[0] for p in r["val_curve"])
                                          for r in runs.values())))
        if not steps:
            continue
        tokens = np.array([next(p[1] for p in next(iter(runs.values()))["val_curve"]
                                if p[0] == s) for s in steps]) / 1e6
        y = np.array([[dict((p[0], p[2]) for p in r["val_curve"])[s] for s in steps]
                      for r in runs.values()])
        (line,) = ax.plot(tokens, y.mean(0), label=f"{v} ({len(runs)} seeds)")
        ax.fill_between(tokens, y.min(0), y.max(0), color=line.get_color(), alpha=0.2)
        paired = [s for s in runs if s in base]
        if v != BASELINE and paired:
            b = {s: dict((p[0], p[2]) for p in base[s]["val_curve"]) for s in paired}
            ok = [t for t in steps if all(t in b[s] for s in paired)]
            g = np.array([[dict((p[0], p[2]) for p in runs[s]["val_curve"])[t] / b[s][t] - 1
                           for t in ok] for s in paired]) * 100
            xt = np.array([tokens[steps.index(t)] for t in ok])
            ax_gap.plot(xt, g.mean(0), color=line.get_color(), label=v)
            ax_gap.fill_between(xt, g.min(0), g.max(0), color=line.get_color(), alpha=0.2)
            for seed_gap in g:
                ax_gap.plot(xt, seed_gap, color=line.get_color(), lw=0.6, alpha=0.5)
    ax.set(xlabel="training tokens (M)", ylabel="validation bits per byte",
           title=f"{title} (band: min–max over seeds)")
    ax.legend(fontsize=8)
    ax_gap.axhline(0.0, color="black", lw=0.8)
    ax_gap.set(xlabel="training tokens (M)", ylabel="gap to BF16 (%), paired by seed",
               title="gap along training (band: min–max; thin: each seed)")
    if ax_gap.lines[1:]:
        ax_gap.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def gaps_figure(title: str, variants: dict[str, dict[int, dict]], order: Sequence[str],
                path: Path) -> bool:
    """Bars: mean paired gap to BF16 per variant, error bars: the 95% interval (none for
    one seed). Returns False (no figure) when no variant has a paired gap."""
    gaps = paired_gaps(variants)
    rows = [(v, mean_interval(list(gaps[v].values()))) for v in order if gaps.get(v)]
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.5))
    y = np.arange(len(rows))[::-1]
    means = [iv.mean * 100 for _, iv in rows]
    err = [iv.half_width * 100 if iv.half_width is not None else 0.0 for _, iv in rows]
    ax.barh(y, means, xerr=err, capsize=4, color=["tab:red" if iv.wide else "tab:blue"
                                                   for _, iv in rows])
    ax.set_yticks(y, [f"{v} (n={iv.n})" for v, iv in rows])
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set(xlabel="validation-loss gap to BF16 (%), mean over seeds, 95% t-interval",
           title=f"{title}\n(red: interval wider than ±{WIDE_PP} pp or one seed)")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


HEALTH_PANELS = (("w/flush_to_zero", "max", "weights flushed to zero (max over layers)"),
                 ("x/flush_to_zero", "max", "inputs flushed to zero (max over layers)"),
                 ("w/rel_error", "mean", "weight quantization error (mean over layers)"))


def health_figure(title: str, variants: dict[str, dict[int, dict]], order: Sequence[str],
                  path: Path) -> bool:
    """Diagnostics along training for each run that recorded them. Returns False (no
    figure) when none did."""
    runs = [(v, s, r) for v in order for s, r in sorted(variants.get(v, {}).items())
            if r.get("diagnostics")]
    if not runs:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, len(HEALTH_PANELS), figsize=(5 * len(HEALTH_PANELS), 4))
    tokens_per_step = next(iter(runs))[2]["tokens"] / next(iter(runs))[2]["steps"]
    for v, s, r in runs:
        for ax, (key, agg, _) in zip(axes, HEALTH_PANELS):
            pts = [(d["step"] * tokens_per_step / 1e6, d["summary"][key][agg])
                   for d in r["diagnostics"] if key in d["summary"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=f"{v} (seed {s})")
    for ax, (_, _, label) in zip(axes, HEALTH_PANELS):
        ax.set(xlabel="training tokens (M)", title=label)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True
