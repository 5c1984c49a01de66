"""Host-side lowering time of the examples' NVFP4 train step, cross-lowered for CUDA.

    PYTHONPATH=. python benchmarks/lowering_time.py                       # 3 repeats, min
    PYTHONPATH=. python benchmarks/lowering_time.py --profile 40          # + cProfile top 40
    PYTHONPATH=. python benchmarks/lowering_time.py --layers 2 --out /tmp/lower.json

The step is `benchmarks.train_step`'s (the examples' `train_llama.Trainer`, Llama dim
768, 4 layers, batch 64 × seq 512, ``impl="auto"``, compute dtype bfloat16 as on the
GPU). Tracing and lowering to StableHLO are pure host work, so they are measured here
on any machine: the step is traced, then lowered with ``lowering_platforms=("cuda",)``,
and ``impl="auto"`` is made to decide as on an H200 (`fp4jax.implementation.gpu_capability`
reports sm_90 while the step is traced), so the Pallas Mosaic GPU quantize kernels are
lowered exactly as there. Nothing is compiled.

Each repeat starts from empty JAX caches (``jax.clear_caches()``, a fresh `Trainer`);
the table gives the fastest repeat of trace and of lower (a shared machine's load only
adds time), in wall and in this process's CPU seconds (less sensitive to the load). It
also counts the lowered module's StableHLO operations, its Mosaic GPU custom calls (in
the text, and the launches XLA sees once calls are inlined) and its kernel lowerings:
each lowering serializes a kernel module of its own (its ``kernel_hash`` differs even
for identical kernels), which XLA then compiles once per hash. JAX traces a kernel body
once per trace of the function that launches it and lowers each traced body once per
module. ``--profile N`` prints the N functions of largest cumulative time of the first
repeat (cProfile, excluded from the fastest) and the time inside Mosaic GPU kernel
tracing and lowering.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import compile_time, train_step
from fp4jax import implementation
from pallas_kernels import timing

# cProfile entries summarized beside the top list: (label, file suffix, function name).
_PHASES = (
    ("Mosaic GPU kernel lowering", "mosaic_gpu/pallas_call_registration.py",
     "mpmd_map_mgpu_lowering_rule"),
    ("Mosaic GPU kernel body tracing", "pallas/mosaic_gpu/core.py", "kernel_body"),
)


@contextlib.contextmanager
def as_hopper() -> Iterator[None]:
    """`fp4jax.implementation.gpu_capability` reports sm_90 (an H200) inside the block,
    so ``impl="auto"`` picks the kernels it picks on the GPU."""
    saved = implementation.gpu_capability
    implementation.gpu_capability = lambda: (9, 0)
    try:
        yield
    finally:
        implementation.gpu_capability = saved


def kernel_launches(hlo_text: str) -> int:
    r"""Mosaic GPU custom calls of an HLO module with every ``call`` inlined: the kernel
    launches XLA compiles (a function called from several places holds one in the text).

    Example:
      >>> t = ('f {\n  ROOT k = f32[] custom-call(), custom_call_target="mosaic_gpu_v2"\n}\n'
      ...      'ENTRY main {\n  a = f32[] call(), to_apply=f\n  ROOT b = f32[] call(), '
      ...      'to_apply=f\n}')
      >>> kernel_launches(t)
      2
    """
    return compile_time.inlined_count(
        hlo_text, lambda line: 'custom_call_target="mosaic_gpu_v2"' in line)


def module_stats(mlir_text: str) -> dict[str, int]:
    """StableHLO operations, Mosaic GPU custom calls and kernel lowerings (distinct
    ``kernel_hash`` values) of a lowered module's text.

    Example:
      >>> t = ('%0 = stablehlo.add %a, %b : tensor<f32>\\n'
      ...      '%1 = stablehlo.custom_call @mosaic_gpu_v2(%0) {kernel_hash = "ab"}\\n'
      ...      '%2 = stablehlo.custom_call @mosaic_gpu_v2(%1) {kernel_hash = "ab"}\\n')
      >>> module_stats(t)
      {'stablehlo_ops': 3, 'mosaic_calls': 2, 'mosaic_kernels': 1, 'functions': 0}
    """
    calls, kernels = compile_time.mosaic_kernels(mlir_text)
    return {"stablehlo_ops": compile_time.stablehlo_ops(mlir_text),
            "mosaic_calls": calls, "mosaic_kernels": kernels,
            "functions": len(re.findall(r"^\s*func\.func ", mlir_text, re.M))}


def lower_once(a: argparse.Namespace, profile: cProfile.Profile | None = None
               ) -> tuple[dict[str, Any], str]:
    """Builds the Trainer, traces and lowers its step once: (times and counts, module text)."""
    jax.clear_caches()
    model_cfg = train_step.LlamaConfig(dim=a.dim, layers=a.layers, heads=a.heads,
                                       dtype=a.dtype, embed_lookup=a.embed)
    cfg = train_step.run_config(a.recipe, batch=a.batch, seq=a.seq, impl=a.impl)
    trainer = train_step.tl.Trainer(model_cfg, cfg, 100)
    state = trainer.init(100)
    tokens = jax.ShapeDtypeStruct((a.batch, a.seq), jnp.int32)
    with as_hopper():
        if profile is not None:
            profile.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        traced = trainer.step.jitted.trace(state, (tokens, tokens), mode="recipe")
        t1, c1 = time.perf_counter(), time.process_time()
        lowered = traced.lower(lowering_platforms=("cuda",))
        t2, c2 = time.perf_counter(), time.process_time()
        if profile is not None:
            profile.disable()
    text = lowered.as_text()
    return {"trace_s": t1 - t0, "lower_s": t2 - t1, "trace_cpu_s": c1 - c0,
            "lower_cpu_s": c2 - c1, **module_stats(text),
            "mosaic_launches": kernel_launches(lowered.as_text(dialect="hlo"))}, text


def profile_summary(profile: cProfile.Profile, top: int) -> tuple[str, list[dict]]:
    """The ``top`` entries by cumulative time (text) and the `_PHASES` totals."""
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    phases = []
    for label, path, name in _PHASES:
        hits = [(v[1], v[3]) for (f, _, fn), v in stats.stats.items()  # type: ignore[attr-defined]
                if fn == name and f.endswith(path)]
        # A recursive entry counts all its calls but its outermost calls' time only.
        phases.append({"phase": label, "calls": sum(c for c, _ in hits),
                       "cum_s": sum(t for _, t in hits)})
    return out.getvalue(), phases


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # bfloat16 first: the GPU's compute dtype (the kernels take 16-bit inputs).
    train_step.add_model_arguments(p, dtypes=("bfloat16", "float32"))
    p.add_argument("--recipe", default="nvfp4")
    p.add_argument("--impl", default="auto")
    p.add_argument("--embed", default="onehot", help="LlamaConfig.embed_lookup")
    p.add_argument("--repeats", type=int, default=3, help="keep the fastest trace and lower")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile the first repeat; print its top N cumulative entries")
    p.add_argument("--mlir", default=None, help="write the lowered module's text here")
    p.add_argument("--out", default=None, help="write the JSON result here")
    a = p.parse_args(argv)
    a.heads = a.heads or train_step.default_heads(a.dim)
    runs, text, phases, top = [], "", [], ""
    for i in range(a.repeats):
        profile = cProfile.Profile() if a.profile and i == 0 else None
        row, text = lower_once(a, profile)
        runs.append(row)
        print(f"repeat {i}: trace {row['trace_s']:.2f} s ({row['trace_cpu_s']:.2f} s CPU), "
              f"lower {row['lower_s']:.2f} s ({row['lower_cpu_s']:.2f} s CPU)"
              + (" (profiled)" if profile else ""), flush=True)
        if profile is not None:
            top, phases = profile_summary(profile, a.profile)
    if a.mlir:
        with open(a.mlir, "w") as f:
            f.write(text)
    timed = [r for r in runs[1 if a.profile and len(runs) > 1 else 0:]]
    best = {k: min(r[k] for r in timed)
            for k in ("trace_s", "lower_s", "trace_cpu_s", "lower_cpu_s")}
    command = "python " + " ".join([os.path.relpath(__file__)]
                                   + (sys.argv[1:] if argv is None else list(argv)))
    result = {**timing.environment(), "command": command, "model": vars(a),
              "runs": runs, "best": best, "profile_phases": phases,
              **{k: v for k, v in runs[-1].items() if k not in best}}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    if top:
        print(top)
        print("| profiled phase (first repeat) | calls | cumulative s |")
        print("| --- | --- | --- |")
        for ph in phases:
            print(f"| {ph['phase']} | {ph['calls']} | {ph['cum_s']:.2f} |")
        print()
    print(f"{result['device']} host, jax {result['jax']}, {result['date']}")
    print(f"command: {command}")
    print(f"Llama dim={a.dim} layers={a.layers} heads={a.heads}, batch {a.batch} x seq {a.seq}, "
          f"{a.dtype}, {a.recipe} impl={a.impl} as on sm_90; lowered for CUDA; "
          f"fastest of {len(timed)} repeat(s)" + (" (the profiled one excluded)"
                                                  if len(timed) < len(runs) else ""))
    print("| trace s | lower s | trace + lower s | CPU s (trace + lower) | StableHLO ops "
          "| functions | Mosaic calls in the text | launches (calls inlined) "
          "| kernels lowered |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {best['trace_s']:.2f} | {best['lower_s']:.2f} | "
          f"{best['trace_s'] + best['lower_s']:.2f} | "
          f"{best['trace_cpu_s']:.2f} + {best['lower_cpu_s']:.2f} | {result['stablehlo_ops']} | "
          f"{result['functions']} | {result['mosaic_calls']} | {result['mosaic_launches']} | "
          f"{result['mosaic_kernels']} |")
    return result


if __name__ == "__main__":
    main()
