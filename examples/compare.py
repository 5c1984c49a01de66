"""BF16 vs NVFP4 on the same model, seed and data order: the end-to-end study.

    python examples/compare.py --out /tmp/study                # defaults: ~26M-param Llama
    python examples/compare.py --recipes bf16,nvfp4,nvfp4_tail  # + BF16 forward at the end
    python examples/compare.py --model hybrid --layers 8 --keep-last 2  # Mamba-2 hybrid

Every recipe trains the same model (`llama.Llama`, or with ``--model hybrid`` the
Mamba-Transformer `hybrid.Hybrid`) from the same initialization on the same
batches (`data.Batches`, seed ``--seed``) with the same learning-rate schedule. To
fit a wall-clock budget (``--time-budget-s``, everything after start-up: data,
compilation, training, evaluation), each recipe's step is first compiled and timed
for a few steps; the step count is then the largest that fits (at most
``--steps``). A run that still overruns stops early, and the runs after it stop at
the same step, so the comparison stays step-for-step. Prints a table (validation
bits per byte, the relative gap to BF16, epochs, step times) and writes
``compare.json`` plus one directory of metrics per recipe under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import data as data_lib  # noqa: E402
import jax  # noqa: E402
import train_llama as tl  # noqa: E402
from hybrid import HybridConfig  # noqa: E402

RECIPE_SPECS = {
    "bf16": dict(recipe="bf16"),
    "nvfp4": dict(recipe="nvfp4"),
    "nvfp4_tail": dict(recipe="nvfp4"),  # + bf16_forward_tail (RECIPE.md §8)
    "nvfp4_no_rht": dict(recipe="nvfp4_no_rht"),
    "nvfp4_no_sr": dict(recipe="nvfp4_no_sr"),
    "nvfp4_no_2d": dict(recipe="nvfp4_no_2d"),
    "nvfp4_four_over_six": dict(recipe="nvfp4_four_over_six"),  # RECIPE.md §2.8
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """What to compare and how long.

    Attributes:
      recipes: names from `RECIPE_SPECS`; the first ``bf16`` one is the baseline.
      max_steps: upper bound on training steps per recipe.
      time_budget_s: wall-clock budget for everything after start-up (None: run
        ``max_steps``, no calibration-based sizing).
      calib_steps: timed steps per recipe before sizing the runs.
      tail_fraction: BF16-forward share of the steps for ``nvfp4_tail``.
      evals: validation points per run (plus the final one).
      min_steps: fewest steps worth running; below it the budget is overrun.
    """

    recipes: tuple[str, ...] = ("bf16", "nvfp4")
    max_steps: int = 4000
    time_budget_s: float | None = 420.0
    calib_steps: int = 10
    tail_fraction: float = 0.18
    evals: int = 8
    min_steps: int = 20

    def __post_init__(self):
        bad = [r for r in self.recipes if r not in RECIPE_SPECS]
        if bad or not self.recipes:
            raise ValueError(f"unknown recipes {bad}; choose from {sorted(RECIPE_SPECS)}")
        if len(set(self.recipes)) != len(self.recipes):
            raise ValueError(f"recipes repeat: {self.recipes}")


def _run_config(base: tl.RunConfig, name: str, study: StudyConfig) -> tl.RunConfig:
    spec = dict(RECIPE_SPECS[name])
    if name == "nvfp4_tail":
        spec["bf16_forward_tail"] = study.tail_fraction
    return dataclasses.replace(base, **spec)


def run_study(
    model_cfg: tl.ModelConfig,
    base: tl.RunConfig,
    study: StudyConfig,
    corpus: data_lib.Corpus,
    *,
    out: str | None = None,
    progress: bool = True,
    t_begin: float | None = None,
) -> dict[str, Any]:
    """Trains every recipe; returns ``{"runs": {name: summary}, "table": str, ...}``."""
    t_begin = time.perf_counter() if t_begin is None else t_begin
    batches = data_lib.Batches(corpus.train, batch=base.batch, seq=base.seq, seed=base.seed)
    val = data_lib.validation_batches(corpus.val, batch=base.batch, seq=base.seq,
                                      max_batches=base.eval_batches)
    trainers = {n: tl.Trainer(model_cfg, _run_config(base, n, study), study.max_steps)
                for n in study.recipes}
    # Slowest (quantized) first: if one must stop early, the others match it.
    order = sorted(study.recipes, key=lambda n: n == "bf16")
    calib: dict[str, dict[str, float]] = {}
    steps = study.max_steps
    if study.time_budget_s is not None:
        for n in order:
            calib[n] = trainers[n].calibrate(batches, val, study.calib_steps)
            print(f"calibrated {n}: compile {calib[n]['compile_s']:.1f}s, "
                  f"{calib[n]['step_s'] * 1e3:.1f} ms/step, eval {calib[n]['eval_s']:.1f}s",
                  flush=True)
        per_step = sum(c["step_s"] for c in calib.values())
        evals = sum(c["eval_s"] for c in calib.values()) * (study.evals + 1)
        left = study.time_budget_s - (time.perf_counter() - t_begin)
        fit = int((0.85 * left - evals - 5.0) / per_step)
        steps = max(study.min_steps, min(study.max_steps, fit))
        print(f"budget {study.time_budget_s:.0f}s, {left:.0f}s left after data and "
              f"compilation: {steps} steps per recipe", flush=True)
    runs: dict[str, Any] = {}
    stop_at = steps
    for k, n in enumerate(order):
        tr = trainers[n]
        tr.cfg = dataclasses.replace(tr.cfg, eval_every=max(steps // max(study.evals, 1), 1)
                                     if study.evals else 0)
        deadline = None
        if study.time_budget_s is not None and k == 0:
            # Only the first (slowest) run may stop early; the others then run exactly as
            # many steps, so every recipe sees the same tokens (a later run that also
            # stopped early made an unequal comparison on the H200: 910 vs 630 steps).
            later = sum(calib[m]["step_s"] * stop_at + calib[m]["eval_s"] * (study.evals + 1)
                        for m in order[k + 1:])
            deadline = t_begin + study.time_budget_s - later - calib[n]["eval_s"] * 2
        summary = tl.train(tr, batches, val, steps=steps, stop_at=stop_at, deadline=deadline,
                           out=os.path.join(out, n) if out else None, progress=progress)
        summary.pop("final_state")
        summary["name"] = n
        runs[n] = summary
        stop_at = min(stop_at, summary["steps"])
        print(tl.describe(summary), flush=True)
    result = {
        "runs": {n: runs[n] for n in study.recipes},
        "calibration": calib,
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "corpus": corpus.describe(),
        "study": dataclasses.asdict(study),
        "wall_s": time.perf_counter() - t_begin,
    }
    result["table"] = table(result, model_cfg, base)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare.json"), "w") as f:
            json.dump(result, f, indent=2)
    return result


SEED_NOISE_NOTE = (
    "caveat: one short run (one seed) cannot resolve a gap below ~1%: seed-to-seed noise is "
    "of that size (docs/STUDY.md measures it over seeds)"
)


def baseline_label(model_cfg: tl.ModelConfig) -> str:
    """What the unquantized ``bf16`` recipe computes in: ``bf16``, or ``float32`` where
    the model computes in float32 (the CPU default)."""
    return "bf16" if model_cfg.dtype == "bfloat16" else model_cfg.dtype


def table(result: dict[str, Any], model_cfg: tl.ModelConfig, base: tl.RunConfig) -> str:
    """The comparison as text: one row per recipe, then the gaps to the unquantized
    baseline (labelled by its compute dtype: float32 on a CPU)."""
    runs = result["runs"]
    hp = baseline_label(model_cfg)
    label = lambda n: hp if n == "bf16" else n  # noqa: E731
    pc = model_cfg.param_counts()
    fl = model_cfg.train_flops_per_token(base.seq)
    any_q = next((r for r in runs.values() if r["quantized_layers"]), None)
    ssm = (f", {pc['ssm'] / 1e3:.1f}K Mamba conv/A/D/dt (float32)"
           if isinstance(model_cfg, HybridConfig) else "")
    scan = (f", Mamba-2 scan (float32) {fl['scan'] / sum(fl.values()):.0%}"
            if isinstance(model_cfg, HybridConfig) else "")
    lines = [
        f"{tl.describe_model(model_cfg)}, seq {base.seq}, batch {base.batch}, compute "
        f"{model_cfg.dtype}, {result['backend']} ({result['device']})",
        f"params {pc['total'] / 1e6:.2f}M: {pc['block_matmuls'] / 1e6:.2f}M in block matmuls "
        f"(NVFP4 in quantized runs), {(pc['embedding'] + pc['head']) / 1e6:.2f}M embedding+head "
        f"and {pc['norms'] / 1e3:.1f}K norm ({hp}){ssm}",
        f"training FLOPs/token {sum(fl.values()) / 1e6:.1f}M: block matmuls "
        f"{fl['block_matmuls'] / sum(fl.values()):.0%}, head {fl['head'] / sum(fl.values()):.0%}, "
        f"attention products {fl['attention'] / sum(fl.values()):.0%}{scan}",
    ]
    if any_q:
        lines.append(f"quantized layers: {any_q['quantized_layers']} of {any_q['matmul_layers']} "
                     f"matmul layers (the output head stays {hp})")
    # (The corpus line was printed when the data was loaded; it is in compare.json.)
    fwd, vs = f"val bpb ({hp} fwd)", f"vs {hp}"
    head = (f"{'recipe':<13} {'steps':>6} {'tokens':>9} {'epochs':>7} {'train bpb':>9} "
            f"{'val bpb':>8} {fwd:>18} {'ms/step':>8} {vs:>8}")
    lines += ["", head, "-" * len(head)]
    ref = runs.get("bf16")
    for n, r in runs.items():
        gap = ""
        if ref is not None and n != "bf16":
            gap = f"{(r['final_val_bpb'] - ref['final_val_bpb']) / ref['final_val_bpb']:+.2%}"
        bf = r.get("final_val_bpb_bf16_forward")
        bf = "-" if bf is None else f"{bf:.4f}"
        tr = r["final_train_bpb"]
        lines.append(
            f"{label(n):<13} {r['steps']:>6} {r['tokens_seen'] / 1e6:>8.2f}M {r['epochs']:>7.4f} "
            f"{tr if tr is not None else math.nan:>9.4f} {r['final_val_bpb']:>8.4f} "
            f"{bf:>18} {(r['step_time_s'] or math.nan) * 1e3:>8.1f} {gap:>8}"
        )
    for n, r in runs.items():
        if r["stopped_early"] or r["steps"] < r["planned_steps"]:
            lines.append(f"note: {n} stopped at step {r['steps']} of {r['planned_steps']} planned "
                         "(time budget; its learning-rate schedule did not finish)")
    if ref is not None:
        for n, r in runs.items():
            if n != "bf16":
                if r["steps"] != ref["steps"]:
                    lines.append(f"note: {n} ran {r['steps']} steps, {hp} {ref['steps']}")
                if r["final_val_bpb"] == ref["final_val_bpb"]:
                    lines.append(f"WARNING: {n} equals {hp} exactly: quantization did not happen?")
        lines.append(
            f"relative gap = (val bpb - {hp} val bpb) / {hp} val bpb; '{fwd}' evaluates the "
            f"same weights with every GEMM unquantized ({hp})"
        )
        if len(runs) > 1:
            lines.append(SEED_NOISE_NOTE)
    return "\n".join(lines)


def parse_args(
    argv: list[str] | None = None, *, defaults: dict[str, Any] | None = None
) -> argparse.Namespace:
    """The CLI flags; ``defaults`` overrides the parser defaults (``demo.py``'s preset)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipes", default="bf16,nvfp4",
                   help=f"comma-separated, from {sorted(RECIPE_SPECS)}")
    p.add_argument("--steps", type=int, default=4000, help="at most this many steps per recipe")
    p.add_argument("--time-budget-s", type=float, default=420.0,
                   help="wall-clock budget after start-up (0: no budget, run --steps)")
    p.add_argument("--calib-steps", type=int, default=10)
    p.add_argument("--tail-fraction", type=float, default=0.18)
    p.add_argument("--evals", type=int, default=8, help="validation points per run")
    p.add_argument("--out", default=None)
    p.add_argument("--no-progress", action="store_true")
    tl.model_args(p, dim=768, layers=4, heads=12, batch=64, seq=512)
    p.set_defaults(lr=1.5e-3, eval_batches=32)
    if defaults:
        p.set_defaults(**defaults)
    return p.parse_args(argv)


def settings_line(a: argparse.Namespace) -> str:
    """The settings a run actually uses (preset and flags combined), on one line."""
    budget = f"{a.time_budget_s:.0f}s" if a.time_budget_s else "none"
    return (
        f"settings: recipes {a.recipes}; {tl.describe_model(tl.model_config(a))}, "
        f"batch {a.batch} x seq {a.seq}, steps {a.steps} (time budget {budget}), lr {a.lr:g}, "
        f"evals {a.evals} x {a.eval_batches} batches, seed {a.seed}, compute "
        f"{tl.compute_dtype(a.dtype)}"
    )


def main(
    argv: list[str] | None = None, *, defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """CLI; ``defaults`` overrides the parser defaults (used by ``demo.py``)."""
    t_begin = time.perf_counter()
    a = parse_args(argv, defaults=defaults)
    print(settings_line(a), flush=True)
    corpus = data_lib.load_corpus([a.data] if a.data else None,
                                  suffix=None if a.data else ".py")
    print(corpus.describe(), flush=True)
    model_cfg = tl.model_config(a)
    base = tl.RunConfig(batch=a.batch, seq=a.seq, lr=a.lr, seed=a.seed,
                        keep_first=a.keep_first, keep_last=a.keep_last,
                        keep_patterns=tuple(a.keep), eval_batches=a.eval_batches,
                        log_every=a.log_every,
                        diag_every=a.diag_every, mesh=a.mesh)
    study = StudyConfig(recipes=tuple(r for r in a.recipes.split(",") if r),
                        max_steps=a.steps, time_budget_s=a.time_budget_s or None,
                        calib_steps=a.calib_steps, tail_fraction=a.tail_fraction, evals=a.evals)
    result = run_study(model_cfg, base, study, corpus, out=a.out,
                       progress=not a.no_progress, t_begin=t_begin)
    print("\n" + result["table"], flush=True)
    print(f"\ntotal wall time {result['wall_s']:.0f}s", flush=True)
    return result


if __name__ == "__main__":
    main()
