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

A batch of a variant whose BF16-forward-tail variant (`tail_variant`) still lacks some
of its seeds trains those as a fork (`train_seeds`): the state before the switch is
kept, and after the batch a copy trains on with BF16 forward GEMMs. The forked runs share
the batch's up to the switch by construction, whatever kernels the GPU's autotuner picks
in another process, and cost only the steps after the switch (18% of a run).

A batch has no checkpoints (it runs to its end within one call). The seeds whose run
config samples per-layer diagnostics (`StudySpec.diag_seeds`) sample them at the steps an
unbatched run would, each from its own slice of the stacked state and batch, through the
one compiled diagnostics step (a forward pass: the batch compiles it once, whatever the
number of such seeds). Within a call, a later batch of a variant, length and size that an
earlier batch compiled reuses its programs (`BatchPrograms`): an NVFP4 batch compiles for
40-100 s on the H200, and the persistent cache cannot serve a second trace in one
process (`unit_runs`).

Example:
  >>> import numpy as np
  >>> stack([{"w": np.zeros(2)}, {"w": np.ones(2)}])["w"].tolist()
  [[0.0, 0.0], [1.0, 1.0]]
"""

from __future__ import annotations

import collections
import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from study_specs import CORPORA, StudySpec, Unit  # first: it puts examples/ on sys.path

# isort: split
import data as data_lib
import jax
import jax.numpy as jnp
import numpy as np
import train_llama as tl
from batch_plans import (
    batch_plan,
    batch_wall_estimate,
    fork_units,
    fork_wall_estimate,
    tail_variant,
)
from unit_records import environment
from unit_runs import (
    TooLong,
    build_result,
    checked_epochs,
    corpus_cache_dir,
    result_path,
    reusable_trainer,
    write_json,
)

from fp4jax import diagnostics
from fp4jax import train as train_lib


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


@contextlib.contextmanager
def compile_cache_hits() -> Iterator[list[int]]:
    """Counts JAX's persistent compilation cache hits within the block (a one-element
    list, updated as they happen).

    Example:
      >>> with compile_cache_hits() as hits:
      ...     pass
      >>> hits
      [0]
    """
    hits = [0]

    def listener(event: str, **_: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            hits[0] += 1

    jax.monitoring.register_event_listener(listener)
    try:
        yield hits
    finally:
        jax.monitoring.unregister_event_listener(listener)


def _copy_state(state: Any) -> Any:
    """New buffers holding ``state``'s arrays: the donating step leaves the copy alone."""
    return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, state)


def _train_span(batch: SeedBatch, step_fn: Callable, state: Any,
                data: Sequence[data_lib.Batches], val: list, records: list[list[dict]], *,
                start: int, steps: int, mode_of: Callable[[int], str], progress: bool,
                keep_at: int | None = None) -> dict[str, Any]:
    """Steps ``start`` to ``steps`` of the batch from ``state`` (modes by ``mode_of``),
    appending each seed's records, then its final evaluation; `train_seeds`' loop.
    Returns `train_seeds`' keys for the span and, where ``keep_at`` is given,
    ``kept``: a copy of the state before step ``keep_at``."""
    cfg = batch.trainer.cfg
    k = len(batch.seeds)
    pending: list[tuple[int, dict]] = []
    in_flight: collections.deque = collections.deque()
    paused, t_warm, kept = 0.0, None, None
    switches = tl.ModeSwitches()

    def flush() -> None:
        for done, metrics in jax.device_get(pending):
            for s in range(k):
                records[s].append({"step": done, **{n: float(v[s]) if np.ndim(v) else v
                                                    for n, v in metrics.items()}})
        pending.clear()

    t_start = time.perf_counter()
    # The persistent cache's hits while the span compiles: a batch that loaded its
    # programs is no guide to how long a fresh batch compiles (`batch_wall_estimate`).
    with compile_cache_hits() as cache_hits, contextlib.closing(data_lib.DevicePrefetcher(
            stacked_batches(data), start, steps, depth=tl.PREFETCH)) as feed:
        for i, stacked in feed:
            if i == keep_at:
                kept = _copy_state(state)
            mode = mode_of(i)
            t_switch = switches.begin(mode, state.params)
            state, metrics = step_fn(state, stacked, mode=mode)
            switches.end(t_switch, state.params)
            done = i + 1
            if i == start:
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
    jax.block_until_ready(state.params)
    t_end = time.perf_counter()
    flush()
    final_mode = mode_of(steps - 1)
    final = batch.evaluate(state.params, val, final_mode)
    for s, v in enumerate(final):
        records[s].append({"step": steps, "val_bits_per_byte": float(v)})
    return {
        "final_state": state, "final_val_bpb": [float(v) for v in final], "records": records,
        "final_mode": final_mode, "paused_s": paused, "train_wall_s": t_end - t_start,
        "first_step_s": t_warm - t_start if t_warm else None,
        "step_time_s": switches.step_time(t_end - t_warm - paused, steps - start - 1)
        if t_warm else None,
        "mode_switch_s": switches.seconds, "kept": kept, "compile_cache_hits": cache_hits[0],
    }


def train_seeds(batch: SeedBatch, data: Sequence[data_lib.Batches], val: list, *,
                steps: int, progress: bool = False,
                fork: train_lib.PrecisionSchedule | None = None) -> dict[str, Any]:
    """Trains the batch's seeds for ``steps`` steps.

    Args:
      fork: another precision schedule, one that agrees with the batch's own before its
        switch (the BF16-forward tail of the batch's recipe). The state before
        ``fork.switch_step`` is kept, and after the batch's run a copy of it trains on
        to ``steps`` under ``fork``'s modes, on the same batches (the data order and the
        SR keys are the seeds'): the runs a batch on that schedule trains, shared with
        this one up to the switch by construction, for the steps after the switch only.

    Returns:
      ``final_state`` (stacked), per seed (lists in seed order) ``final_val_bpb`` and
      ``records`` (`train_llama.train`'s ``metrics.jsonl`` records: training metrics
      every ``log_every`` steps, validation every ``eval_every``, diagnostics every
      ``diag_every`` for `SeedBatch.diag_indices`), and the shared
      ``step_time_s`` (after the first step, without the first step in a later
      precision mode: `train_llama.ModeSwitches`), ``first_step_s``, ``paused_s``,
      ``mode_switch_s``, ``train_wall_s``, ``final_mode`` and ``compile_cache_hits``
      (`compile_cache_hits` over the span). Given ``fork``, ``fork``
      holds the same for the forked runs: their records are the batch's up to the switch
      and then their own; their times are those of the steps after the switch, whose
      first (compiling the mode's program) is their ``mode_switch_s``.

    Raises:
      ValueError: a ``fork`` that does not switch within the run, or whose modes before
        the switch differ from the batch's.
    """
    trainer = batch.trainer
    trainer.set_total_steps(steps)  # the seeds' trainers share this compiled step
    keep_at = None
    if fork is not None:
        keep_at = fork.switch_step
        if keep_at is None or not 0 < keep_at < steps or any(
                fork.mode(i) != trainer.step.mode(i) for i in range(keep_at)):
            raise ValueError(f"a fork switches within the run ({steps} steps) and agrees "
                             f"with the batch's modes before its switch, got {fork}")
    step_fn = trainer.step.vmapped()
    val = jax.device_put(val)
    records: list[list[dict]] = [[] for _ in batch.seeds]
    out = _train_span(batch, step_fn, batch.init(steps), data, val, records, start=0,
                      steps=steps, mode_of=trainer.step.mode, progress=progress,
                      keep_at=keep_at)
    kept = out.pop("kept")
    if fork is not None:
        if progress:
            print(f"  fork from step {keep_at}: {fork.after} from there on", flush=True)
        forked = [[r for r in own if r["step"] <= keep_at] for own in records]
        out["fork"] = _train_span(batch, step_fn, kept, data, val, forked, start=keep_at,
                                  steps=steps, mode_of=fork.mode, progress=progress)
        del out["fork"]["kept"]
        # The forked span's first step is its switch: it compiles the mode's program.
        out["fork"]["mode_switch_s"] = out["fork"]["first_step_s"]
        out["fork"]["first_step_s"] = None
    return out


def run_seed_batch(spec: StudySpec, units: Sequence[Unit], results: Path,
                   corpus: data_lib.Corpus, *, command: str = "", progress: bool = False,
                   programs: BatchPrograms | None = None,
                   forks: Sequence[Unit] = ()) -> list[dict[str, Any]]:
    """Trains ``units`` (one variant, corpus and length; distinct seeds; none finished)
    as one seed batch and writes each one's result JSON; returns the results. Given
    ``programs``, the batch runs on an earlier batch's compiled programs where they
    serve and leaves its own there for a later one. ``forks``, units of the
    variant's BF16-forward-tail variant (`tail_variant`) with some of the batch's seeds,
    are trained as a fork of the batch (`train_seeds`) and written too, each with
    ``forked_from`` (the unit and step it shares the run with).

    Raises:
      ValueError: if the units differ in more than their seed, one has a result, or a
        fork unit is not the tail variant's on one of the batch's seeds.
      TooLong: if the units would read ``spec.max_epochs`` or more of their corpus.
    """
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    first = units[0]

    def run_of(u: Unit) -> tuple:  # all but the seed
        return u.corpus, u.tokens_per_param, u.variant

    if any(run_of(u) != run_of(first) for u in units):
        raise ValueError(f"a seed batch's units differ only in their seed, got "
                         f"{[u.name for u in units]}")
    done = [u.name for u in (*units, *forks) if result_path(results, u).exists()]
    if done:
        raise ValueError(f"already finished: {done}")
    tail = tail_variant(spec, first.variant, first.corpus) if forks else None
    seeds = [u.seed for u in units]
    if forks and (tail is None or any(
            run_of(u) != (first.corpus, first.tokens_per_param, tail) or u.seed not in seeds
            for u in forks)):
        raise ValueError(f"fork units are the tail variant of {first.variant} ({tail}) on "
                         f"the batch's seeds {seeds}, got {[u.name for u in forks]}")
    t_setup = time.perf_counter()
    steps = spec.steps(first.tokens_per_param)
    cfgs = [spec.run_config(u) for u in units]
    data = [data_lib.Batches(corpus.train, batch=c.batch, seq=c.seq, seed=u.seed)
            for c, u in zip(cfgs, units)]
    epochs = checked_epochs(spec, first, data[0], corpus)
    val = data_lib.validation_batches(corpus.val, batch=cfgs[0].batch, seq=cfgs[0].seq,
                                      max_batches=cfgs[0].eval_batches)
    batch = (programs or BatchPrograms()).seed_batch(spec, units, cfgs, steps)
    fork = None
    if forks:
        fork = train_lib.PrecisionSchedule.bf16_forward_tail(
            total_steps=steps, fraction=spec.run_config(forks[0]).bf16_forward_tail)
    t_train = time.perf_counter()
    out = train_seeds(batch, data, val, steps=steps, progress=progress, fork=fork)
    t_write = time.perf_counter()
    env = environment(command)
    written = _write_units(spec, batch, units, out, steps, epochs, corpus, results, env,
                           val, start=0)
    if forks:
        index = {u.seed: i for i, u in enumerate(units)}
        written += _write_units(
            spec, batch, forks, out["fork"], steps, epochs, corpus, results, env, val,
            start=fork.switch_step, positions=[index[u.seed] for u in forks],
            forked_from={u.seed: u for u in units})
    if progress:
        # Where a process's time beyond the batch's training wall goes: the call scripts
        # budget it (benchmarks/gpu_studies_call.sh).
        trained = out["train_wall_s"] + (out["fork"]["train_wall_s"] if forks else 0.0)
        print(f"  batch outside its training wall: {t_train - t_setup:.0f}s setup (model, "
              f"data), {t_write - t_train - trained:.0f}s initialization and final "
              f"evaluation, {time.perf_counter() - t_write:.0f}s results (BF16-forward "
              "evaluation, files)", flush=True)
    return written


def _write_units(spec: StudySpec, batch: SeedBatch, units: Sequence[Unit], out: dict,
                 steps: int, epochs: float, corpus: data_lib.Corpus, results: Path,
                 env: dict, val: list, *, start: int, positions: Sequence[int] | None = None,
                 forked_from: dict[int, Unit] | None = None) -> list[dict[str, Any]]:
    """Writes the result JSON of ``units``, at ``positions`` of the batch's stacked seeds
    (default: in order), from `train_seeds`' ``out`` (or its ``fork``, run from step
    ``start``)."""
    extra_bf16 = None
    trainer = batch.trainer
    if spec.eval_bf16_forward and trainer.report is not None and out["final_mode"] != "bf16":
        extra_bf16 = batch.evaluate(out["final_state"].params, jax.device_put(val), "bf16")
    written = []
    for unit, s in zip(units, positions or range(len(units))):
        summary = {
            "steps": steps, "epochs": epochs, "final_val_bpb": out["final_val_bpb"][s],
            "final_mode": out["final_mode"], "params": spec.model_config().param_counts(),
            "quantized_layers": len(trainer.report.quantized) if trainer.report else 0,
            "matmul_layers": len(trainer.report.decisions) if trainer.report else None,
        }
        # Times per unit: the batch's divided by its seeds (its first step, which
        # compiles, as it is); the batch's own are under "seed_batch".
        share = 1.0 / len(batch.seeds)
        segment = {"from": start, "to": steps,
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
            "reused_programs": batch.reused_programs,
            "compile_cache_hits": out["compile_cache_hits"]}}
        if forked_from is not None:
            source = forked_from[unit.seed]
            extra["forked_from"] = {"unit": source.name, "variant": source.variant,
                                    "step": start}
            extra["seed_batch"]["forked_from_step"] = start
        if extra_bf16 is not None:
            extra["final_val_bpb_bf16_forward"] = float(extra_bf16[s])
        result = build_result(spec, unit, summary, out["records"][s], [segment], corpus, extra)
        write_json(result_path(results, unit), result)
        written.append(result)
    return written


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
    and is estimated without a compilation. A batch forks the `fork_units` its
    ``only`` allows (their estimate: `fork_wall_estimate`), and a planned batch of those
    units runs only the seeds the forks left; where the forking batch does not fit, its
    forks wait for it too, not trained from the start later in the call (a whole run
    each, where the fork is a sixth of one). Calls
    ``after_batch`` after each finished batch (to hand its results off at once: a call cut
    off later keeps them). Returns the finished units' results."""
    t_begin = time.perf_counter() if t_begin is None else t_begin
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    corpora: dict[str, data_lib.Corpus] = {}
    programs = BatchPrograms()
    done: list[dict] = []
    deferred_forks: set[Unit] = set()
    for planned in batch_plan(spec, results, size, only):
        units = [u for u in planned
                 if not result_path(results, u).exists() and u not in deferred_forks]
        if len(units) < 2:  # forked from an earlier batch of this call, or waiting for one
            continue
        forks = fork_units(spec, results, units, only)
        left = budget_s - (time.perf_counter() - t_begin)
        need = batch_wall_estimate(spec, results, units,
                                   compiled=programs.compiled(spec, units))
        if need is not None and forks:
            need += fork_wall_estimate(spec, results, units, need)
        names = ", ".join(u.name for u in units)
        if forks:
            names += f" (forking {', '.join(u.name for u in forks)})"
        if need is None:
            too_long = (left < unestimated_min_s if unestimated_min_s is not None
                        else bool(done))
            why = "has no timed batch of its length and kind to go by"
        else:
            too_long, why = left < need, f"needs ~{need:.0f}s"
        if too_long:
            print(f"[{spec.name}] {left:.0f}s left, the batch {names} {why}: "
                  "left to a later call", flush=True)
            deferred_forks.update(forks)
            continue  # a later, shorter batch may still fit
        corpus = units[0].corpus
        if corpus not in corpora:
            t_corpus = time.perf_counter()
            corpora[corpus] = data_lib.load_corpus(**CORPORA[corpus],
                                                   cache_dir=corpus_cache_dir(results))
            if progress:
                print(f"[{spec.name}] corpus {corpus} loaded in "
                      f"{time.perf_counter() - t_corpus:.0f}s"
                      f"{' from the cache' if corpora[corpus].from_cache else ''}", flush=True)
        print(f"[{spec.name}] seed batch {names}", flush=True)
        try:
            out = run_seed_batch(spec, units, results, corpora[corpus], command=command,
                                 progress=progress, programs=programs, forks=forks)
        except TooLong as e:
            print(f"SKIPPED {names}: {e}", flush=True)
            continue
        for part in (out[:len(units)], out[len(units):]):  # the batch's runs, the forks'
            if part:
                sb = part[0]["seed_batch"]
                print(f"[{spec.name}] finished{' (forks)' if part[0].get('forked_from') else ''}"
                      ": val bpb " + " ".join(f"{r['final_val_bpb']:.4f}" for r in part)
                      + f"; {sb['step_time_s'] * 1e3:.1f} ms per batched step, "
                      f"{sb['train_wall_s']:.0f}s", flush=True)
        done += out
        if after_batch is not None:
            t_handoff = time.perf_counter()
            after_batch()
            if progress:
                print(f"  handed off in {time.perf_counter() - t_handoff:.0f}s", flush=True)
    return done
