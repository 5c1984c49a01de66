"""The examples' training loop against its own jitted step, BF16 and NVFP4, in one process.

    PYTHONPATH=. python benchmarks/train_loop.py --out /tmp/loop.json              # GPU
    PYTHONPATH=. python benchmarks/train_loop.py --dim 64 --layers 2 --heads 2 \\
        --batch 8 --seq 64 --steps 60                                              # CPU smoke

For each recipe one `train_llama.Trainer` (compare.py's settings: AdamW, clipping,
``donate=True``) is measured twice:

* **step**: its compiled step alone, the batch already on the device, the state
  threaded from call to call (`pallas_kernels.timing.time_fn`);
* **loop**: `train_llama.train`, the examples' real loop (data, input transfer,
  metrics every ``--log-every`` steps to ``metrics.jsonl``/``.csv``, progress bar) over
  ``--steps`` steps; its reported ``step_time_s`` leaves out the first step.

The step is compiled before either is timed, so neither includes compilation. The
two are measured alternately ``--repeats`` times (medians reported). The ratio
loop / step is the loop's host overhead: 1.0 means the loop runs at device speed.
A second table (skip with ``--no-breakdown``) times loops that add one kind of host
work at a time — the old loop's per-step ``jnp.asarray`` of host batches, a step
count read back, metrics fetched as soon as logged — and the prefetching loop.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import data as data_lib  # noqa: E402
import train_llama as tl  # noqa: E402
from llama import LlamaConfig  # noqa: E402

from benchmarks import train_step as ts  # noqa: E402
from fp4jax import metrics_log  # noqa: E402
from pallas_kernels import timing  # noqa: E402


def jitted_step_seconds(trainer: tl.Trainer, batch: tuple, *, iters: int, reps: int) -> float:
    """Median seconds per call of the trainer's compiled step on a device-resident batch.

    `train_step.threaded_step_seconds`, as ``train_step.py`` times it: the state is
    threaded through the calls (the step donates its input state), so this is the
    steady state of a loop with no host work at all.
    """
    step = functools.partial(trainer.step.jitted, mode="recipe")
    return ts.threaded_step_seconds(step, trainer.init(iters * reps + 8), batch, iters=iters,
                                    reps=reps)


def _loop_seconds(trainer: tl.Trainer, steps: int, body) -> float:
    """Seconds per step of ``state = body(state, i)`` over ``steps`` steps, one sync at the end."""
    state = jax.block_until_ready(trainer.init(steps))
    t0 = time.perf_counter()
    state = body(state, range(steps))
    jax.block_until_ready(state)
    return (time.perf_counter() - t0) / steps


def breakdown(trainer: tl.Trainer, batches: data_lib.Batches, dev_batch: tuple, *, steps: int,
              log_every: int) -> dict[str, float]:
    """Seconds per step of loops that add one kind of host work at a time.

    The old loop's ingredients (a host batch converted with ``jnp.asarray`` on the
    loop's thread, the step count read back, metrics fetched as soon as they are
    logged) against the new one's (batches prefetched to the device, a bounded
    number of steps ahead).
    """
    step, mode = trainer.step, "recipe"

    def jitted(state, idx):
        for _ in idx:
            state, _ = step.jitted(state, dev_batch, mode=mode)
        return state

    def call(state, idx):
        for i in idx:
            state, _ = step(state, dev_batch, step=i)
        return state

    def host_batch(state, idx, *, read_step=False, fetch_metrics=False):
        for i in idx:
            x, y = batches(i)
            state, m = step(state, (jnp.asarray(x), jnp.asarray(y)), step=i)
            if read_step:
                int(state.step)
            if fetch_metrics and log_every and (i + 1) % log_every == 0:
                metrics_log.to_host(m)
        return state

    def prefetched(state, idx):
        in_flight = collections.deque()
        with data_lib.DevicePrefetcher(batches, idx.start, idx.stop, depth=tl.PREFETCH) as feed:
            for i, batch in feed:
                state, m = step(state, batch, step=i)
                in_flight.append(m["loss"])
                if len(in_flight) > tl.STEPS_AHEAD:
                    jax.block_until_ready(in_flight.popleft())
        return state

    variants = {
        "jitted step, device batch": jitted,
        "+ TrainStep call": call,
        "+ host batch: Batches(i), jnp.asarray on the loop's thread": host_batch,
        f"+ metrics fetched when logged (every {log_every})":
            lambda s, idx: host_batch(s, idx, fetch_metrics=True),
        "+ int(state.step) every step": lambda s, idx: host_batch(s, idx, read_step=True),
        "prefetched device batches, TrainStep call, steps ahead bounded": prefetched,
    }
    return {name: _loop_seconds(trainer, steps, body) for name, body in variants.items()}


def measure(model_cfg: LlamaConfig, cfg: tl.RunConfig, batches: data_lib.Batches, val: list,
            *, steps: int, iters: int, reps: int, repeats: int, out_dir: str,
            with_breakdown: bool) -> dict:
    """One recipe: compile, then ``repeats`` times the jitted step alone and the loop."""
    trainer = tl.Trainer(model_cfg, cfg, steps)
    batch = jax.device_put(batches(0))
    t0 = time.perf_counter()
    jax.block_until_ready(trainer.step.jitted(trainer.init(steps), batch, mode="recipe"))
    compile_s = time.perf_counter() - t0
    step_s, loop_s = [], []
    for r in range(repeats):  # alternated, so that a drifting machine load hits both alike
        step_s.append(jitted_step_seconds(trainer, batch, iters=iters, reps=reps))
        summary = tl.train(trainer, batches, val, steps=steps, out=f"{out_dir}_{r}",
                           progress=True)
        loop_s.append(summary["step_time_s"])
    ratios = [b / a for a, b in zip(step_s, loop_s)]
    parts = {}
    if with_breakdown:
        parts = breakdown(trainer, batches, batch, steps=steps, log_every=cfg.log_every)
        parts["the loop: train_llama.train"] = statistics.median(loop_s)
    return {
        "recipe": cfg.recipe,
        "compile_s": compile_s,
        "step_ms": statistics.median(step_s) * 1e3,
        "loop_ms": statistics.median(loop_s) * 1e3,
        "loop_over_step": statistics.median(ratios),
        "step_ms_all": [t * 1e3 for t in step_s],
        "loop_ms_all": [t * 1e3 for t in loop_s],
        "loop_steps": summary["steps"],
        "compilations": summary["compilations"],
        "final_train_bpb": summary["final_train_bpb"],
        "breakdown_ms": {k: v * 1e3 for k, v in parts.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ts.add_model_arguments(p)
    p.add_argument("--recipes", default="bf16,nvfp4")
    p.add_argument("--embed", default="onehot", choices=["onehot", "gather"],
                   help="the embedding lookup (LlamaConfig.embed_lookup)")
    p.add_argument("--steps", type=int, default=100, help="training-loop steps per recipe")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--iters", type=int, default=5, help="jitted-step samples (time_fn iters)")
    p.add_argument("--reps", type=int, default=4, help="steps per sample (time_fn reps)")
    p.add_argument("--repeats", type=int, default=3,
                   help="measurements of each (medians reported; the ratio is the median of "
                        "the per-repeat ratios)")
    p.add_argument("--no-breakdown", action="store_true",
                   help="skip the loops that add one kind of host work at a time")
    p.add_argument("--data", default=None,
                   help="a text tree to train on (default: this interpreter's Python sources)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    a.heads = a.heads or ts.default_heads(a.dim)
    if a.steps < 3:
        raise ValueError(f"--steps must be at least 3 (the first step is not timed), got {a.steps}")
    corpus = data_lib.load_corpus([a.data] if a.data else None, suffix=None if a.data else ".py")
    model_cfg = LlamaConfig(dim=a.dim, layers=a.layers, heads=a.heads,
                            dtype=tl.compute_dtype(a.dtype), embed_lookup=a.embed)
    base = ts.run_config("bf16", batch=a.batch, seq=a.seq, seed=a.seed, log_every=a.log_every)
    batches = data_lib.Batches(corpus.train, batch=a.batch, seq=a.seq, seed=a.seed)
    val = data_lib.validation_batches(corpus.val, batch=a.batch, seq=a.seq, max_batches=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in [r for r in a.recipes.split(",") if r]:
            cfg = dataclasses.replace(base, recipe=recipe)
            rows.append(measure(model_cfg, cfg, batches, val, steps=a.steps, iters=a.iters,
                                reps=a.reps, repeats=a.repeats,
                                out_dir=os.path.join(tmp, recipe),
                                with_breakdown=not a.no_breakdown))
    command = "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:] if argv is None
                                   else [os.path.relpath(__file__), *argv])
    result = {**timing.environment(), "command": command, "model": vars(a),
              "compute_dtype": model_cfg.dtype, "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{result['device']}, jax {result['jax']}, {result['date']}")
    print(f"command: {command}")
    print(f"Llama dim={a.dim} layers={a.layers} heads={a.heads}, batch {a.batch} x seq {a.seq}, "
          f"compute {model_cfg.dtype}, embed {a.embed}; loop: {a.steps} steps, metrics every "
          f"{a.log_every}; medians of {a.repeats}")
    print("| recipe | compile s | jitted step ms | loop ms/step | loop / step |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['recipe']} | {r['compile_s']:.1f} | {r['step_ms']:.2f} | {r['loop_ms']:.2f} | "
              f"{r['loop_over_step']:.2f} |")
    if any(r["breakdown_ms"] for r in rows):
        print(f"\nWhere host time goes ({a.steps} steps each, one sync at the end):")
        print("| recipe | loop | ms/step | x jitted step |")
        print("| --- | --- | --- | --- |")
        for r in rows:
            for name, ms in r["breakdown_ms"].items():
                print(f"| {r['recipe']} | {name} | {ms:.2f} | {ms / r['step_ms']:.2f} |")
    return result


if __name__ == "__main__":
    main()
