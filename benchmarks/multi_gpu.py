"""Multi-GPU scaling of the examples' train step: data parallel and FSDP, BF16 and NVFP4.

    PYTHONPATH=. python benchmarks/multi_gpu.py --out /tmp/multi_gpu.json      # every part
    PYTHONPATH=. python benchmarks/multi_gpu.py --parts dp --models wide --budget-s 300
    bash benchmarks/gpu_multi.sh                       # the device call on 2 H200s, into $OUT
    XLA_FLAGS=--xla_force_host_platform_device_count=2 PYTHONPATH=. python \\
        benchmarks/multi_gpu.py --models 32:1 --batch 4 --seq 32 --steps 3 \\
        --recipes nvfp4 --keep '.*\\.attn\\..*' --data DIR                       # CPU smoke

n is every device (`jax.device_count()`). The step is `train_step.py`'s, a
`train_llama.Trainer`'s (AdamW, clipping, donation), compiled with ``.lower().compile()``
and timed by `train_step.threaded_step_seconds` (the state threaded), on the same
global batch (``--batch`` x ``--seq`` of the corpus) whatever the device count. Parts
(``--parts``):

* ``dp``: tokens/s on 1 device and data parallel on n (mesh ``data=n``: the batch
  split, the state replicated), for each recipe of ``--recipes``; speedup =
  tokens/s(n) / tokens/s(1) (issue 11's target for NVFP4 on 2 GPUs: >= 1.8x).
  ``impl="auto"`` takes the Hopper kernels where faster on 1 device and the XLA path on
  a mesh of n (docs/SHARDING.md, "Kernels and meshes"), so NVFP4's speedup includes
  that switch; ``--impl xla`` compares like with like.
* ``fsdp``: each NVFP4 recipe on mesh ``fsdp=n`` (parameters and optimizer state
  sharded, the batch split), with the FP4 all-gather (`MeshRules.fp4_gather`) and
  without it (XLA gathers the weights in their own dtype): step time, and the bytes
  each device sends per step in all-gathers (and other collectives), read from the
  compiled HLO by `fp4jax.testing.hlo`. "BF16 basis" counts float gathers at 2 bytes
  per element (XLA:CPU widens float gathers to float32; "as compiled" is what the
  program does). The FP4 run's u8 gathers are the NVFP4 codes and scales; what they
  replace is the float gathers the plain run has beyond the FP4 run's.
* ``curve``: ``--steps`` steps from the same initialization, batches and SR keys on 1
  device and on n (data parallel, and FSDP when that part ran; no extra compilation):
  the largest relative loss difference from the 1-device curve, and a few losses.

Time: compilations dominate (one H200, compare.py's model: BF16 ~13 s, NVFP4 ~90 s;
dim 2048 compiled as fast as dim 768, so ``wide`` is wider, not deeper). Each model
compiles every program its parts need once, before any timing, up to
``--compile-workers`` at a time (lowering is Python and serial, ``compile()`` releases
the GIL). With ``--budget-s``, a part whose estimate (``--guess-*-s`` until compile
times are measured, then those) does not fit the time left is skipped and listed. The
JSON (``--out``) is rewritten after every part, so a run cut short keeps what it
measured.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from typing import Any

import jax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import data as data_lib  # noqa: E402
import train_llama as tl  # noqa: E402
from llama import LlamaConfig  # noqa: E402

from benchmarks import train_step  # noqa: E402
from fp4jax.testing import hlo  # noqa: E402
from pallas_kernels import timing  # noqa: E402

PARTS = ("dp", "fsdp", "curve")
MODELS = {"default": (768, 4), "wide": (2560, 4)}
"""(dim, layers): compare.py's default model, and one of 317M parameters."""

LAYOUTS = {"1": ("", True), "dp": ("data={n}", True), "fsdp_fp4": ("fsdp={n}", True),
           "fsdp_bf16": ("fsdp={n}", False)}
"""Program layouts: (``RunConfig.mesh`` for n devices, ``RunConfig.fp4_gather``)."""

FLOATS = ("f64", "f32", "bf16", "f16")
NVFP4_BYTES = ("u8", "f8e4m3fn")
"""Element types of the FP4 gathers: packed E2M1 codes and E4M3 scales (as bytes)."""

LARGEST = 8
"""The largest all-gathers of each mesh program kept in the JSON (what moves most)."""

ASSUMED_FLOPS = 2e14
"""Training FLOP/s per device assumed for the run-time estimates (about half of one
H200's measured BF16 step)."""
RUN_OVERHEAD_S = 8.0
"""Seconds assumed per timed program besides its steps (state, batch, HLO text)."""
CONCURRENT_SLOWDOWN = 1.3
"""Assumed slowdown of each compilation when several run at once."""


def parse_models(spec: str, dtype: str = "bfloat16") -> dict[str, LlamaConfig]:
    """``"default,wide,64:1"`` → named `LlamaConfig`s (``DIM:LAYERS`` for any other size),
    heads of width 64 (`train_step.default_heads`).

    Example:
      >>> {k: (c.dim, c.layers, c.heads) for k, c in parse_models("default,64:1").items()}
      {'default': (768, 4, 12), '64:1': (64, 1, 1)}
    """
    out = {}
    for name in spec.split(","):
        name = name.strip()
        if name in MODELS:
            dim, layers = MODELS[name]
        else:
            dim, _, layers = name.partition(":")
            if not (dim.isdigit() and layers.isdigit()):
                raise ValueError(f"model {name!r} must be one of {sorted(MODELS)} or "
                                 "DIM:LAYERS, e.g. 64:1")
            dim, layers = int(dim), int(layers)
        out[name] = LlamaConfig(dim=dim, layers=layers, heads=train_step.default_heads(dim),
                                dtype=dtype)
    return out


def program_keys(part: str, recipes: list[str]) -> list[tuple[str, str]]:
    """The (recipe, layout) programs a part runs."""
    if part == "fsdp":
        return [(r, lay) for r in recipes if r != "bf16" for lay in ("fsdp_fp4", "fsdp_bf16")]
    return [(r, lay) for r in recipes for lay in ("1", "dp")]


@dataclasses.dataclass
class Program:
    """One compiled train step of a model, recipe and layout."""

    recipe: str
    layout: str
    trainer: tl.Trainer
    batch: Any  # the timed batch, placed as the program takes it
    lowered: Any = None
    compiled: Any = None
    lower_s: float = 0.0
    compile_s: float = 0.0
    comm: dict | None = None  # `comm_summary` of a mesh program


def comm_summary(collectives: list[dict]) -> dict:
    """Bytes each device sends per step: by collective, and the all-gathers by kind.

    Example:
      >>> c = [{"op": "all-gather", "dtype": "f32", "itemsize": 4, "bytes": 8},
      ...      {"op": "all-gather", "dtype": "u8", "itemsize": 1, "bytes": 3},
      ...      {"op": "all-reduce", "dtype": "f32", "itemsize": 4, "bytes": 4}]
      >>> c = [dict(x, elements=0, op_name="") for x in c]
      >>> s = comm_summary(c)
      >>> s["bytes_by_op"], s["all_gather"]["float_bytes_bf16"], s["all_gather"]["bytes_bf16"]
      ({'all-gather': 11, 'all-reduce': 4}, 4, 7)
    """
    by_op: dict[str, int] = {}
    for c in collectives:
        by_op[c["op"]] = by_op.get(c["op"], 0) + c["bytes"]
    gathers = [c for c in collectives if c["op"] == "all-gather"]
    fl = [c for c in gathers if c["dtype"] in FLOATS]
    nv = sum(c["bytes"] for c in gathers if c["dtype"] in NVFP4_BYTES)
    other = sum(c["bytes"] for c in gathers if c["dtype"] not in FLOATS + NVFP4_BYTES)
    fl_bf16 = sum(c["bytes"] * 2 // int(c["itemsize"]) for c in fl)
    largest = sorted(gathers, key=lambda c: -c["bytes"])[:LARGEST]
    return {"bytes_by_op": by_op,
            "all_gather": {"count": len(gathers), "bytes": sum(c["bytes"] for c in gathers),
                           "float_bytes": sum(c["bytes"] for c in fl),
                           "float_bytes_bf16": fl_bf16, "nvfp4_bytes": nv, "other_bytes": other,
                           "bytes_bf16": fl_bf16 + nv + other,
                           "largest": [{k: c[k] for k in ("dtype", "bytes", "elements", "op_name")}
                                       for c in largest]}}


class Budget:
    """Time left and estimates of what a set of programs costs to compile and run."""

    def __init__(self, seconds: float | None, guesses: dict[str, float], workers: int):
        self.deadline = None if seconds is None else time.perf_counter() + seconds
        self.per_layer = {(kind, mesh): s / MODELS["default"][1]
                          for kind, s in guesses.items() for mesh in (False, True)}
        self.workers = workers

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    @staticmethod
    def _key(recipe: str, layout: str) -> tuple[str, bool]:
        return ("bf16" if recipe == "bf16" else "nvfp4", layout != "1")

    def compile_guess(self, recipe: str, layout: str, layers: int) -> float:
        return self.per_layer[self._key(recipe, layout)] * layers

    def measured(self, progs: list[Program], concurrent: bool) -> None:
        """Replaces the guesses by the slowest measured program of each kind."""
        slowest: dict[tuple[str, bool], float] = {}
        for p in progs:
            s = (p.lower_s + p.compile_s) / (CONCURRENT_SLOWDOWN if concurrent else 1.0)
            key = self._key(p.recipe, p.layout)
            slowest[key] = max(slowest.get(key, 0.0), s / p.trainer.model_cfg.layers)
        self.per_layer.update(slowest)

    def compile_wall(self, guesses: list[float]) -> float:
        if not guesses:
            return 0.0
        if self.workers == 1 or len(guesses) == 1:
            return sum(guesses)
        return max(max(guesses), sum(guesses) / self.workers) * CONCURRENT_SLOWDOWN


def step_guess_s(model_cfg: LlamaConfig, batch: int, seq: int, devices: int) -> float:
    """Seconds per step at `ASSUMED_FLOPS` per device."""
    flops = sum(model_cfg.train_flops_per_token(seq).values()) * batch * seq
    return flops / (ASSUMED_FLOPS * devices)


def fmt_params(n: int) -> str:
    """A parameter count for a table: ``316.6M`` (``20,736`` below 100k)."""
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def fmt_bytes(b: float) -> str:
    """Bytes for a table: ``516 B``, ``3.1 kB``, ``12.58 MB``."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.{2 if unit != 'kB' else 1}f} {unit}"
    return f"{b:.0f} B"


class Run:
    """One invocation: the arguments, the corpus batches, the budget and the results."""

    def __init__(self, a: argparse.Namespace, command: str):
        self.a, self.n = a, jax.device_count()
        self.t0 = time.perf_counter()
        self.timed_steps = 2 + a.iters * a.reps
        self.recipes = a.recipes.split(",")
        for r in self.recipes:
            if r not in tl.RECIPES:
                raise ValueError(f"--recipes: {r!r} is not one of {sorted(tl.RECIPES)}")
        self.parts = a.parts.split(",")
        if not set(self.parts) <= set(PARTS) or not self.parts:
            raise ValueError(f"--parts must be from {PARTS}, got {a.parts!r}")
        self.models = parse_models(a.models, tl.compute_dtype(a.dtype))
        if a.compile_workers < 1:
            raise ValueError(f"--compile-workers must be >= 1, got {a.compile_workers}")
        self.budget = Budget(a.budget_s, {"bf16": a.guess_bf16_s, "nvfp4": a.guess_nvfp4_s},
                             a.compile_workers)
        corpus = data_lib.load_corpus([a.data] if a.data else None,
                                      suffix=None if a.data else ".py")
        self.batches = data_lib.Batches(corpus.train, batch=a.batch, seq=a.seq, seed=a.seed)
        self.result: dict[str, Any] = {
            **timing.environment(), "devices": self.n, "command": command, "args": vars(a),
            "compute_dtype": tl.compute_dtype(a.dtype), "models": {}, "compiles": [],
            "dp": [], "fsdp": [], "fsdp_gather": [], "curve": [], "skipped": [], "errors": []}

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)

    def save(self) -> None:
        self.result["wall_s"] = time.perf_counter() - self.t0
        if self.a.out:
            with open(self.a.out, "w") as f:
                json.dump(self.result, f, indent=1)

    # ------------------------------------------------------------------ planning

    def estimate(self, cfg: LlamaConfig, parts: list[str], keys: list[tuple[str, str]]) -> float:
        """Seconds to compile ``keys`` and run ``parts`` on them (a guess, see `Budget`)."""
        b = self.budget
        compile_s = b.compile_wall([b.compile_guess(r, lay, cfg.layers) for r, lay in keys])
        timed = {k for p in parts if p != "curve" for k in program_keys(p, self.recipes)}
        run = 0.0
        for r, lay in keys:
            step = step_guess_s(cfg, self.a.batch, self.a.seq, 1 if lay == "1" else self.n)
            run += RUN_OVERHEAD_S + self.timed_steps * step * ((r, lay) in timed)
            run += self.a.steps * step * ("curve" in parts)
        return compile_s + run

    def plan(self, name: str, cfg: LlamaConfig) -> tuple[list[str], list[tuple[str, str]]]:
        """The parts of ``self.parts`` that fit the time left (dp first, then the curve,
        which reuses dp's programs, then fsdp), and the programs they need."""
        chosen: list[str] = []
        keys: list[tuple[str, str]] = []
        for part in [p for p in ("dp", "curve", "fsdp") if p in self.parts]:
            want = program_keys(part, self.recipes)
            if not want:
                self.skip(f"{name} {part}: no NVFP4 recipe in --recipes")
                continue
            more = keys + [k for k in want if k not in keys]
            est = self.estimate(cfg, chosen + [part], more)
            if est <= self.budget.left():
                chosen, keys = chosen + [part], more
            else:
                self.skip(f"{name} {part}: estimated {est:.0f} s, {self.budget.left():.0f} s "
                          "left")
        if chosen:
            self.log(f"{name}: {', '.join(chosen)}, {len(keys)} programs: estimated "
                     f"{self.estimate(cfg, chosen, keys):.0f} s"
                     + (f", {self.budget.left():.0f} s left" if self.budget.deadline else ""))
        return [p for p in PARTS if p in chosen], keys

    def skip(self, why: str) -> None:
        self.log(f"skipped {why}")
        self.result["skipped"].append(why)

    # ------------------------------------------------------------------ programs

    def build(self, cfg: LlamaConfig, recipe: str, layout: str) -> Program:
        """A Trainer for the layout and its lowered step (lowering is Python: serial)."""
        mesh, fp4_gather = LAYOUTS[layout]
        run_cfg = train_step.run_config(recipe, batch=self.a.batch, seq=self.a.seq,
                                        impl=self.a.impl, mesh=mesh.format(n=self.n),
                                        fp4_gather=fp4_gather, keep_patterns=tuple(self.a.keep),
                                        seed=self.a.seed)
        trainer = tl.Trainer(cfg, run_cfg, self.timed_steps)
        p = Program(recipe, layout, trainer, jax.device_put(self.batches(0),
                                                            trainer.batch_sharding))
        state = trainer.init(self.timed_steps)
        t = time.perf_counter()
        p.lowered = trainer.step.jitted.lower(state, p.batch, mode="recipe")
        p.lower_s = time.perf_counter() - t
        return p

    def compile_all(self, name: str, cfg: LlamaConfig,
                    keys: list[tuple[str, str]]) -> dict[tuple[str, str], Program]:
        """Lowers each program in turn and compiles up to ``--compile-workers`` at once."""
        workers = self.a.compile_workers

        def compile_one(p: Program) -> None:
            t = time.perf_counter()
            p.compiled = p.lowered.compile()
            p.compile_s = time.perf_counter() - t
            p.lowered = None
            self.log(f"{name} {p.recipe} {p.layout}: lowered in {p.lower_s:.1f} s, compiled in "
                     f"{p.compile_s:.1f} s")

        progs = {}
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        try:
            futures = []
            for recipe, layout in keys:
                p = progs[(recipe, layout)] = self.build(cfg, recipe, layout)
                if workers == 1:
                    compile_one(p)
                else:
                    futures.append(pool.submit(compile_one, p))
            for f in futures:
                f.result()
        finally:  # on an error or an interrupt, do not wait for the other compilations
            pool.shutdown(wait=False, cancel_futures=True)
        concurrent_ = workers > 1 and len(keys) > 1
        self.budget.measured(list(progs.values()), concurrent_)
        for p in progs.values():
            self.result["compiles"].append({"model": name, "recipe": p.recipe,
                                            "layout": p.layout, "lower_s": p.lower_s,
                                            "compile_s": p.compile_s,
                                            "concurrent": concurrent_})
        return progs

    def comm(self, p: Program) -> dict | None:
        """`comm_summary` of a mesh program's compiled HLO (None, logged, if unreadable:
        the timings still count)."""
        if p.comm is None:
            try:
                p.comm = comm_summary(hlo.collectives(p.compiled.as_text()))
            except Exception as e:  # noqa: BLE001 - an HLO form the reader does not know
                self.log(f"{p.recipe} {p.layout}: HLO collectives not read: {e}")
                self.result["errors"].append(f"{p.recipe} {p.layout} HLO: {e}")
        return p.comm

    def time_step(self, p: Program) -> dict:
        """Step time (state threaded) and tokens/s of a compiled program."""
        state = p.trainer.init(self.timed_steps)
        s = train_step.threaded_step_seconds(p.compiled, state, p.batch, iters=self.a.iters,
                                             reps=self.a.reps)
        return {"step_ms": s * 1e3, "tokens_per_s": self.a.batch * self.a.seq / s}

    def loss_curve(self, p: Program) -> list[float]:
        """The losses of ``--steps`` steps from a fresh state on the corpus batches."""
        state = p.trainer.init(self.a.steps)
        data = [jax.device_put(self.batches(i), p.trainer.batch_sharding)
                for i in range(self.a.steps)]
        losses = []
        for batch in data:
            state, metrics = p.compiled(state, batch)
            losses.append(metrics["loss"])
        return [float(x) for x in jax.device_get(losses)]

    # ------------------------------------------------------------------ parts

    def dp(self, name: str, progs: dict) -> None:
        for recipe in self.recipes:
            base = None
            for layout in ("1", "dp"):
                p = progs[(recipe, layout)]
                row = {"model": name, "recipe": recipe, "layout": layout,
                       "devices": 1 if layout == "1" else self.n,
                       "impl": "-" if recipe == "bf16" else self.a.impl,
                       "lower_s": p.lower_s, "compile_s": p.compile_s, **self.time_step(p)}
                if recipe != "bf16" and layout == "1":
                    gemms = train_step.auto_gemm_backends(p.trainer, self.a.batch * self.a.seq)
                    row["kernel_gemms"] = sum(g["gemms"] for g in gemms if g["here"] == "pallas")
                if layout != "1" and self.comm(p):
                    row["bytes_by_op"] = p.comm["bytes_by_op"]
                if layout == "1":
                    base = row
                else:
                    row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
                self.result["dp"].append(row)
                self.log(f"{name} dp {recipe} x{row['devices']}: {row['step_ms']:.2f} ms/step, "
                         f"{row['tokens_per_s']:.0f} tokens/s")

    def fsdp(self, name: str, progs: dict) -> None:
        for recipe in self.recipes:
            if recipe == "bf16":
                continue
            rows = {}
            for layout in ("fsdp_fp4", "fsdp_bf16"):
                p = progs[(recipe, layout)]
                rows[layout] = {"model": name, "recipe": recipe, "devices": self.n,
                                "fp4_gather": LAYOUTS[layout][1],
                                "fp4_gathered": sorted(p.trainer.step.fp4_gathered),
                                "lower_s": p.lower_s, "compile_s": p.compile_s,
                                **self.time_step(p), **(self.comm(p) or {})}
                self.result["fsdp"].append(rows[layout])
                self.log(f"{name} fsdp {recipe} {layout}: {rows[layout]['step_ms']:.2f} ms/step"
                         + (f", all-gathers {fmt_bytes(p.comm['all_gather']['bytes'])}/step/device"
                            if p.comm else ""))
            if not all(progs[(recipe, lay)].comm for lay in rows):
                continue
            fp4, plain = rows["fsdp_fp4"]["all_gather"], rows["fsdp_bf16"]["all_gather"]
            replaced = plain["float_bytes_bf16"] - fp4["float_bytes_bf16"]
            self.result["fsdp_gather"].append({
                "model": name, "recipe": recipe,
                "all_gather_bytes": {"fp4_gather": fp4["bytes"], "bf16_gather": plain["bytes"]},
                "ratio_as_compiled": plain["bytes"] / max(fp4["bytes"], 1),
                "ratio_bf16_basis": plain["bytes_bf16"] / max(fp4["bytes_bf16"], 1),
                "nvfp4_layers": {"fp4_gather": fp4["nvfp4_bytes"], "bf16_gather": replaced,
                                 "ratio": replaced / max(fp4["nvfp4_bytes"], 1)},
                "step_ms": {k: r["step_ms"] for k, r in rows.items()}})

    def curve(self, name: str, progs: dict) -> None:
        steps = self.a.steps
        at = sorted({1, max(1, steps // 4), max(1, steps // 2), steps})
        for recipe in self.recipes:
            layouts = [lay for lay in LAYOUTS if (recipe, lay) in progs]
            curves = {lay: self.loss_curve(progs[(recipe, lay)]) for lay in layouts}
            ref = curves["1"]
            diff = {lay: max(abs(x - y) / abs(y) for x, y in zip(c, ref, strict=True))
                    for lay, c in curves.items() if lay != "1"}
            self.result["curve"].append({
                "model": name, "recipe": recipe, "steps": steps, "curves": curves,
                "max_rel_diff": diff,
                "at": {str(s): {lay: c[s - 1] for lay, c in curves.items()} for s in at}})
            self.log(f"{name} curve {recipe}: max relative loss difference vs 1 device "
                     + ", ".join(f"{lay} {d:.2e}" for lay, d in diff.items()))

    def model(self, name: str, cfg: LlamaConfig) -> None:
        counts = cfg.param_counts()
        self.result["models"][name] = {"config": dataclasses.asdict(cfg), "params": counts}
        self.log(f"{name}: {tl.describe_model(cfg)}, {fmt_params(counts['total'])} parameters")
        parts, keys = self.plan(name, cfg)
        if not parts:
            return
        try:
            progs = self.compile_all(name, cfg, keys)
        except Exception:  # noqa: BLE001 - recorded; the next model may still run
            self.error(f"{name} compile", traceback.format_exc())
            return
        for part in parts:  # a part that fails leaves the others' results
            try:
                getattr(self, part)(name, progs)
            except Exception:  # noqa: BLE001
                self.error(f"{name} {part}", traceback.format_exc())
            self.save()

    def error(self, where: str, tb: str) -> None:
        self.log(f"FAILED {where}:\n{tb}")
        self.result["errors"].append(f"{where}: {tb.strip().splitlines()[-1]}")


def report(result: dict) -> str:
    """The markdown summary of a `main` result: environment and command, then tables."""
    a, n = result["args"], result["devices"]
    lines = [f"{result['device']} x {n}, jax {result['jax']}, {result['date']}",
             f"command: {result['command']}"]
    models = "; ".join(
        f"{k}: dim {m['config']['dim']}, {m['config']['layers']} layers, {m['config']['heads']} "
        f"heads, {fmt_params(m['params']['total'])} params" for k, m in result["models"].items())
    lines.append(f"Llama {models}. Global batch {a['batch']} x seq {a['seq']}, compute "
                 f"{result['compute_dtype']}; the examples' Trainer step, state threaded.")
    if result["dp"]:
        lines += ["", "| model | recipe | devices | impl | compile s | step ms | tokens/s | "
                  "speedup |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in result["dp"]:
            impl = r["impl"] if r["devices"] == 1 or r["impl"] != "auto" else "auto (XLA: mesh)"
            speedup = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
            lines.append(f"| {r['model']} | {r['recipe']} | {r['devices']} | {impl} | "
                         f"{r['lower_s'] + r['compile_s']:.1f} | {r['step_ms']:.2f} | "
                         f"{r['tokens_per_s']:,.0f} | "
                         f"{speedup} |")
    if result["fsdp"]:
        lines += ["", f"FSDP (mesh fsdp={n}): all-gather bytes each device sends per step",
                  "| model | recipe | gather | layers gathered in NVFP4 | all-gathers | BF16 basis "
                  "| NVFP4 codes + scales | step ms | tokens/s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in result["fsdp"]:
            g = r["all_gather"]
            how = "FP4" if r["fp4_gather"] else "XLA (fp4_gather=False)"
            lines.append(f"| {r['model']} | {r['recipe']} | {how}"
                         f" | {len(r['fp4_gathered'])} | {fmt_bytes(g['bytes'])} | "
                         f"{fmt_bytes(g['bytes_bf16'])} | {fmt_bytes(g['nvfp4_bytes'])} | "
                         f"{r['step_ms']:.2f} | {r['tokens_per_s']:,.0f} |")
        for c in result["fsdp_gather"]:
            nv = c["nvfp4_layers"]
            lines.append(f"{c['model']} {c['recipe']}: the FP4 all-gather sends "
                         f"{c['ratio_as_compiled']:.2f}x fewer bytes ({c['ratio_bf16_basis']:.2f}x"
                         f" on a BF16 basis); the NVFP4 layers' {fmt_bytes(nv['fp4_gather'])} "
                         f"replace {fmt_bytes(nv['bf16_gather'])} of BF16 ({nv['ratio']:.2f}x)")
    if result["curve"]:
        at = list(result["curve"][0]["at"])
        lines += ["", f"Loss curves, {result['curve'][0]['steps']} steps, same init, batches "
                  "and seed", "| model | recipe | run | max rel. diff vs 1 device | "
                  + " | ".join(f"loss @{s}" for s in at) + " |",
                  "| --- | --- | --- | --- |" + " --- |" * len(at)]
        for c in result["curve"]:
            for lay in c["curves"]:
                d = c["max_rel_diff"].get(lay)
                run = "1 device" if lay == "1" else f"{lay} x{n}"
                lines.append(f"| {c['model']} | {c['recipe']} | {run} | "
                             f"{'-' if d is None else f'{d:.2e}'} | "
                             + " | ".join(f"{c['at'][s][lay]:.4f}" for s in at) + " |")
    lines += [f"skipped: {s}" for s in result["skipped"]]
    lines += [f"failed: {e}" for e in result["errors"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"from {PARTS}, comma-separated")
    p.add_argument("--models", default="default,wide",
                   help=f"from {sorted(MODELS)} or DIM:LAYERS, comma-separated, run in order")
    p.add_argument("--recipes", default="bf16,nvfp4",
                   help="dp and curve: these; fsdp: the NVFP4 ones")
    p.add_argument("--impl", default="auto", help="the NVFP4 layers' implementation")
    p.add_argument("--keep", action="append", default=[], metavar="REGEX",
                   help="keep matching module paths in BF16 (repeatable)")
    p.add_argument("--batch", type=int, default=64, help="global batch (sequences)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=50, help="steps of the loss curves")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="compute dtype; auto: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--iters", type=int, default=5, help="samples (time_fn iters)")
    p.add_argument("--reps", type=int, default=4, help="steps per sample (time_fn reps)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="skip the parts whose estimate does not fit the seconds left")
    p.add_argument("--compile-workers", type=int, default=1,
                   help="compile this many programs at once (threads)")
    p.add_argument("--guess-bf16-s", type=float, default=14.0,
                   help="compile-time guess for a BF16 step of compare.py's model (4 layers)")
    p.add_argument("--guess-nvfp4-s", type=float, default=100.0,
                   help="compile-time guess for an NVFP4 step of compare.py's model")
    p.add_argument("--data", default=None,
                   help="a text tree to train on (default: this interpreter's Python sources)")
    p.add_argument("--out", default=None, help="JSON results, rewritten after every part")
    a = p.parse_args(argv)
    command = "python " + " ".join([os.path.relpath(__file__)]
                                   + (sys.argv[1:] if argv is None else list(argv)))
    run = Run(a, command)
    if run.n == 1:
        run.log("one device: the n-device programs run on a mesh of 1")
    try:
        for name, cfg in run.models.items():
            run.model(name, cfg)
    except KeyboardInterrupt:  # e.g. `timeout -s INT`: keep and report what was measured
        run.error("interrupted", "KeyboardInterrupt")
    run.save()
    print(report(run.result), flush=True)
    return run.result


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)
