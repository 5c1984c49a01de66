"""Multi-seed, resumable validation study: does NVFP4 train as well as BF16? (issue 12)

    PYTHONPATH=. python studies/validation.py plan pure_llama          # sizes, epochs, status
    PYTHONPATH=. python studies/validation.py run pure_llama --budget-s 500 --handoff $OUT
    PYTHONPATH=. python studies/validation.py unpack pure_llama --from DIR  # after a call
    PYTHONPATH=. python studies/validation.py report                   # docs/STUDY.md + PNGs

The studies and their units are specified in `study_specs`. Each unit runs through the
examples' own training loop (`train_llama.Trainer`, `train_llama.train`), which checkpoints with
`fp4jax.checkpoint` and resumes bit for bit: the state holds the run key and the step,
batch ``i`` depends only on ``(seed, i)``, SR keys on ``(key, step)``.

``run`` trains the unfinished units until ``--budget-s`` is spent: a unit cut off by the
budget saves a checkpoint and continues in the next call; a finished unit writes
``<results>/<unit>.json`` (validation curve, final validation loss in bits per byte,
training curve, step times, per-layer quantization diagnostics, the environment). Those
JSON files are the results: commit them. The working files (checkpoints, metrics,
``jax_cache/``, the persistent compilation cache) live under ``<results>/work`` and are
not committed. Within a call, the later seeds of a variant reuse the first one's compiled
steps (`train_llama.Trainer.for_run`): the persistent cache cannot serve them when the
step holds Pallas Mosaic GPU kernels, whose serialized modules carry a per-trace name
(JAX 0.11.2).

Device calls start on a fresh machine unless the previous call ended moments before, so
``run --handoff DIR`` also writes into ``DIR`` (the device tool's ``$OUT``) the results,
the checkpoint of a unit cut off by the budget if small enough, and the newest
compilation-cache entries that fit; ``unpack`` puts them back here (results into the
study's folder, the rest into ``studies/handoff/``, which the next call carries and
``run --resume-from`` reads).
docs/STUDY.md says how to run each study in device calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from study_specs import CORPORA, REPO, STUDIES, VARIANTS, StudySpec, Unit

# isort: split
import data as data_lib
import handoff
import jax
import train_llama as tl
from unit_records import corpus_info, diagnostics_samples, environment, latest_by_step, read_records

from fp4jax.checkpoint import Checkpointer

# ---------------------------------------------------------------------------------------
# Running units


def _write_json(path: Path, obj: Any) -> None:
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
    epochs = batches.epochs(steps)
    if epochs >= spec.max_epochs:
        raise TooLong(
            f"{spec.name}/{unit.name}: {steps} steps of {cfg.batch}x{cfg.seq} tokens read "
            f"{epochs:.2f} epochs of the {unit.corpus} corpus ({len(corpus.train) / 1e6:.1f} MB "
            f"train), not under max_epochs={spec.max_epochs}: use a smaller model or fewer "
            "tokens per parameter")
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
        "paused_s": summary["paused_s"], "environment": environment(command),
    })
    _write_json(seg_path, segments)
    if summary["steps"] < steps:
        return Outcome(unit, False, summary["steps"], None, state)
    extra = {}
    if spec.eval_bf16_forward and trainer.report is not None and summary["final_mode"] != "bf16":
        # The same weights with every GEMM unquantized: how much of the gap is the forward?
        extra["final_val_bpb_bf16_forward"] = trainer.evaluate(
            state.params, jax.device_put(val, trainer.batch_sharding), "bf16")
    result = build_result(spec, unit, summary, read_records(work / "metrics.jsonl"), segments,
                          corpus, extra)
    _write_json(result_path(results, unit), result)
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


def finished(results: Path, unit: Unit) -> dict[str, Any] | None:
    """A finished unit's result, or None."""
    p = result_path(results, unit)
    return json.loads(p.read_text()) if p.exists() else None


def _reusable(trainer: tl.Trainer | None, spec: StudySpec, unit: Unit) -> tl.Trainer | None:
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
             for r in [finished(results, u)] if r and r.get("train_wall_s") and r.get("steps")]
    if not alike:
        return None

    def paused(r):
        return sum(s.get("paused_s") or 0.0 for s in r.get("segments", ()))

    timed = [r for u, r in alike if u.variant == unit.variant] or [r for _, r in alike]
    paused_by = ([r for u, r in alike if (spec.run_config(u).diag_every > 0) == diag]
                 or [r for _, r in alike])
    compile_s = 0.0 if compiled else max(r.get("compile_s") or 0.0 for r in timed)
    train = statistics.median(
        (r["train_wall_s"] - (r.get("compile_s") or 0.0) - paused(r)) * steps / r["steps"]
        for r in timed)
    return compile_s + train + statistics.median(paused(r) for r in paused_by)


# ---------------------------------------------------------------------------------------
# Handing work to the next device call

HANDOFF_FILES = 8
"""Files a device call returns at most."""

HANDOFF_BYTES = 60 * 2**20
"""Bytes to hand off at most: a call returns 64 MiB, and the next carries them in its
64 MiB working tree (with the repository)."""


def _checkpoint_members(results: Path, unit: Unit) -> tuple[int, list[tuple[Path, str]]] | None:
    """A cut-off unit's latest checkpoint and metrics as (file, name in the archive)."""
    work = work_dir(results, unit)
    ckpt = work / "ckpt"
    if finished(results, unit) or not ckpt.exists():
        return None
    with Checkpointer(ckpt) as c:
        step = c.latest_step()
    if step is None:
        return None
    files = [p for p in work.iterdir() if p.is_file()]
    files += [p for p in ckpt.iterdir() if p.is_file()]
    files += [p for p in (ckpt / str(step)).rglob("*") if p.is_file()]
    return step, [(p, p.relative_to(work.parent).as_posix()) for p in files]


def pack_handoff(spec: StudySpec, results: Path, out: Path,
                 cache_dir: Path | None = None) -> list[str]:
    """Writes into ``out`` what the next call needs, within `HANDOFF_FILES` and
    `HANDOFF_BYTES`: the finished results (``results-STUDY.tar.gz``); the checkpoint and
    metrics of each cut-off unit that fits (``partial-STUDY-UNIT-stepN.tar.partK``); then
    as many of the newest compilation-cache entries as fit (``cache-STUDY.tar.partK``).
    Returns notes to print."""
    results, out = Path(results), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done = sorted(results.glob("*.json"))
    with tarfile.open(out / f"results-{spec.name}.tar.gz", "w:gz") as tar:
        for p in done:
            tar.add(p, arcname=p.name)
    notes = [f"handoff: {len(done)} results in results-{spec.name}.tar.gz"]
    files_left = HANDOFF_FILES - 1
    bytes_left = HANDOFF_BYTES - (out / f"results-{spec.name}.tar.gz").stat().st_size
    for unit in spec.units():
        found = _checkpoint_members(results, unit)
        if found is None:
            continue
        step, members = found
        size = handoff.archive_bytes([p.stat().st_size for p, _ in members])
        k = None
        if size <= bytes_left:
            k = handoff.pack(members, out, f"partial-{spec.name}-{unit.name}-step{step}.tar",
                             max_parts=files_left)
        if k is None:
            notes.append(f"handoff: {unit.name} at step {step} ({size / 2**20:.0f} MiB) does not "
                         "fit: it restarts unless the next call finds this machine warm")
            continue
        files_left, bytes_left = files_left - k, bytes_left - size
        notes.append(f"handoff: {unit.name} at step {step} ({size / 2**20:.1f} MiB, {k} parts)")
    if cache_dir is not None and Path(cache_dir).is_dir() and files_left > 0:
        entries = sorted((p for p in Path(cache_dir).rglob("*") if p.is_file()),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        chosen: list[Path] = []
        for p in entries:  # newest first: this call's compilations
            size = handoff.archive_bytes([q.stat().st_size for q in chosen + [p]])
            if size <= bytes_left and -(-size // handoff.PART_BYTES) <= files_left:
                chosen.append(p)
        if chosen:
            k = handoff.pack([(p, p.relative_to(cache_dir).as_posix()) for p in chosen], out,
                             f"cache-{spec.name}.tar", max_parts=files_left)
            notes.append(f"handoff: {len(chosen)} of {len(entries)} compilation-cache files "
                         f"({k} parts)")
    return notes


def _partial_key(spec: StudySpec, stem: str) -> tuple[str, int]:
    """``partial-STUDY-UNIT-stepN.tar`` -> (UNIT, N)."""
    name, _, step = stem[len(f"partial-{spec.name}-"):-len(".tar")].rpartition("-step")
    return name, int(step)


def restore_handoff(spec: StudySpec, results: Path, src: Path,
                    cache_dir: Path | None = None) -> list[str]:
    """Unpacks what `pack_handoff` wrote (and `unpack` carried) in ``src``: each
    checkpoint into the work folder, unless its unit is finished or has a checkpoint as
    far; the compilation-cache entries into ``cache_dir``. Returns notes to print."""
    notes = []
    units = {u.name: u for u in spec.units()}
    for stem, parts in handoff.find_parts(src, f"partial-{spec.name}-").items():
        name, step = _partial_key(spec, stem)
        unit = units.get(name)
        if unit is None or finished(results, unit):
            continue
        ckpt = work_dir(results, unit) / "ckpt"
        if ckpt.exists():
            with Checkpointer(ckpt) as c:
                if (c.latest_step() or -1) >= step:
                    continue
        shutil.rmtree(work_dir(results, unit), ignore_errors=True)
        handoff.unpack_parts(parts, Path(results) / "work")
        notes.append(f"resumed {name} from the handed-off checkpoint at step {step}")
    for parts in handoff.find_parts(src, f"cache-{spec.name}.").values():
        if cache_dir is not None:
            handoff.unpack_parts(parts, cache_dir)
            notes.append(f"compilation cache: {len(parts)} handed-off parts into {cache_dir}")
    return notes


def unpack(spec: StudySpec, results: Path, src: Path, carry: Path) -> list[str]:
    """After a device call, here: the results from ``src`` into ``results``; the handed-off
    checkpoints of unfinished units and the compilation cache into ``carry`` (replacing
    this study's older ones there), for the next call to carry."""
    results, src, carry = Path(results), Path(src), Path(carry)
    notes = []
    tar_path = src / f"results-{spec.name}.tar.gz"
    if tar_path.exists():
        results.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar_path) as tar:
            names = [m for m in tar.getmembers()
                     if m.isfile() and "/" not in m.name and m.name.endswith(".json")]
            tar.extractall(results, members=names, filter="data")
        notes.append(f"{len(names)} results in {results}")
    for prefix in (f"partial-{spec.name}-", f"cache-{spec.name}."):
        for parts in handoff.find_parts(carry, prefix).values():
            for old in parts:
                old.unlink()
    units = {u.name: u for u in spec.units()}
    for prefix in (f"partial-{spec.name}-", f"cache-{spec.name}."):
        for stem, parts in handoff.find_parts(src, prefix).items():
            if prefix.startswith("partial"):
                unit = units.get(_partial_key(spec, stem)[0])
                if unit is None or finished(results, unit):
                    continue
            carry.mkdir(parents=True, exist_ok=True)
            for p in parts:
                shutil.copyfile(p, carry / p.name)
            notes.append(f"{stem}: {len(parts)} parts in {carry} (carry it)")
    return notes


# ---------------------------------------------------------------------------------------
# The study loop


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
        reused = _reusable(trainer, spec, unit)
        est = estimate_s(spec, unit, results, compiled=reused is not None)
        if left < min(30.0, 0.1 * budget_s) or (est is not None
                                                 and left < est <= budget_s - reserve_s):
            print(f"[{spec.name}] {left:.0f}s left, {unit.name} needs ~{est or 0:.0f}s: "
                  "stopping here", flush=True)
            break
        if unit.corpus not in corpora:
            corpora[unit.corpus] = data_lib.load_corpus(**CORPORA[unit.corpus])
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


# ---------------------------------------------------------------------------------------
# CLI


def _only(a: argparse.Namespace) -> dict[str, set]:
    only: dict[str, set] = {}
    if a.variants:
        only["variant"] = set(a.variants.split(","))
    if a.corpora:
        only["corpus"] = set(a.corpora.split(","))
    if a.seeds:
        only["seed"] = {int(s) for s in a.seeds.split(",")}
    return only


def main(argv: list[str] | None = None) -> int:
    """The CLI (see the module docstring); returns the exit status."""
    t_begin = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("plan", "run", "unpack"):
        s = sub.add_parser(name)
        s.add_argument("study", choices=sorted(STUDIES))
        s.add_argument("--results", default=None,
                       help="the study's results folder (default studies/results/STUDY)")
    sub.choices["plan"].add_argument("--no-corpus", action="store_true",
                                     help="do not load the corpora (no epochs)")
    r = sub.choices["run"]
    r.add_argument("--budget-s", type=float, required=True,
                   help="wall-clock seconds for this call (keep ~60 s under the call's limit)")
    r.add_argument("--reserve-s", type=float, default=30.0,
                   help="kept from the budget for a cut-off unit's last evaluation and save")
    r.add_argument("--variants", default="", help="only these variants (comma-separated)")
    r.add_argument("--corpora", default="", help="only these corpora")
    r.add_argument("--seeds", default="", help="only these seeds")
    r.add_argument("--handoff", default=None,
                   help="write results and a cut-off unit's checkpoint here ($OUT)")
    r.add_argument("--resume-from", default=None,
                   help="a folder of handed-off checkpoints (the carried studies/handoff)")
    r.add_argument("--compile-cache", default=None,
                   help="JAX persistent compilation cache (default RESULTS/work/jax_cache; "
                        "'none': off)")
    r.add_argument("--progress", action="store_true")
    u = sub.choices["unpack"]
    u.add_argument("--from", dest="src", required=True, help="the files a device call returned")
    u.add_argument("--carry", default=str(REPO / "studies" / "handoff"),
                   help="where handed-off checkpoints wait for the next call")
    rep = sub.add_parser("report", help="docs/STUDY.md and its figures from the results")
    rep.add_argument("studies", nargs="*", help="default: every study in the report")
    rep.add_argument("--results", default=None, help="with one study: its results folder")
    rep.add_argument("--results-root", default=str(REPO / "studies" / "results"))
    rep.add_argument("--doc", default=str(REPO / "docs" / "STUDY.md"))
    rep.add_argument("--figures", default=str(REPO / "docs" / "study"))
    a = p.parse_args(argv)
    command = "python studies/validation.py " + " ".join(argv)

    if a.cmd == "report":
        import study_report  # noqa: PLC0415 - matplotlib only for the report

        names = a.studies or [n for n, s in STUDIES.items() if s.in_report]
        bad = [n for n in names if n not in STUDIES]
        if bad:
            p.error(f"unknown studies {bad}; choose from {sorted(STUDIES)}")
        if a.results and len(names) != 1:
            p.error("--results needs exactly one study")
        dirs = {n: Path(a.results) if a.results else Path(a.results_root) / n for n in names}
        text = study_report.write_report([STUDIES[n] for n in names], dirs, Path(a.doc),
                                   Path(a.figures), command=command)
        print(text)
        return 0

    spec = STUDIES[a.study]
    results = Path(a.results) if a.results else REPO / "studies" / "results" / spec.name
    if a.cmd == "unpack":
        for line in unpack(spec, results, Path(a.src), Path(a.carry)):
            print(line)
        return 0
    print(f"[{spec.name}] {spec.title}\n  {spec.describe()}", flush=True)
    if a.cmd == "plan":
        if not a.no_corpus:
            for c in spec.corpora:
                corpus = data_lib.load_corpus(**CORPORA[c])
                print(f"  [{c}] {corpus.describe()}")
                for t in spec.tokens_per_param:
                    b = data_lib.Batches(corpus.train, batch=spec.batch, seq=spec.seq, seed=0)
                    ep = b.epochs(spec.steps(t))
                    flag = "" if ep < spec.max_epochs else f"  TOO LONG (max {spec.max_epochs})"
                    print(f"    {t:g} tokens/param: {ep:.3f} epochs{flag}")
        print(f"  {len(spec.units())} units; keep-last of the paper recipe: "
              f"{VARIANTS['paper'].keep_last(spec.num_blocks)} of {spec.num_blocks} blocks")
        print("\n".join(status_lines(spec, results)))
        return 0

    # run
    cache = a.compile_cache or str(results / "work" / "jax_cache")
    if cache != "none":
        jax.config.update("jax_compilation_cache_dir", cache)
    print(f"  device {jax.devices()[0].device_kind} ({jax.default_backend()}), jax "
          f"{jax.__version__}, compilation cache {cache}", flush=True)
    if a.resume_from:
        for line in restore_handoff(spec, results, Path(a.resume_from),
                                    None if cache == "none" else Path(cache)):
            print(line, flush=True)
    try:
        outcomes = run_study(spec, results, budget_s=a.budget_s, reserve_s=a.reserve_s,
                             only=_only(a), command=command, progress=a.progress,
                             t_begin=t_begin)
        done = sum(o.finished for o in outcomes)
        print(f"[{spec.name}] this call: {done} units finished, "
              f"{len(outcomes) - done} cut off; {time.perf_counter() - t_begin:.0f}s", flush=True)
    finally:
        if a.handoff:
            for line in pack_handoff(spec, results, Path(a.handoff),
                                     None if cache == "none" else Path(cache)):
                print(line, flush=True)
    left = [u for u in spec.units() if not finished(results, u)]
    print(f"[{spec.name}] {len(spec.units()) - len(left)} of {len(spec.units())} units done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
