"""Train the small Llama (``llama.py``) on Python sources (``data.py``) in BF16 or NVFP4.

    python examples/train_llama.py --recipe nvfp4 --steps 300 --out /tmp/run
    python examples/train_llama.py --mesh data=2,fsdp=2,model=2   # 8 devices
    python examples/train_llama.py --mesh fsdp=2 --no-fp4-gather  # BF16 weight gathers
    python examples/train_llama.py --model hybrid --attn-every 4 --state 64 --keep-last 2

``--model hybrid`` trains the hybrid Mamba-Transformer of ``hybrid.py`` instead
(``--layers`` sequence mixers, one attention mixer per ``--attn-every``, each mixer
followed by an MLP block unless ``--no-mlp``); everything else — data, policy,
training loop, metrics — is shared. ``--keep-first/--keep-last`` count its blocks in
order, whatever their type (`hybrid.HybridConfig.pattern`).

The model is plain nnx; NVFP4 comes from `fp4jax.flax.nnx.quantize` with
`fp4jax.flax.paper_policy` (embedding, output head, norms and attention products
stay BF16; ``--keep-first/--keep-last`` blocks too). Training uses
`fp4jax.train.TrainStep` (FP32 masters, AdamW, clipping, per-layer per-step SR
keys), `fp4jax.metrics_log` (``metrics.jsonl``/``.csv``, a progress bar),
optionally `fp4jax.checkpoint` and per-layer quantization diagnostics. The run
writes ``summary.json`` and prints tokens seen, epochs, the final validation loss in
bits per byte and the step time.

The loop runs at the device's speed: a background thread prepares the batches and
puts them on the device ahead (`data.DevicePrefetcher`), the step number is the
loop's counter, and metrics stay on the device until the next log point fetches
them (`fp4jax.metrics_log.PendingMetrics`). Only evaluation, diagnostics and
checkpoints wait for the device, at their own intervals.

``--mesh data=D,fsdp=F,model=M`` (product = the device count) trains on a device
mesh with `fp4jax.parallel.DEFAULT_RULES` applied to the model's logical axes: data
parallel over ``data``, FSDP over ``fsdp``, tensor parallel (Megatron splits of the
attention and MLP projections) over ``model``; the batch is split over data × fsdp.
Under FSDP the NVFP4 layers' weights are quantized per shard and all-gathered as NVFP4
codes and scales (`fp4jax.parallel.MeshRules.fp4_gather`; the run lists them and
``summary.json`` has ``fp4_gathered``); ``--no-fp4-gather`` lets XLA gather them in
their compute dtype instead, for comparison (same results).
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import data as data_lib  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from hybrid import Hybrid, HybridConfig  # noqa: E402
from llama import Llama, LlamaConfig, loss_and_metrics  # noqa: E402

import fp4jax  # noqa: E402
from fp4jax import diagnostics, metrics_log  # noqa: E402
from fp4jax import train as train_lib  # noqa: E402
from fp4jax.parallel import MeshRules  # noqa: E402

STEPS_AHEAD = 3
"""Steps the loop may dispatch before the device finished them: enough to hide the
host's work between steps, few enough that a deadline is kept within a few steps."""

PREFETCH = 2
"""Batches the input pipeline keeps ready on the device (double buffering)."""


@dataclasses.dataclass
class ModeSwitches:
    """Times the first step in each precision mode after a loop's first apart from the
    training steps: that step compiles the mode's program (the BF16-forward tail's), which
    would otherwise count as step time (pure_llama's paper recipe with the tail: 70.1 ms
    per batched step of three, the switch's compilation spread over the steps, against
    56.5 ms without the tail).

    Example:
      >>> clock = ModeSwitches()
      >>> for mode in ("recipe", "recipe", "bf16_forward", "bf16_forward"):
      ...     t0 = clock.begin(mode, jnp.zeros(()))
      ...     clock.end(t0, jnp.zeros(()))
      >>> clock.steps, clock.seconds > 0
      (1, True)
    """

    seen: set[str] = dataclasses.field(default_factory=set)
    seconds: float = 0.0  # in the switch steps, their compilation included
    steps: int = 0

    def begin(self, mode: str, state: Any) -> float | None:
        """Before a step in ``mode``: where it is the first step in a later mode, waits
        for ``state`` (the previous steps) and returns the clock's start, else None."""
        later = bool(self.seen) and mode not in self.seen
        self.seen.add(mode)
        if not later:
            return None
        jax.block_until_ready(state)
        return time.perf_counter()

    def end(self, t0: float | None, state: Any) -> None:
        """After the step `begin` returned ``t0`` for: waits for ``state`` (the step's)
        and counts the step where it was a switch."""
        if t0 is None:
            return
        jax.block_until_ready(state)
        self.seconds += time.perf_counter() - t0
        self.steps += 1

    def step_time(self, wall: float, steps: int) -> float | None:
        """Seconds per step of ``steps`` timed steps that took ``wall`` seconds (the
        switches among them), without the switches."""
        plain = steps - self.steps
        return (wall - self.seconds) / plain if plain > 0 else None


MESH_AXES = ("data", "fsdp", "model")
"""The axes ``--mesh`` knows (`fp4jax.parallel.DEFAULT_RULES`' mesh axes)."""


def parse_mesh(spec: str) -> dict[str, int]:
    """``"data=2,model=4"`` → ``{"data": 2, "model": 4}`` (axes of `MESH_AXES`, sizes ≥ 1).

    Example:
      >>> parse_mesh("data=2,fsdp=1,model=4")
      {'data': 2, 'fsdp': 1, 'model': 4}
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mesh must look like 'data=2,model=4', got {spec!r}")
    sizes: dict[str, int] = {}
    for part in spec.split(","):
        name, eq, size = part.strip().partition("=")
        name = name.strip()
        if not eq or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"mesh entry {part.strip()!r} of {spec!r} must be AXIS=SIZE with a "
                             "positive integer size, e.g. 'data=2,model=4'")
        if name not in MESH_AXES:
            raise ValueError(f"unknown mesh axis {name!r} in {spec!r}; the axes are "
                             f"{', '.join(MESH_AXES)}")
        if name in sizes:
            raise ValueError(f"mesh axis {name!r} is given twice in {spec!r}")
        sizes[name] = int(size)
    return sizes


def make_mesh_rules(spec: str, devices: list | None = None, *,
                    fp4_gather: bool = True) -> MeshRules:
    """The mesh of a ``--mesh`` spec over ``devices`` (default: all), with `DEFAULT_RULES`
    and ``fp4_gather`` (`fp4jax.parallel.MeshRules`: FSDP gathers NVFP4 weights in NVFP4).

    Raises:
      ValueError: a malformed spec, an unknown axis, or sizes whose product is not the
        number of devices.
    """
    sizes = parse_mesh(spec)
    devices = jax.devices() if devices is None else devices
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(
            f"mesh {spec!r} has {math.prod(sizes.values())} devices "
            f"({' x '.join(map(str, sizes.values()))}) but {len(devices)} are available: the "
            "sizes' product must equal the device count"
        )
    mesh = jax.make_mesh(tuple(sizes.values()), tuple(sizes), devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(sizes))
    return MeshRules(mesh=mesh, fp4_gather=fp4_gather)


ModelConfig = LlamaConfig | HybridConfig
"""The model sizes `Trainer` takes: the model is chosen by the config's type."""

MODELS = {"llama": Llama, "hybrid": Hybrid}
"""``--model`` choices."""


def build_model(model_cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    """The `llama.Llama` or `hybrid.Hybrid` of a config (both take `loss_and_metrics`)."""
    if isinstance(model_cfg, HybridConfig):
        return Hybrid(model_cfg, rngs=rngs)
    if isinstance(model_cfg, LlamaConfig):
        return Llama(model_cfg, rngs=rngs)
    raise TypeError(f"model_cfg must be a LlamaConfig or HybridConfig, got "
                    f"{type(model_cfg).__name__}")


def num_blocks(model_cfg: ModelConfig) -> int:
    """Residual blocks in order, whatever their type (what ``keep_first/keep_last`` count)."""
    return model_cfg.num_blocks if isinstance(model_cfg, HybridConfig) else model_cfg.layers


def model_name(model_cfg: ModelConfig) -> str:
    """The ``--model`` name of a config."""
    return "hybrid" if isinstance(model_cfg, HybridConfig) else "llama"


def describe_model(model_cfg: ModelConfig) -> str:
    """The model's sizes on one line.

    Example:
      >>> describe_model(LlamaConfig(dim=64, layers=2, heads=2))
      'Llama dim=64 layers=2 heads=2 hidden=192'
      >>> describe_model(HybridConfig(dim=64, layers=2, attn_every=2))  # doctest: +ELLIPSIS
      'Hybrid M-*- (1 Mamba-2, 1 attention, 2 MLP blocks) dim=64 heads=4 hidden=192 state=64 ...'
    """
    c = model_cfg
    if isinstance(c, HybridConfig):
        p = c.pattern
        return (f"Hybrid {p} ({p.count('M')} Mamba-2, {p.count('*')} attention, "
                f"{p.count('-')} MLP blocks) dim={c.dim} heads={c.heads} hidden={c.hidden} "
                f"state={c.state} ssm_heads={c.ssm_heads}x{c.ssm_head_dim} chunk={c.chunk}")
    return f"Llama dim={c.dim} layers={c.layers} heads={c.heads} hidden={c.hidden}"


RECIPES = {
    "bf16": None,  # the plain, unconverted model
    "nvfp4": fp4jax.Recipe.nvfp4,
    "nvfp4_no_rht": fp4jax.Recipe.nvfp4_no_rht,
    "nvfp4_no_sr": fp4jax.Recipe.nvfp4_no_sr,
    "nvfp4_no_2d": fp4jax.Recipe.nvfp4_no_2d,
    "nvfp4_four_over_six": fp4jax.Recipe.nvfp4_four_over_six,  # RECIPE.md §2.8
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    r"""Training settings (the model size is a `LlamaConfig` or `HybridConfig`).

    Attributes:
      recipe: a key of `RECIPES`.
      batch: sequences per step.
      seq: tokens per sequence.
      lr: peak learning rate (AdamW).
      warmup_fraction: linear warmup share of the steps; then cosine to
        ``min_lr_ratio · lr``.
      min_lr_ratio: final learning rate ratio.
      weight_decay: AdamW decoupled weight decay.
      max_grad_norm: gradient clipping.
      seed: model init, data order and SR run key.
      keep_first: leading blocks kept in BF16 (`num_blocks` counts them).
      keep_last: trailing blocks kept in BF16.
      keep_patterns: more module-path regexes kept in BF16 (e.g. ``r".*\.attn\..*"``).
      bf16_forward_tail: share of the final steps with BF16 forward GEMMs (RECIPE §8).
      eval_every: validate every this many steps (0: only at the end).
      eval_batches: validation batches per evaluation.
      log_every: steps between metric records.
      diag_every: steps between quantization diagnostics (0: never).
      impl: GEMM/quantization implementation of the NVFP4 layers (`fp4jax.implementation`:
        ``"auto"`` takes the Hopper kernels where they are faster, XLA elsewhere).
      eval_bf16_forward: also evaluate a quantized run's final weights with every
        GEMM in BF16 (one more compilation).
      mesh: a device mesh (`parse_mesh`), e.g. ``"data=2,model=4"``; empty: one device.
      fp4_gather: under FSDP, all-gather the NVFP4 layers' weights as NVFP4 codes and
        scales (False: XLA gathers them in the compute dtype).
    """

    recipe: str = "nvfp4"
    batch: int = 16
    seq: int = 256
    lr: float = 2e-3
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 0
    keep_first: int = 0
    keep_last: int = 0
    keep_patterns: tuple[str, ...] = ()
    bf16_forward_tail: float = 0.0
    eval_every: int = 0
    eval_batches: int = 16
    log_every: int = 10
    diag_every: int = 0
    eval_bf16_forward: bool = True
    impl: str = "auto"
    mesh: str = ""
    fp4_gather: bool = True

    def __post_init__(self):
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {sorted(RECIPES)}, got {self.recipe!r}")
        if self.recipe == "bf16" and self.bf16_forward_tail:
            raise ValueError("bf16_forward_tail only applies to NVFP4 recipes")
        if self.mesh:
            sizes = parse_mesh(self.mesh)
            shards = sizes.get("data", 1) * sizes.get("fsdp", 1)
            if self.batch % shards:
                raise ValueError(f"batch={self.batch} must split evenly over the mesh's data "
                                 f"and fsdp axes ({shards} parts, mesh {self.mesh!r})")


class ScheduleState(NamedTuple):
    """State of `warmup_cosine`."""

    count: jax.Array  # int32 [], steps taken
    total: jax.Array  # int32 [], planned steps (data, not a compile-time constant)


def warmup_cosine(*, peak: float, total_steps: int, warmup_fraction: float,
                  min_ratio: float) -> optax.GradientTransformation:
    """Scales updates by ``-lr(step)``: linear warmup, cosine decay to ``min_ratio·peak``.

    The planned step count lives in the state, so runs of different lengths share
    one compiled step.
    """

    def init(params):
        del params
        return ScheduleState(jnp.zeros((), jnp.int32), jnp.asarray(total_steps, jnp.int32))

    def update(updates, state, params=None):
        del params
        c, t = state.count.astype(jnp.float32), state.total.astype(jnp.float32)
        warm = jnp.maximum(1.0, jnp.round(warmup_fraction * t))
        frac = jnp.clip((c - warm) / jnp.maximum(t - warm, 1.0), 0.0, 1.0)
        decay = min_ratio + (1 - min_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * frac))
        lr = peak * jnp.where(c < warm, (c + 1) / warm, decay)
        updates = jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates)
        return updates, ScheduleState(state.count + 1, state.total)

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg: RunConfig, total_steps: int) -> optax.GradientTransformation:
    """AdamW (β=(0.9, 0.95), ε=1e-8) with `warmup_cosine`; no decay on norms."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.scale_by_adam(b1=0.9, b2=0.95, eps=1e-8),
        optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask),
        warmup_cosine(peak=cfg.lr, total_steps=total_steps,
                      warmup_fraction=cfg.warmup_fraction, min_ratio=cfg.min_lr_ratio),
    )


def _same_values(a: Any, b: Any) -> bool:
    """Whether two pytrees have the same structure and equal leaves (typed PRNG keys
    compared by their key data)."""
    def data(x):
        x = jnp.asarray(x)
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(data(x), data(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


RUN_ONLY_FIELDS = frozenset({"seed", "eval_every", "eval_batches", "log_every", "diag_every",
                             "eval_bf16_forward"})
"""`RunConfig` fields no compiled program reads: runs differing only in these share a
`Trainer`'s compiled steps (`Trainer.for_run`)."""


class Trainer:
    """Model, policy and compiled functions of one recipe (reusable across runs).

    Args:
      model_cfg: the model size (`LlamaConfig` or `HybridConfig`: it picks the model).
      cfg: the run settings.
      total_steps: planned steps (for the precision schedule; the learning-rate
        schedule reads its length from the optimizer state).
    """

    def __init__(self, model_cfg: ModelConfig, cfg: RunConfig, total_steps: int):
        self.model_cfg, self.cfg = model_cfg, cfg
        self.mesh_rules = (make_mesh_rules(cfg.mesh, fp4_gather=cfg.fp4_gather) if cfg.mesh
                           else None)
        self.batch_sharding = self.mesh_rules.batch_sharding() if self.mesh_rules else None
        self.model, self.report = self._build_model(cfg.seed)
        loss_fn, self.params0 = train_lib.nnx_loss_fn(self.model, loss_and_metrics)
        schedule = train_lib.PrecisionSchedule.bf16_forward_tail(
            total_steps=total_steps, fraction=cfg.bf16_forward_tail
        )
        self.step = train_lib.TrainStep(
            loss_fn, make_optimizer(cfg, total_steps), has_aux=True,
            max_grad_norm=cfg.max_grad_norm, schedule=schedule, donate=True,
            mesh_rules=self.mesh_rules,
        )
        self.eval_step = train_lib.make_eval_step(loss_fn, has_aux=True,
                                                  mesh_rules=self.mesh_rules)
        self.diag_step = train_lib.make_diagnostics_step(loss_fn, has_aux=True,
                                                         mesh_rules=self.mesh_rules)

    def _build_model(self, seed: int):
        """The model initialized from ``seed``, quantized by the run's policy, and the
        policy's report (None for BF16)."""
        cfg = self.cfg
        model = build_model(self.model_cfg, nnx.Rngs(seed))
        recipe_fn = RECIPES[cfg.recipe]
        if recipe_fn is None:
            return model, None
        policy = fp4jax.flax.paper_policy(
            num_blocks=num_blocks(self.model_cfg), first=cfg.keep_first, last=cfg.keep_last,
            recipe=recipe_fn(),
            extra_rules=[fp4jax.flax.Rule(pattern=p, recipe=None) for p in cfg.keep_patterns],
        )
        return model, fp4jax.flax.nnx.quantize(model, policy, impl=cfg.impl)

    def for_run(self, cfg: RunConfig) -> Trainer:
        """A trainer for another run of the same programs, sharing this one's compiled steps.

        ``cfg`` may differ from this trainer's only in fields no compiled program reads
        (`RUN_ONLY_FIELDS`: the seed and the logging, evaluation and diagnostics
        cadences); the model is initialized from ``cfg.seed``. The two trainers share
        the compiled step objects (and `set_total_steps` retargets both): train with one
        at a time. Each new trainer would
        trace and compile anew: Pallas Mosaic GPU kernels carry a name numbered per
        trace in their serialized module (JAX 0.11.2), so a second trace in one process
        misses even the persistent compilation cache (a fresh process tracing in the
        same order hits it), about a minute per NVFP4 step on the H200.

        Raises:
          ValueError: if ``cfg`` changes a compiled field, or the seed changes the model's
            non-parameter state (which the compiled loss holds as constants).
        """
        changed = [f.name for f in dataclasses.fields(RunConfig)
                   if f.name not in RUN_ONLY_FIELDS and getattr(cfg, f.name) != getattr(
                       self.cfg, f.name)]
        if changed:
            raise ValueError(f"for_run: {', '.join(changed)} differ from this trainer's run "
                             "configuration; those are compiled into its steps: build a new "
                             "Trainer")
        new = copy.copy(self)
        new.cfg = cfg
        if cfg.seed != self.cfg.seed:
            model, _ = self._build_model(cfg.seed)
            _, params0 = train_lib.nnx_loss_fn(model, loss_and_metrics)
            old_rest, new_rest = (nnx.split(m, nnx.Param, ...)[2] for m in (self.model, model))
            if not (jax.tree.structure(params0) == jax.tree.structure(self.params0)
                    and _same_values(old_rest, new_rest)):
                raise ValueError("for_run: the model built from seed "
                                 f"{cfg.seed} differs from this trainer's beyond its "
                                 "parameters: build a new Trainer")
            new.model, new.params0 = model, params0
        return new

    def init(self, total_steps: int) -> train_lib.TrainState:
        """A fresh state (same init for every recipe: quantization does not touch params)."""
        return train_lib.init_state(
            self.params0, make_optimizer(self.cfg, total_steps), jax.random.key(self.cfg.seed),
            mesh_rules=self.mesh_rules,
        )

    def set_total_steps(self, total_steps: int) -> None:
        """Re-targets the precision schedule (no recompilation)."""
        self.step.schedule = train_lib.PrecisionSchedule.bf16_forward_tail(
            total_steps=total_steps, fraction=self.cfg.bf16_forward_tail
        )

    def calibrate(self, batches: data_lib.Batches, val: list, steps: int) -> dict[str, float]:
        """Compiles the step and eval functions and times ``steps`` steps (state discarded).

        Every precision mode the run will use is compiled here (the schedule's tail mode
        too), so the timed run pays no compilation.

        Returns:
          ``compile_s`` (first step), ``step_s`` (mean of the next ``steps``),
          ``eval_compile_s`` and ``eval_s`` (one validation pass per evaluated mode).
        """
        steps = max(int(steps), 1)
        state = self.init(steps + 1)
        t0 = time.perf_counter()
        with data_lib.DevicePrefetcher(batches, 0, steps + 1, depth=PREFETCH,
                                       sharding=self.batch_sharding) as feed:
            for i, batch in feed:  # the training loop's input pipeline, without logging
                if i == 1:
                    jax.block_until_ready(state.params)
                    t1 = time.perf_counter()
                state, _ = self.step(state, batch, step=i)
        jax.block_until_ready(state.params)
        t2 = time.perf_counter()
        final_mode = "recipe"
        if self.cfg.bf16_forward_tail > 0:
            final_mode = "bf16_forward"
            state, _ = self.step.jitted(state, jax.device_put(batches(0), self.batch_sharding),
                                        mode=final_mode)
        val = jax.device_put(val, self.batch_sharding)  # as `train` holds it
        modes = [final_mode] + (
            ["bf16"] if self.report is not None and self.cfg.eval_bf16_forward else [])
        for mode in modes:  # compile
            jax.block_until_ready(self.eval_step(state.params, val[0], mode=mode))
        t3 = time.perf_counter()
        for mode in modes:
            self.evaluate(state.params, val, mode)
        t4 = time.perf_counter()
        return {"compile_s": t1 - t0, "step_s": (t2 - t1) / steps,
                "eval_compile_s": t3 - t2, "eval_s": t4 - t3}

    def evaluate(self, params: Any, val: list, mode: str = "recipe") -> float:
        """Mean validation loss in bits per byte (waits for the device)."""
        losses = [self.eval_step(params, tuple(map(jnp.asarray, b)), mode=mode)["loss"]
                  for b in val]
        return float(np.mean(jax.device_get(losses))) / math.log(2.0)


def train(
    trainer: Trainer,
    batches: data_lib.Batches,
    val: list,
    *,
    steps: int,
    stop_at: int | None = None,
    deadline: float | None = None,
    out: str | None = None,
    ckpt_dir: str | None = None,
    ckpt_every: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains for ``steps`` planned steps (the schedules' length).

    Args:
      trainer: the recipe's `Trainer`.
      batches: training data (batch ``i`` at step ``i``).
      val: validation batches.
      steps: planned steps.
      stop_at: stop after this many steps (same schedules, so a shorter run
        matches the first ``stop_at`` steps of the full one).
      deadline: stop when `time.perf_counter` passes it (checked as each step is
        dispatched, at most `STEPS_AHEAD` steps before the device runs it).
      out: directory for ``metrics.jsonl``/``.csv``, ``summary.json``, ``policy.txt``.
      ckpt_dir: save checkpoints here every ``ckpt_every`` steps and at the end;
        resume from the latest one if present.
      ckpt_every: steps between checkpoints.
      progress: show a progress bar (its metrics are those of the previous log point).

    Returns:
      The summary dict (also written to ``<out>/summary.json``); ``final_state``
      holds the last `TrainState`. ``step_time_s`` is the training steps' time after
      the first step (which compiles), without the evaluations, diagnostics and
      checkpoints in between (``paused_s``) and without the first step in a later
      precision mode (``mode_switch_s``: `ModeSwitches`); ``train_wall_s`` is everything.
    """
    cfg = trainer.cfg
    stop_at = steps if stop_at is None else min(stop_at, steps)
    trainer.set_total_steps(steps)
    state = trainer.init(steps)
    ckpt = None
    if ckpt_dir:
        from fp4jax.checkpoint import Checkpointer  # noqa: PLC0415

        ckpt = Checkpointer(ckpt_dir, max_to_keep=2)
        if ckpt.latest_step() is not None:
            state = ckpt.restore(state)
            print(f"resumed from step {int(state.step)} in {ckpt_dir}")
    first = int(state.step)  # from here on, the loop counter is the step number
    logger = metrics_log.MetricsLogger(out, append=first > 0) if out else None
    bar = metrics_log.progress(total=stop_at, initial=first, desc=cfg.recipe,
                               disable=None if progress else True)
    val = jax.device_put(val, trainer.batch_sharding)  # every evaluation reuses these copies
    curve: list[tuple[int, float]] = []
    pending = metrics_log.PendingMetrics()
    last: dict[str, Any] = {}

    def write_pending() -> None:
        """Fetches and writes the records held (one transfer); shows the newest."""
        nonlocal last
        for step, rec in pending.fetch():
            last = logger.log(step, rec) if logger else rec
        if last:
            bar.set_postfix(bpb=f"{last['bits_per_byte']:.3f}", gnorm=f"{last['grad_norm']:.2f}")

    in_flight: collections.deque = collections.deque()
    t_start = time.perf_counter()
    t_warm = None  # after the first step (compilation, unless already compiled)
    paused = 0.0  # in evaluations, diagnostics and checkpoints
    switches = ModeSwitches()
    done = first
    if progress and first < stop_at and trainer.step.num_compiled() == 0:
        print(f"[{cfg.recipe}] compiling the training step…", flush=True)
    feed = data_lib.DevicePrefetcher(batches, first, stop_at, depth=PREFETCH,
                                     sharding=trainer.batch_sharding)
    try:
        for i, batch in feed:
            if deadline is not None and i > first and time.perf_counter() > deadline:
                break
            mode = trainer.step.mode(i)
            t_switch = switches.begin(mode, state.params)
            state, metrics = trainer.step(state, batch, step=i)
            switches.end(t_switch, state.params)
            done = i + 1
            if i == first:
                jax.block_until_ready(state.params)
                t_warm = time.perf_counter()
            # Flow control: wait for the step STEPS_AHEAD back, never the one just
            # dispatched, so the device always has the next steps queued.
            in_flight.append(metrics["loss"])
            if len(in_flight) > STEPS_AHEAD:
                jax.block_until_ready(in_flight.popleft())
            if cfg.log_every and (done % cfg.log_every == 0 or done == stop_at):
                write_pending()  # the previous log point's record: finished by now
                pending.add(done, {**metrics, "mode": mode, "tokens": done * cfg.batch * cfg.seq})
            evaluate = cfg.eval_every and done % cfg.eval_every == 0 and done < stop_at
            diagnose = (cfg.diag_every and done % cfg.diag_every == 0
                        and trainer.report is not None)
            save = ckpt is not None and ckpt_every and done % ckpt_every == 0
            if evaluate or diagnose or save:
                # These wait for the device anyway; timed apart from the training steps,
                # which finish first.
                write_pending()  # records stay in step order
                jax.block_until_ready(state.params)
                t_pause = time.perf_counter()
                if evaluate:
                    v = trainer.evaluate(state.params, val, mode)
                    curve.append((done, v))
                    if logger:
                        logger.log(done, {"val_bits_per_byte": v})
                if diagnose:
                    _, stats = jax.block_until_ready(trainer.diag_step(state.params, batch,
                                                                       mode=mode))
                    if logger:
                        logger.log(done, diagnostics.flatten(stats, prefix="diag/"), csv=False)
                if save:
                    ckpt.save(state, metadata={"recipe": cfg.recipe})
                paused += time.perf_counter() - t_pause
            bar.update(1)
    finally:
        feed.close()
    jax.block_until_ready(state.params)
    t_end = time.perf_counter()
    write_pending()
    bar.close()
    if ckpt is not None:
        if ckpt.latest_step() != done:
            ckpt.save(state, metadata={"recipe": cfg.recipe})
        ckpt.close()
    final_mode = trainer.step.mode(max(done - 1, 0))
    val_bpb = trainer.evaluate(state.params, val, final_mode)
    curve.append((done, val_bpb))
    ran = done - first
    summary: dict[str, Any] = {
        "recipe": cfg.recipe,
        "steps": done,
        "planned_steps": steps,
        "stopped_early": done < stop_at,
        "tokens_seen": done * cfg.batch * cfg.seq,
        "train_tokens": int(len(batches.tokens)),
        "epochs": batches.epochs(done),
        "final_train_bpb": last.get("bits_per_byte"),
        "final_val_bpb": val_bpb,
        "val_curve": curve,
        "final_mode": final_mode,
        "step_time_s": switches.step_time(t_end - t_warm - paused, ran - 1) if t_warm
        else None,
        "paused_s": paused,
        "mode_switch_s": switches.seconds,
        "first_step_s": (t_warm - t_start) if t_warm else None,
        "train_wall_s": t_end - t_start,
        "compilations": trainer.step.num_compiled(),
        "run_config": dataclasses.asdict(cfg),
        "model": model_name(trainer.model_cfg),
        "model_config": dataclasses.asdict(trainer.model_cfg),
        "params": trainer.model_cfg.param_counts(),
        "train_flops_per_token": trainer.model_cfg.train_flops_per_token(cfg.seq),
        "quantized_layers": len(trainer.report.quantized) if trainer.report else 0,
        "fp4_gathered": sorted(trainer.step.fp4_gathered),
        "matmul_layers": len(trainer.report.decisions) if trainer.report else None,
    }
    if cfg.eval_bf16_forward and trainer.report is not None and final_mode != "bf16":
        # The same weights with every GEMM in BF16: how much of the gap is the 4-bit forward?
        summary["final_val_bpb_bf16_forward"] = trainer.evaluate(state.params, val, "bf16")
    if logger:
        logger.log(done, {"val_bits_per_byte": val_bpb})
        logger.close()
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        with open(os.path.join(out, "policy.txt"), "w") as f:
            f.write(str(trainer.report) + "\n" if trainer.report else "bf16: model not converted\n")
    summary["final_state"] = state
    return summary


def describe(summary: dict[str, Any]) -> str:
    """Human-readable result lines."""
    nan = float("nan")
    return (
        f"[{summary.get('name', summary['recipe'])}] {summary['steps']} steps, "
        f"{summary['tokens_seen'] / 1e6:.2f}M "
        f"tokens = {summary['epochs']:.4f} epochs; final val {summary['final_val_bpb']:.4f} "
        f"bits/byte; {(summary['step_time_s'] or nan) * 1e3:.1f} ms/step "
        f"(first step {summary['first_step_s'] or nan:.1f}s)"
    )


def describe_mesh(mesh_rules: MeshRules, params: Any) -> str:
    """The mesh and how the parameters are laid out on it (one line per distinct layout)."""
    counts: dict[str, int] = collections.Counter()
    for names in mesh_rules.logical_axes(params).values():
        spec = mesh_rules.spec(names) if names else jax.sharding.PartitionSpec()
        counts[f"{names} -> {spec}"] += 1
    mesh = " x ".join(f"{n}={s}" for n, s in mesh_rules.mesh.shape.items())
    lines = [f"mesh {mesh} ({mesh_rules.mesh.size} devices); batch split over "
             f"{mesh_rules.batch_spec[0]!r}; parameter layouts:"]
    lines += [f"  {k}: {v} parameters" for k, v in sorted(counts.items())]
    return "\n".join(lines)


def compute_dtype(name: str) -> str:
    """Resolves ``"auto"``: bfloat16 on accelerators, float32 on CPU."""
    if name != "auto":
        return name
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def model_args(p: argparse.ArgumentParser, *, dim: int, layers: int, heads: int,
               batch: int, seq: int) -> None:
    """Shared size flags (the hybrid's own default to `hybrid.HybridConfig`'s)."""
    p.add_argument("--model", default="llama", choices=sorted(MODELS),
                   help="llama: the Llama of llama.py; hybrid: the Mamba-2/attention hybrid of "
                        "hybrid.py")
    p.add_argument("--dim", type=int, default=dim)
    p.add_argument("--layers", type=int, default=layers,
                   help="transformer blocks (hybrid: sequence mixers, each followed by an MLP "
                        "block unless --no-mlp)")
    p.add_argument("--heads", type=int, default=heads, help="attention heads")
    hy = HybridConfig
    p.add_argument("--attn-every", type=int, default=None,
                   help=f"hybrid: one attention mixer per this many mixers, 0: none "
                        f"(default {hy.attn_every})")
    p.add_argument("--state", type=int, default=None,
                   help=f"hybrid: Mamba-2 state size per head (default {hy.state})")
    p.add_argument("--ssm-head-dim", type=int, default=None,
                   help=f"hybrid: Mamba-2 head width (default {hy.ssm_head_dim})")
    p.add_argument("--chunk", type=int, default=None,
                   help=f"hybrid: SSD scan chunk length (default {hy.chunk})")
    p.add_argument("--mlp", action=argparse.BooleanOptionalAction, default=None,
                   help="hybrid: an MLP block after every mixer (default: yes)")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--seq", type=int, default=seq)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-first", type=int, default=0)
    p.add_argument("--keep-last", type=int, default=0)
    p.add_argument("--keep", action="append", default=[], metavar="REGEX",
                   help="keep matching module paths in BF16 (repeatable)")
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--diag-every", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="compute dtype; auto: bfloat16 on GPU, float32 on CPU (XLA's CPU "
                        "BF16 matmuls are slow)")
    p.add_argument("--data", default=None,
                   help="a text tree to train on (default: this interpreter's Python sources)")
    p.add_argument("--mesh", default="",
                   help="a device mesh, e.g. data=2,fsdp=2,model=2 (product = device count): "
                        "data parallel over data, FSDP over fsdp, tensor parallel over model")


HYBRID_FLAGS = {"attn_every": "--attn-every", "state": "--state",
                "ssm_head_dim": "--ssm-head-dim", "chunk": "--chunk", "mlp": "--mlp/--no-mlp"}
"""`model_args` flags of the hybrid only (their attribute: their flag)."""


def model_config(a: argparse.Namespace) -> ModelConfig:
    """The `LlamaConfig` or `HybridConfig` of parsed `model_args` flags.

    Raises:
      ValueError: a hybrid-only flag given with ``--model llama``, or bad sizes.
    """
    dtype = compute_dtype(a.dtype)
    hybrid = {k: getattr(a, k) for k in HYBRID_FLAGS if getattr(a, k, None) is not None}
    if a.model == "llama":
        if hybrid:
            raise ValueError(f"{', '.join(HYBRID_FLAGS[k] for k in hybrid)} only apply to "
                             "--model hybrid")
        return LlamaConfig(dim=a.dim, layers=a.layers, heads=a.heads, dtype=dtype)
    return HybridConfig(dim=a.dim, layers=a.layers, heads=a.heads, dtype=dtype, **hybrid)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="nvfp4", choices=sorted(RECIPES))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--bf16-forward-tail", type=float, default=0.0,
                   help="share of final steps with BF16 forward GEMMs (RECIPE.md §8)")
    p.add_argument("--out", default=None, help="directory for metrics.jsonl/csv, summary.json")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint here; resume if one exists")
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--no-fp4-gather", action="store_true",
                   help="with --mesh ...fsdp=F: let XLA gather the NVFP4 layers' weights in the "
                        "compute dtype instead of as NVFP4 codes and scales (for comparison)")
    model_args(p, dim=256, layers=4, heads=4, batch=16, seq=256)
    a = p.parse_args(argv)
    if a.mesh:
        make_mesh_rules(a.mesh)  # a bad --mesh fails before the data is loaded
    mcfg = model_config(a)  # so do bad sizes
    corpus = data_lib.load_corpus([a.data] if a.data else None,
                                  suffix=None if a.data else ".py")
    print(corpus.describe())
    print(describe_model(mcfg))
    cfg = RunConfig(recipe=a.recipe, batch=a.batch, seq=a.seq, lr=a.lr, seed=a.seed,
                    keep_first=a.keep_first, keep_last=a.keep_last, keep_patterns=tuple(a.keep),
                    bf16_forward_tail=a.bf16_forward_tail, eval_every=a.eval_every,
                    eval_batches=a.eval_batches, log_every=a.log_every, diag_every=a.diag_every,
                    mesh=a.mesh, fp4_gather=not a.no_fp4_gather)
    batches = data_lib.Batches(corpus.train, batch=a.batch, seq=a.seq, seed=a.seed)
    val = data_lib.validation_batches(corpus.val, batch=a.batch, seq=a.seq,
                                      max_batches=a.eval_batches)
    trainer = Trainer(mcfg, cfg, a.steps)
    if trainer.report is not None:
        print(trainer.report)
    if trainer.mesh_rules is not None:
        print(describe_mesh(trainer.mesh_rules, trainer.params0))
    summary = train(trainer, batches, val, steps=a.steps, out=a.out,
                    ckpt_dir=a.ckpt_dir, ckpt_every=a.ckpt_every)
    if trainer.mesh_rules is not None:
        gathered = summary["fp4_gathered"]
        print(f"weights all-gathered as NVFP4 codes + scales: {len(gathered)} layers"
              + (f" ({', '.join(gathered)})" if gathered else ""))
    print(describe(summary))
    return summary


if __name__ == "__main__":
    main()
