"""Several seeds of one study variant trained as one program (issue 12's seed counts).

At its run lengths the validation study needs tens of seeds per variant for a ±0.3 pp
interval (docs/STUDY.md: "seeds for ±0.3 pp"), and its small models, trained one seed at
a time, leave most of an H200 idle. `run_seed_batch` trains units that differ only in
their seed as one vmapped program (`fp4jax.train.TrainStep.vmapped`): the seeds' states
stacked, each with its own initialization, run key (so its own SR bits) and data order;
one stacked batch per step; every seed's validation in one vmapped pass. Each finished
unit writes the result JSON that `unit_runs.run_unit` writes (the report reads both),
with ``seed_batch`` naming the batch. The batched GEMMs may sum in another order than a
single run's, so a unit is not bitwise the unbatched run of its seed: the same recipe,
a statistically equivalent run.

A batch has no checkpoints (it runs to its end within one call). The seeds whose run
config samples per-layer diagnostics (`StudySpec.diag_seeds`) sample them at the steps an
unbatched run would, each from its own slice of the stacked state and batch, through the
one compiled diagnostics step (a forward pass: the batch compiles it once, whatever the
number of such seeds). Within a call, a later batch of a variant, length and size that an
earlier batch compiled reuses its programs (`BatchPrograms`): an NVFP4 batch compiles for
40-100 s on the H200, and the persistent cache cannot serve it (`unit_runs`).

Example:
  >>> import numpy as np
  >>> stack([{"w": np.zeros(2)}, {"w": np.ones(2)}])["w"].tolist()
  [[0.0, 0.0], [1.0, 1.0]]
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from study_specs import CORPORA, StudySpec, Unit  # first: it puts examples/ on sys.path

# isort: split
import data as data_lib
import jax
import jax.numpy as jnp
import numpy as np
import train_llama as tl
from unit_records import environment
from unit_runs import (
    TooLong,
    build_result,
    checked_epochs,
    finished,
    paused_s,
    result_path,
    reusable_trainer,
    write_json,
)

from fp4jax import diagnostics


def stack(trees: Sequence[Any]) -> Any:
    """The trees' leaves stacked along a new leading axis (one entry per tree)."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def stacked_batches(batch_fns: Sequence[Callable[[int], tuple]]) -> Callable[[int], tuple]:
    """Batch ``i`` of every seed's data, stacked on the host: ``(K, batch, seq)`` arrays."""
    def batch(i: int) -> tuple:
        return tuple(np.stack(parts) for parts in zip(*(fn(i) for fn in batch_fns)))
    return batch


class SeedBatch:
    """The trainers of one variant's seeds and their vmapped steps and evaluation.

    Args:
      trainer: the first seed's `train_llama.Trainer`; the others are its `for_run`
        copies (the same compiled model, another seed's initialization).
      run_configs: each seed's run config, in the order of the stacked axis (the first
        is ``trainer``'s); they may differ only in `train_llama.RUN_ONLY_FIELDS` (the
        seed, the logging, evaluation and diagnostics cadences), and the batch follows
        the first's logging and evaluation cadence.
      earlier: an earlier batch whose programs ``trainer`` runs on (`BatchPrograms`):
        this batch shares its jitted validation passes and records that it compiled
        nothing of its own (``reused_programs``).

    Raises:
      ValueError: fewer than two seeds, a seed twice, a first config other than the
        trainer's, a config that changes a compiled field, seeds that sample diagnostics
        at different cadences, or a mesh.
    """

    def __init__(self, trainer: tl.Trainer, run_configs: Sequence[tl.RunConfig],
                 earlier: SeedBatch | None = None):
        seeds = [c.seed for c in run_configs]
        if len(seeds) < 2 or len(set(seeds)) != len(seeds):
            raise ValueError(f"a seed batch needs two or more distinct seeds, got {seeds}")
        if run_configs[0] != trainer.cfg:
            raise ValueError("a seed batch's first run config is its trainer's")
        if trainer.mesh_rules is not None:
            raise ValueError("a seed batch runs on one device: the run config has a mesh")
        self.seeds = tuple(seeds)
        self.trainers = [trainer] + [trainer.for_run(c) for c in run_configs[1:]]
        self.trainer = self.trainers[0]
        # Positions of the seeds that sample diagnostics (quantized runs whose config
        # sets diag_every), all at one cadence.
        self.diag_indices = tuple(i for i, t in enumerate(self.trainers)
                                  if t.cfg.diag_every and t.report is not None)
        cadences = {self.trainers[i].cfg.diag_every for i in self.diag_indices}
        if len(cadences) > 1:
            raise ValueError(f"the seeds that sample diagnostics differ in diag_every: "
                             f"{sorted(cadences)}")
        self.diag_every = cadences.pop() if cadences else 0
        # The jitted validation passes by precision mode (filled on first use).
        self.evals: dict[str, Callable] = {} if earlier is None else earlier.evals
        self.reused_programs = earlier is not None

    def init(self, total_steps: int) -> Any:
        """The seeds' fresh states, stacked."""
        return stack([t.init(total_steps) for t in self.trainers])

    def diagnose(self, params: Any, batch: tuple, mode: str) -> dict[int, dict[str, float]]:
        """``{position: {"diag/layer/op/stat": value}}`` for `diag_indices`, each from
        that seed's params and training batch (waits for the device)."""
        out = {}
        for i in self.diag_indices:
            own = jax.tree.map(lambda x, i=i: x[i], (params, batch))
            _, stats = self.trainer.diag_step(*own, mode=mode)
            out[i] = {k: float(v) for k, v in
                      diagnostics.flatten(jax.device_get(stats), prefix="diag/").items()}
        return out

    def evaluate(self, params: Any, val: list, mode: str) -> np.ndarray:
        """Each seed's mean validation loss in bits per byte (waits for the device)."""
        if mode not in self.evals:
            eval_step = self.trainer.eval_step
            self.evals[mode] = jax.jit(jax.vmap(
                lambda p, b: eval_step(p, b, mode=mode)["loss"], in_axes=(0, None)))
        losses = [self.evals[mode](params, b) for b in val]
        return np.mean(np.stack(jax.device_get(losses)), axis=0) / math.log(2.0)


class BatchPrograms:
    """The seed batches run so far in this process, by study, variant, run length and
    batch size: a later batch of the same four takes its first trainer as a
    `train_llama.Trainer.for_run` of the earlier batch's (the same compiled step and
    diagnostics step) and shares its validation passes, instead of compiling them again.

    Example:
      >>> BatchPrograms().batches
      {}
    """

    def __init__(self) -> None:
        self.batches: dict[tuple, SeedBatch] = {}

    def seed_batch(self, spec: StudySpec, units: Sequence[Unit],
                   run_configs: Sequence[tl.RunConfig], steps: int) -> SeedBatch:
        """``units``' `SeedBatch`, on an earlier batch's programs where they serve."""
        key = self.key(spec, units)
        earlier = self.batches.get(key)
        trainer = earlier and reusable_trainer(earlier.trainer, spec, units[0])
        if trainer is not None:
            batch = SeedBatch(trainer, run_configs, earlier=earlier)
        else:
            batch = SeedBatch(tl.Trainer(spec.model_config(), run_configs[0], steps),
                              run_configs)
        self.batches[key] = batch
        return batch

    def compiled(self, spec: StudySpec, units: Sequence[Unit]) -> bool:
        """Whether an earlier batch compiled the programs ``units``' batch runs on."""
        return self.key(spec, units) in self.batches

    @staticmethod
    def key(spec: StudySpec, units: Sequence[Unit]) -> tuple:
        """What a batch's compiled programs depend on: study, variant, length, size."""
        return (spec.name, units[0].variant, units[0].tokens_per_param, len(units))


def train_seeds(batch: SeedBatch, data: Sequence[data_lib.Batches], val: list, *,
                steps: int, progress: bool = False) -> dict[str, Any]:
    """Trains the batch's seeds for ``steps`` steps.

    Returns:
      ``final_state`` (stacked), per seed (lists in seed order) ``final_val_bpb`` and
      ``records`` (`train_llama.train`'s ``metrics.jsonl`` records: training metrics
      every ``log_every`` steps, validation every ``eval_every``, diagnostics every
      ``diag_every`` for `SeedBatch.diag_indices`), and the shared
      ``step_time_s`` (after the first step, without the first step in a later
      precision mode: `train_llama.ModeSwitches`), ``first_step_s``, ``paused_s``,
      ``mode_switch_s``, ``train_wall_s`` and ``final_mode``.
    """
    trainer, cfg = batch.trainer, batch.trainer.cfg
    trainer.set_total_steps(steps)  # the seeds' trainers share this compiled step
    step_fn = trainer.step.vmapped()
    state = batch.init(steps)
    val = jax.device_put(val)
    k = len(batch.seeds)
    records: list[list[dict]] = [[] for _ in range(k)]
    pending: list[tuple[int, dict]] = []
    in_flight: collections.deque = collections.deque()
    paused, t_warm = 0.0, None
    switches = tl.ModeSwitches()

    def flush() -> None:
        for done, metrics in jax.device_get(pending):
            for s in range(k):
                records[s].append({"step": done, **{n: float(v[s]) if np.ndim(v) else v
                                                    for n, v in metrics.items()}})
        pending.clear()

    t_start = time.perf_counter()
    feed = data_lib.DevicePrefetcher(stacked_batches(data), 0, steps, depth=tl.PREFETCH)
    try:
        for i, stacked in feed:
            mode = trainer.step.mode(i)
            t_switch = switches.begin(mode, state.params)
            state, metrics = step_fn(state, stacked, mode=mode)
            switches.end(t_switch, state.params)
            done = i + 1
            if i == 0:
                jax.block_until_ready(state.params)
                t_warm = time.perf_counter()
            in_flight.append(metrics["loss"])
            if len(in_flight) > tl.STEPS_AHEAD:  # the training loop's flow control
                jax.block_until_ready(in_flight.popleft())
            if cfg.log_every and (done % cfg.log_every == 0 or done == steps):
                pending.append((done, {**metrics, "mode": mode,
                                       "tokens": done * cfg.batch * cfg.seq}))
            evaluate = cfg.eval_every and done % cfg.eval_every == 0 and done < steps
            diagnose = batch.diag_every and done % batch.diag_every == 0
            if evaluate or diagnose:
                flush()  # records stay in step order
                jax.block_until_ready(state.params)
                t_pause = time.perf_counter()
                if evaluate:
                    vals = batch.evaluate(state.params, val, mode)
                    for s, v in enumerate(vals):
                        records[s].append({"step": done, "val_bits_per_byte": float(v)})
                if diagnose:
                    for s, flat in batch.diagnose(state.params, stacked, mode).items():
                        records[s].append({"step": done, **flat})
                paused += time.perf_counter() - t_pause
                if progress and evaluate:
                    print(f"  step {done}/{steps}: val bpb "
                          + " ".join(f"{v:.4f}" for v in vals), flush=True)
    finally:
        feed.close()
    jax.block_until_ready(state.params)
    t_end = time.perf_counter()
    flush()
    final_mode = trainer.step.mode(steps - 1)
    final = batch.evaluate(state.params, val, final_mode)
    for s, v in enumerate(final):
        records[s].append({"step": steps, "val_bits_per_byte": float(v)})
    return {
        "final_state": state, "final_val_bpb": [float(v) for v in final], "records": records,
        "final_mode": final_mode, "paused_s": paused, "train_wall_s": t_end - t_start,
        "first_step_s": t_warm - t_start if t_warm else None,
        "step_time_s": switches.step_time(t_end - t_warm - paused, steps - 1) if t_warm
        else None,
        "mode_switch_s": switches.seconds,
    }


def run_seed_batch(spec: StudySpec, units: Sequence[Unit], results: Path,
                   corpus: data_lib.Corpus, *, command: str = "", progress: bool = False,
                   programs: BatchPrograms | None = None) -> list[dict[str, Any]]:
    """Trains ``units`` (one variant, corpus and length; distinct seeds; none finished)
    as one seed batch and writes each one's result JSON; returns the results. Given
    ``programs``, the batch runs on an earlier batch's compiled programs where they
    serve and leaves its own there for a later one.

    Raises:
      ValueError: if the units differ in more than their seed, or one has a result.
      TooLong: if the units would read ``spec.max_epochs`` or more of their corpus.
    """
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    first = units[0]
    if any((u.corpus, u.tokens_per_param, u.variant) != (first.corpus, first.tokens_per_param,
                                                         first.variant) for u in units):
        raise ValueError(f"a seed batch's units differ only in their seed, got "
                         f"{[u.name for u in units]}")
    done = [u.name for u in units if result_path(results, u).exists()]
    if done:
        raise ValueError(f"already finished: {done}")
    steps = spec.steps(first.tokens_per_param)
    cfgs = [spec.run_config(u) for u in units]
    data = [data_lib.Batches(corpus.train, batch=c.batch, seq=c.seq, seed=u.seed)
            for c, u in zip(cfgs, units)]
    epochs = checked_epochs(spec, first, data[0], corpus)
    val = data_lib.validation_batches(corpus.val, batch=cfgs[0].batch, seq=cfgs[0].seq,
                                      max_batches=cfgs[0].eval_batches)
    batch = (programs or BatchPrograms()).seed_batch(spec, units, cfgs, steps)
    out = train_seeds(batch, data, val, steps=steps, progress=progress)
    extra_bf16 = None
    trainer = batch.trainer
    if spec.eval_bf16_forward and trainer.report is not None and out["final_mode"] != "bf16":
        extra_bf16 = batch.evaluate(out["final_state"].params, jax.device_put(val), "bf16")
    env = environment(command)
    written = []
    for s, unit in enumerate(units):
        summary = {
            "steps": steps, "epochs": epochs, "final_val_bpb": out["final_val_bpb"][s],
            "final_mode": out["final_mode"], "params": spec.model_config().param_counts(),
            "quantized_layers": len(trainer.report.quantized) if trainer.report else 0,
            "matmul_layers": len(trainer.report.decisions) if trainer.report else None,
        }
        # Times per unit: the batch's divided by its seeds (its first step, which
        # compiles, as it is); the batch's own are under "seed_batch".
        share = 1.0 / len(units)
        segment = {"from": 0, "to": steps,
                   "step_time_s": out["step_time_s"] and out["step_time_s"] * share,
                   "first_step_s": out["first_step_s"],
                   "train_wall_s": out["train_wall_s"] * share,
                   "paused_s": out["paused_s"] * share,
                   "mode_switch_s": out["mode_switch_s"] * share, "environment": env}
        extra: dict[str, Any] = {"seed_batch": {
            "seeds": list(batch.seeds), "index": s, "step_time_s": out["step_time_s"],
            "train_wall_s": out["train_wall_s"], "paused_s": out["paused_s"],
            "mode_switch_s": out["mode_switch_s"],
            "samples_diagnostics": bool(batch.diag_indices),
            "reused_programs": batch.reused_programs}}
        if extra_bf16 is not None:
            extra["final_val_bpb_bf16_forward"] = float(extra_bf16[s])
        result = build_result(spec, unit, summary, out["records"][s], [segment], corpus, extra)
        write_json(result_path(results, unit), result)
        written.append(result)
    return written


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
        sb = r and r.get("seed_batch")
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
    are no guide (they compiled nothing).
    """
    tpp = units[0].tokens_per_param
    timed = [(u.variant, {**sb, "compile_s": r.get("compile_s") or 0.0})
             for u in spec.units() if u.tokens_per_param == tpp
             for r in [finished(results, u)] if r and r.get("seed_batch")
             for sb in [r["seed_batch"]] if compiled or not sb.get("reused_programs")]
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


def run_seed_batches(spec: StudySpec, results: Path, *, size: int, budget_s: float,
                     only: dict[str, set] | None = None, command: str = "",
                     progress: bool = False, t_begin: float | None = None,
                     after_batch: Callable[[], Any] | None = None,
                     unestimated_min_s: float | None = None) -> list[dict]:
    """Runs `batch_plan`'s batches in order, each one whose `batch_wall_estimate` fits the
    time left (of ``budget_s`` from ``t_begin``), leaving the others to a later call; a
    batch with no estimate (none of its length and kind timed) runs only as the call's
    first, with the whole budget before it, or, given ``unestimated_min_s``, whenever at
    least that much time is left (the caller's bound on it). A batch whose variant, length
    and size an earlier batch of the call compiled runs on its programs (`BatchPrograms`)
    and is estimated without a compilation. Calls
    ``after_batch`` after each finished batch (to hand its results off at once: a call cut
    off later keeps them). Returns the finished units' results."""
    t_begin = time.perf_counter() if t_begin is None else t_begin
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    corpora: dict[str, data_lib.Corpus] = {}
    programs = BatchPrograms()
    done: list[dict] = []
    for units in batch_plan(spec, results, size, only):
        left = budget_s - (time.perf_counter() - t_begin)
        need = batch_wall_estimate(spec, results, units,
                                   compiled=programs.compiled(spec, units))
        names = ", ".join(u.name for u in units)
        if need is None and (left < unestimated_min_s if unestimated_min_s is not None
                             else bool(done)):
            print(f"[{spec.name}] {left:.0f}s left, the batch {names} has no timed batch "
                  "of its length and kind to go by: left to a later call", flush=True)
            continue
        if need is not None and left < need:
            print(f"[{spec.name}] {left:.0f}s left, the batch {names} needs ~{need:.0f}s: "
                  "left to a later call", flush=True)
            continue  # a later, shorter batch may still fit
        corpus = units[0].corpus
        if corpus not in corpora:
            corpora[corpus] = data_lib.load_corpus(**CORPORA[corpus])
        print(f"[{spec.name}] seed batch {names}", flush=True)
        try:
            out = run_seed_batch(spec, units, results, corpora[corpus], command=command,
                                 progress=progress, programs=programs)
        except TooLong as e:
            print(f"SKIPPED {names}: {e}", flush=True)
            continue
        sb = out[0]["seed_batch"]
        print(f"[{spec.name}] finished: val bpb "
              + " ".join(f"{r['final_val_bpb']:.4f}" for r in out)
              + f"; {sb['step_time_s'] * 1e3:.1f} ms per batched step, "
              f"{sb['train_wall_s']:.0f}s", flush=True)
        done += out
        if after_batch is not None:
            after_batch()
    return done
