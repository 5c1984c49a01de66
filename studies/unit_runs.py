"""Running a study's units, resumably, within a time budget (issue 12).

Each unit runs through the examples' own training loop (`train_llama.Trainer`,
`train_llama.train`), which checkpoints with `fp4jax.checkpoint` and resumes bit for bit:
the state holds the run key and the step, batch ``i`` depends only on ``(seed, i)``, SR
keys on ``(key, step)``.

`run_study` (the CLI's ``run``) trains the unfinished units until its budget is spent: a
unit cut off by the budget saves a checkpoint and continues in the next call; a finished
unit writes ``<results>/<unit>.json`` (validation curve, final validation loss in bits per
byte, training curve, step times, per-layer quantization diagnostics, the environment).
Those JSON files are the results: commit them. The working files (checkpoints, metrics,
``jax_cache/``, the persistent compilation cache; ``corpus_cache/``, the built corpora)
live under ``<results>/work`` and are not committed. Within a call, the later seeds of a
variant reuse the first one's compiled steps (`train_llama.Trainer.for_run`): the
persistent cache cannot serve a second trace in one process when the step holds Pallas
Mosaic GPU kernels, whose serialized modules carry a name numbered per trace (JAX
0.11.2); it serves a later process that traces the same steps in the same order.

Example:
  >>> unit = Unit("python", 10.0, "bf16", 0)
  >>> result_path(Path("results"), unit).as_posix(), work_dir(Path("results"), unit).as_posix()
  ('results/python-tpp10-bf16-s0.json', 'results/work/python-tpp10-bf16-s0')
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from study_specs import CORPORA, StudySpec, Unit  # first: it puts examples/ on sys.path

# isort: split
import data as data_lib
import jax
import train_llama as tl
from unit_records import corpus_info, diagnostics_samples, environment, latest_by_step, read_records

from fp4jax.checkpoint import Checkpointer


def write_json(path: Path, obj: Any) -> None:
    """Writes ``obj`` to ``path`` as JSON, atomically (a temporary file, then a rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


class TooLong(ValueError):
    """A unit would read more of its corpus than its study allows (`StudySpec.max_epochs`)."""


@dataclasses.dataclass
class Outcome:
    """What one `run_unit` call did: ``finished`` (the result JSON is written), the step
    reached, the result (finished units) and the final `TrainState`."""

    unit: Unit
    finished: bool
    steps: int
    result: dict[str, Any] | None
    state: Any = None


def result_path(results: Path, unit: Unit) -> Path:
    """Where a finished unit's JSON lives."""
    return Path(results) / f"{unit.name}.json"


def work_dir(results: Path, unit: Unit) -> Path:
    """A unit's working files (metrics, segments, checkpoints): not results."""
    return Path(results) / "work" / unit.name


def corpus_cache_dir(results: Path) -> Path:
    """Where the built corpora are kept for a call's later processes (`data.load_corpus`'s
    ``cache_dir``): beside the compilation cache, not results."""
    return Path(results) / "work" / "corpus_cache"


def checked_epochs(spec: StudySpec, unit: Unit, batches: data_lib.Batches,
                   corpus: data_lib.Corpus) -> float:
    """The epochs of its corpus that ``unit`` reads through ``batches``.

    Raises:
      TooLong: if that is ``spec.max_epochs`` or more.
    """
    steps = spec.steps(unit.tokens_per_param)
    epochs = batches.epochs(steps)
    if epochs >= spec.max_epochs:
        raise TooLong(
            f"{spec.name}/{unit.name}: {steps} steps of {batches.batch}x{batches.seq} tokens "
            f"read {epochs:.2f} epochs of the {unit.corpus} corpus "
            f"({len(corpus.train) / 1e6:.1f} MB train), not under max_epochs="
            f"{spec.max_epochs}: use a smaller model or fewer tokens per parameter")
    return epochs


def run_unit(
    spec: StudySpec,
    unit: Unit,
    results: Path,
    corpus: data_lib.Corpus,
    *,
    deadline: float | None = None,
    stop_at: int | None = None,
    trainer: tl.Trainer | None = None,
    command: str = "",
    progress: bool = False,
) -> Outcome:
    """Trains one unit from its latest checkpoint (or from scratch) until it finishes,
    ``deadline`` (`time.perf_counter`) passes or ``stop_at`` steps are reached.

    Args:
      spec: the study.
      unit: which run.
      results: the study's results folder.
      corpus: the unit's corpus.
      deadline: stop (and checkpoint) when this time has passed.
      stop_at: stop (and checkpoint) after this many steps (tests).
      trainer: a `train_llama.Trainer` of exactly this unit's configuration to reuse
        (its compiled steps); None: build one.
      command: recorded with the segment.
      progress: show a progress bar.

    Returns:
      An `Outcome`; a finished unit's result is also at `result_path`.

    Raises:
      TooLong: if the unit would read ``spec.max_epochs`` or more of its corpus.
    """
    results = Path(results)
    steps = spec.steps(unit.tokens_per_param)
    cfg = spec.run_config(unit)
    mcfg = spec.model_config()
    batches = data_lib.Batches(corpus.train, batch=cfg.batch, seq=cfg.seq, seed=unit.seed)
    checked_epochs(spec, unit, batches, corpus)
    val = data_lib.validation_batches(corpus.val, batch=cfg.batch, seq=cfg.seq,
                                      max_batches=cfg.eval_batches)
    if trainer is None:
        trainer = tl.Trainer(mcfg, cfg, steps)
    elif trainer.cfg != cfg or trainer.model_cfg != mcfg:
        raise ValueError(f"the trainer given was built for another configuration than "
                         f"{unit.name}'s")
    work = work_dir(results, unit)
    ckpt_dir = work / "ckpt"
    first = 0
    if ckpt_dir.exists():
        with Checkpointer(ckpt_dir) as c:
            first = c.latest_step() or 0
    summary = tl.train(trainer, batches, val, steps=steps, stop_at=stop_at, deadline=deadline,
                       out=str(work), ckpt_dir=str(ckpt_dir),
                       ckpt_every=max(steps // spec.checkpoints, 1), progress=progress)
    state = summary.pop("final_state")
    seg_path = work / "segments.json"
    segments = json.loads(seg_path.read_text()) if seg_path.exists() else []
    segments = [s for s in segments if s["to"] <= first]  # a killed call left no segment
    segments.append({
        "from": first, "to": summary["steps"], "step_time_s": summary["step_time_s"],
        "first_step_s": summary["first_step_s"], "train_wall_s": summary["train_wall_s"],
        "paused_s": summary["paused_s"], "mode_switch_s": summary["mode_switch_s"],
        "environment": environment(command),
    })
    write_json(seg_path, segments)
    if summary["steps"] < steps:
        return Outcome(unit, False, summary["steps"], None, state)
    extra = {}
    if spec.eval_bf16_forward and trainer.report is not None and summary["final_mode"] != "bf16":
        # The same weights with every GEMM unquantized: how much of the gap is the forward?
        extra["final_val_bpb_bf16_forward"] = trainer.evaluate(
            state.params, jax.device_put(val, trainer.batch_sharding), "bf16")
    result = build_result(spec, unit, summary, read_records(work / "metrics.jsonl"), segments,
                          corpus, extra)
    write_json(result_path(results, unit), result)
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # finished: the result is what is kept
    return Outcome(unit, True, summary["steps"], result, state)


def build_result(spec: StudySpec, unit: Unit, summary: dict[str, Any],
                 records: list[dict[str, Any]], segments: list[dict[str, Any]],
                 corpus: data_lib.Corpus, extra: dict[str, Any]) -> dict[str, Any]:
    """The JSON of a finished unit, from `train_llama.train`'s summary of its last segment
    and the metrics every segment logged."""
    cfg = spec.run_config(unit)
    steps = summary["steps"]
    tokens_per_step = cfg.batch * cfg.seq
    val = latest_by_step(records, "val_bits_per_byte")
    val_steps = [s for s in sorted(val) if s == steps or (cfg.eval_every and s % cfg.eval_every
                                                          == 0)]
    train = latest_by_step(records, "loss")
    losses = [train[s].get("bits_per_byte") for s in sorted(train)]
    grad_norms = [train[s].get("grad_norm") for s in sorted(train)]
    timed = [s for s in segments if s["step_time_s"] is not None and s["to"] - s["from"] > 1]
    step_time = (sum(s["step_time_s"] * (s["to"] - s["from"] - 1) for s in timed)
                 / sum(s["to"] - s["from"] - 1 for s in timed)) if timed else None
    finite = [x for x in losses if x is not None and math.isfinite(x)]
    return {
        "study": spec.name,
        "unit": unit.name,
        "corpus": unit.corpus,
        "variant": unit.variant,
        "seed": unit.seed,
        "recipe": cfg.recipe,
        "keep_last": cfg.keep_last,
        "bf16_forward_tail": cfg.bf16_forward_tail,
        "tokens_per_param_planned": unit.tokens_per_param,
        "tokens_per_param": steps * tokens_per_step / spec.params,
        "steps": steps,
        "tokens": steps * tokens_per_step,
        "epochs": summary["epochs"],
        "model": tl.describe_model(spec.model_config()),
        "model_config": dataclasses.asdict(spec.model_config()),
        "params": summary["params"],
        "quantized_layers": summary["quantized_layers"],
        "matmul_layers": summary["matmul_layers"],
        "run_config": dataclasses.asdict(cfg),
        "corpus_info": corpus_info(corpus),
        "val_curve": [[s, s * tokens_per_step, val[s]["val_bits_per_byte"]] for s in val_steps],
        "final_val_bpb": summary["final_val_bpb"],
        "final_val_loss_nats": summary["final_val_bpb"] * math.log(2.0),
        "final_mode": summary["final_mode"],
        **extra,
        "train_curve": [[s, train[s].get("bits_per_byte"), train[s].get("grad_norm"),
                         train[s].get("mode")] for s in sorted(train)],
        "health": {
            "nonfinite_train_losses": len(losses) - len(finite),
            "final_val_finite": summary["final_val_bpb"] is not None
            and math.isfinite(summary["final_val_bpb"]),
            "max_grad_norm": max((g for g in grad_norms if g is not None), default=None),
            "min_train_bpb": min(finite, default=None),
        },
        "diagnostics": diagnostics_samples(records),
        "step_time_s": step_time,
        "compile_s": segments[0]["first_step_s"] if segments else None,
        "train_wall_s": sum(s["train_wall_s"] for s in segments),
        "segments": segments,
        "environment": segments[-1]["environment"] if segments else None,
    }


def paused_s(result: dict[str, Any]) -> float:
    """Seconds a unit's run spent paused (evaluations, diagnostics, checkpoints), summed
    over its segments (a resumed unit has one per call)."""
    return sum(g.get("paused_s") or 0.0 for g in result.get("segments", ()))


def finished(results: Path, unit: Unit) -> dict[str, Any] | None:
    """A finished unit's result, or None."""
    p = result_path(results, unit)
    return json.loads(p.read_text()) if p.exists() else None


def adopt_units(spec: StudySpec, results: Path, source: StudySpec,
                source_results: Path) -> list[str]:
    """Takes the finished units of another study that are exactly units of ``spec``.

    A unit is adopted only when its recorded run (`build_result`'s ``run_config``, model
    apart from the compute dtype, steps and corpus) equals what ``spec`` would run for
    it; the copy says so (``adopted_from``: the source study) and is otherwise the
    record as it was. Units ``spec`` has finished are left alone. Returns one line per
    unit the source has finished: adopted, already finished here, or which field differs.
    """
    results, source_results = Path(results), Path(source_results)
    model = {k: v for k, v in dataclasses.asdict(spec.model).items() if k != "dtype"}
    notes = []
    for unit in spec.units():
        rec = finished(source_results, unit)
        if rec is None:
            continue
        if finished(results, unit):
            notes.append(f"  {unit.name}: already finished in {spec.name}")
            continue
        want = {"run_config": dataclasses.asdict(spec.run_config(unit)),
                "model_config": model, "steps": spec.steps(unit.tokens_per_param),
                "corpus": unit.corpus, "variant": unit.variant, "seed": unit.seed}
        want = json.loads(json.dumps(want))  # as recorded: tuples are lists
        got = {**{k: rec.get(k) for k in want},
               "model_config": {k: v for k, v in rec.get("model_config", {}).items()
                                if k != "dtype"}}
        differ = [k for k in want if got[k] != want[k]]
        if differ:
            notes.append(f"  {unit.name}: not adopted, {', '.join(differ)} differ")
            continue
        results.mkdir(parents=True, exist_ok=True)
        write_json(result_path(results, unit),
                   {**rec, "study": spec.name, "adopted_from": source.name})
        notes.append(f"  {unit.name}: adopted from {source.name}")
    return notes


def reusable_trainer(trainer: tl.Trainer | None, spec: StudySpec, unit: Unit
                     ) -> tl.Trainer | None:
    """``trainer`` set up for ``unit`` when its compiled steps serve it (`Trainer.for_run`),
    else None."""
    if trainer is None or trainer.model_cfg != spec.model_config():
        return None
    try:
        return trainer.for_run(spec.run_config(unit))
    except ValueError:
        return None


def estimate_s(spec: StudySpec, unit: Unit, results: Path, *, compiled: bool = False
               ) -> float | None:
    """Seconds the unit is expected to take, or None when nothing comparable has finished.

    From the finished units that are as quantized (BF16 or NVFP4): the median training
    time (without compilation and pauses) of those of the same variant if any, scaled
    to this unit's steps; plus the median pause (evaluations and diagnostics: as many per
    unit whatever its length, and the first diagnostics sample compiles) of those with
    the same diagnostics setting if any; plus, unless ``compiled`` (the unit reuses
    compiled steps), the largest compilation time. Medians, because a unit cut off and
    resumed in a later call counts its compilations twice.
    """
    steps = spec.steps(unit.tokens_per_param)
    diag = spec.run_config(unit).diag_every > 0
    quantized = spec.variant(unit.variant).quantized
    alike = [(u, r) for u in spec.units() if spec.variant(u.variant).quantized == quantized
             for r in [finished(results, u)] if r and r.get("train_wall_s") and r.get("steps")
             and not r.get("seed_batch")]  # a batch's units share its time
    if not alike:
        return None

    timed = [r for u, r in alike if u.variant == unit.variant] or [r for _, r in alike]
    paused_by = ([r for u, r in alike if (spec.run_config(u).diag_every > 0) == diag]
                 or [r for _, r in alike])
    compile_s = 0.0 if compiled else max(r.get("compile_s") or 0.0 for r in timed)
    train = statistics.median(
        (r["train_wall_s"] - (r.get("compile_s") or 0.0) - paused_s(r)) * steps / r["steps"]
        for r in timed)
    return compile_s + train + statistics.median(paused_s(r) for r in paused_by)


def run_study(
    spec: StudySpec,
    results: Path,
    *,
    budget_s: float,
    reserve_s: float = 30.0,
    corpora: dict[str, data_lib.Corpus] | None = None,
    only: dict[str, set] | None = None,
    command: str = "",
    progress: bool = False,
    t_begin: float | None = None,
) -> list[Outcome]:
    """Runs the study's unfinished units in order until ``budget_s`` seconds (from
    ``t_begin``) are spent.

    A unit starts if no estimate of its time exists yet (`estimate_s`), if the estimate
    fits the time left, or if it exceeds a whole budget (it spans calls anyway); else, or
    when less than 30 s (a tenth of a smaller budget) is left, the loop stops and leaves
    it to the next call. A started unit gets the deadline
    ``t_begin + budget_s - reserve_s``: what is left for its final evaluation,
    checkpoint and result.

    Args:
      corpora: loaded corpora by name (loaded on first use otherwise).
      only: keep only units whose fields are in these sets, e.g. ``{"variant": {"bf16"}}``.
    """
    t_begin = time.perf_counter() if t_begin is None else t_begin
    deadline = t_begin + budget_s - reserve_s
    corpora = {} if corpora is None else corpora
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    todo = [u for u in spec.units() if not finished(results, u)
            and all(getattr(u, k) in v for k, v in (only or {}).items())]
    # A unit with a checkpoint goes first: it is what the previous call left.
    todo.sort(key=lambda u: not (work_dir(results, u) / "ckpt").exists())
    outcomes = []
    trainer = None  # the previous unit's, reused when only the seed or cadences change
    for unit in todo:
        left = deadline - time.perf_counter()
        reused = reusable_trainer(trainer, spec, unit)
        est = estimate_s(spec, unit, results, compiled=reused is not None)
        if left < min(30.0, 0.1 * budget_s) or (est is not None
                                                 and left < est <= budget_s - reserve_s):
            print(f"[{spec.name}] {left:.0f}s left, {unit.name} needs ~{est or 0:.0f}s: "
                  "stopping here", flush=True)
            break
        if unit.corpus not in corpora:
            corpora[unit.corpus] = data_lib.load_corpus(**CORPORA[unit.corpus],
                                                        cache_dir=corpus_cache_dir(results))
            print(f"[{unit.corpus}] {corpora[unit.corpus].describe()}", flush=True)
        steps = spec.steps(unit.tokens_per_param)
        epochs = steps * spec.batch * spec.seq / len(corpora[unit.corpus].train)
        print(f"[{spec.name}] {unit.name}: {steps} steps, "
              f"{steps * spec.batch * spec.seq / spec.params:.1f} tokens/param, "
              f"{epochs:.3f} epochs" + (f", ~{est:.0f}s expected" if est else ""), flush=True)
        trainer = reused or tl.Trainer(spec.model_config(), spec.run_config(unit), steps)
        try:
            out = run_unit(spec, unit, results, corpora[unit.corpus], deadline=deadline,
                           trainer=trainer, command=command, progress=progress)
        except TooLong as e:
            print(f"SKIPPED {unit.name}: {e}", flush=True)
            continue
        out.state = None  # the parameters are in the result or the checkpoint: free them
        outcomes.append(out)
        if out.finished:
            r = out.result
            print(f"[{spec.name}] {unit.name} finished: val {r['final_val_bpb']:.4f} bpb, "
                  f"{(r['step_time_s'] or math.nan) * 1e3:.1f} ms/step, compile "
                  f"{r['compile_s'] or math.nan:.0f}s, {r['epochs']:.3f} epochs", flush=True)
        else:
            print(f"[{spec.name}] {unit.name} cut off at step {out.steps} of {steps} "
                  "(checkpointed)", flush=True)
            break
    return outcomes


def status_lines(spec: StudySpec, results: Path) -> list[str]:
    """One line per unit: finished (final validation bits per byte), checkpointed, or not
    started."""
    lines = []
    for u in spec.units():
        r = finished(results, u)
        ckpt = work_dir(results, u) / "ckpt"
        if r:
            lines.append(f"  {u.name:<34} done: val {r['final_val_bpb']:.4f} bpb")
        elif ckpt.exists():
            with Checkpointer(ckpt) as c:
                lines.append(f"  {u.name:<34} checkpoint at step {c.latest_step()} of "
                             f"{spec.steps(u.tokens_per_param)}")
        else:
            lines.append(f"  {u.name:<34} not started")
    return lines


