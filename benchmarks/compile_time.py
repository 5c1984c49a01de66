"""Compile time and program size: the example's train step (BF16 vs NVFP4) and fp4jax alone.

    PYTHONPATH=. python benchmarks/compile_time.py --out /tmp/compile.json          # all cases
    PYTHONPATH=. python benchmarks/compile_time.py --cases quantize_1d_rne,dot_general_fwd_bwd
    PYTHONPATH=. python benchmarks/compile_time.py --cases step_nvfp4_xla \\
        --dump /tmp/xla_dump                                 # + XLA's per-pass HLO dumps

Every case runs in its own Python process, so no trace or compilation cache is shared
between cases (each pays its full ``lower()`` and ``compile()``), and ``--dump`` sets
``XLA_FLAGS`` for that process only. Times: ``jax.jit(f).lower(...)`` (tracing and
lowering to StableHLO) and ``.compile()`` (XLA), separately. Sizes: the
unoptimized HLO that XLA's passes work on (calls inlined), and of the optimized HLO the
instructions (all computations), fusions and while loops. On a shared machine the wall
times vary with load: ``--repeats`` keeps each case's fastest run, and the CPU time of
``compile()`` (all threads) is printed beside it.

Cases:

* ``step_bf16``, ``step_nvfp4_xla``, ``step_nvfp4_auto``: `examples/compare.py`'s
  default model and step (Llama dim 768, 4 layers, 12 heads, batch 64 × seq 512, the
  example's `Trainer`: paper policy, warmup-cosine AdamW, clipping, donation), compute
  dtype bfloat16 on GPU, float32 on CPU as compare.py picks it.
* ``quantize_1d_rne``, ``quantize_2d``, ``quantize_rht_sr``: ``jax.jit(fp4jax.quantize)``
  of a 4096×4096 bfloat16 tensor (1D blocks RNE; 16×16 tiles; columnwise RHT with
  stochastic rounding), ``impl="xla"`` (``--impl``: another).
* ``dot_general_fwd_bwd``: ``jax.jit`` of one `fp4jax.dot_general`'s forward and VJP
  (`Recipe.nvfp4`, (32768, 768) × (768, 2048) bfloat16, ``impl="xla"`` or ``--impl``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEP_CASES = ("step_bf16", "step_nvfp4_xla", "step_nvfp4_auto")
OP_CASES = ("quantize_1d_rne", "quantize_2d", "quantize_rht_sr", "dot_general_fwd_bwd")
CASES = STEP_CASES + OP_CASES

_INSTR = re.compile(r"^\s+(ROOT\s+)?%?[\w.\-]+\s*=\s.*?\s([a-z][\w\-]*)\(", re.M)
_STABLEHLO_OP = re.compile(r"\b(stablehlo|chlo|func\.call|mhlo|sdy)\.?[\w.]*", re.M)


def hlo_stats(hlo_text: str) -> dict[str, int]:
    r"""Counts of XLA HLO text: instructions (every computation), fusions, whiles, computations.

    Example:
      >>> t = "ENTRY %main {\n  %a = f32[] parameter(0)\n  ROOT %f = f32[] fusion(%a)\n}"
      >>> hlo_stats(t)["instructions"], hlo_stats(t)["fusions"]
      (2, 1)
    """
    ops = [m.group(2) for m in _INSTR.finditer(hlo_text)]
    comps = sum(1 for line in hlo_text.splitlines()
                if line and not line[0].isspace() and line.rstrip().endswith("{")
                and not line.startswith("HloModule"))
    return {
        "instructions": len(ops),
        "fusions": ops.count("fusion"),
        "whiles": ops.count("while"),
        "computations": comps,
        "custom_calls": ops.count("custom-call"),
        "divides": ops.count("divide"),
    }


def fusion_sizes(hlo_text: str) -> list[tuple[int, int]]:
    r"""(output elements, instructions) of every fused computation in optimized HLO text.

    Example:
      >>> t = "%fused_computation (p: f32[8,4]) -> f32[8,4] {\n  %p = f32[8,4] parameter(0)\n"
      >>> fusion_sizes(t + "  ROOT %n = f32[8,4] negate(%p)\n}")
      [(32, 2)]
    """
    out = []
    for block in re.split(r"\n(?=\S)", hlo_text):
        head = block.split("\n", 1)[0]
        m = re.match(r"%?fused_computation[\w.\-]*\s.*->\s*\(?\w+\[([\d,]*)\]", head)
        if m:
            dims = [int(d) for d in m.group(1).split(",") if d]
            out.append((math.prod(dims), len(_INSTR.findall(block))))
    return out


def inlined_count(hlo_text: str, counts: Callable[[str], bool]) -> int:
    r"""Lines of an HLO module's text that ``counts`` selects, with every ``call`` inlined
    (a computation called from several places counts once per call site).

    Example:
      >>> t = ("f {\n  p = f32[] parameter(0)\n  ROOT n = f32[] negate(p)\n}\n"
      ...      "ENTRY main {\n  a = f32[] parameter(0)\n  b = f32[] call(a), to_apply=f\n"
      ...      "  ROOT c = f32[] call(b), to_apply=f\n}")
      >>> inlined_count(t, lambda line: "negate(" in line)
      2
    """
    comps: dict[str, tuple[int, list[str]]] = {}
    entry = name = None
    for line in hlo_text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            if line.startswith("HloModule"):
                continue
            words = line.split()
            name = (words[1] if words[0] == "ENTRY" else words[0]).lstrip("%")
            entry = name if words[0] == "ENTRY" else entry
            comps[name] = (0, [])
        elif name is not None:
            n, calls = comps[name]
            m = re.search(r"\scall\(.*to_apply=%?([\w.\-]+)", line)
            comps[name] = (n + bool(counts(line)), calls + [m.group(1)] if m else calls)
    memo: dict[str, int] = {}

    def count(c: str) -> int:
        if c not in memo:
            n, calls = comps[c]
            memo[c] = n + sum(count(x) for x in calls)
        return memo[c]

    return count(entry) if entry else 0


def inlined_size(hlo_text: str) -> int:
    r"""Instructions of an unoptimized HLO module with every ``call`` inlined: what XLA's
    passes work on (a function jitted inside the program counts once per call site).

    Example:
      >>> t = ("f {\n  p = f32[] parameter(0)\n  ROOT n = f32[] negate(p)\n}\n"
      ...      "ENTRY main {\n  a = f32[] parameter(0)\n  b = f32[] call(a), to_apply=f\n"
      ...      "  ROOT c = f32[] call(b), to_apply=f\n}")
      >>> inlined_size(t)
      7
    """
    return inlined_count(hlo_text, _INSTR.match)


_MOSAIC_CALL = re.compile(r"custom_call @mosaic_gpu_v2\(")
_KERNEL_HASH = re.compile(r'kernel_hash = "((?:[^"\\]|\\.)*)"')


def mosaic_kernels(mlir_text: str) -> tuple[int, int]:
    r"""(Mosaic GPU custom calls, kernel lowerings) of a lowered module's text. Each
    lowering serializes a kernel module of its own, so distinct ``kernel_hash`` values
    count lowerings; a function called from several places holds its calls once.

    Example:
      >>> mosaic_kernels('custom_call @mosaic_gpu_v2(%0) {kernel_hash = "ab"}\n'
      ...                'custom_call @mosaic_gpu_v2(%1) {kernel_hash = "ab"}\n')
      (2, 1)
    """
    return len(_MOSAIC_CALL.findall(mlir_text)), len(set(_KERNEL_HASH.findall(mlir_text)))


def stablehlo_ops(mlir_text: str) -> int:
    """Operations in a lowered module's StableHLO text (lines that define or run an op)."""
    n = 0
    for line in mlir_text.splitlines():
        s = line.strip()
        if (" = stablehlo." in s or " = chlo." in s or " = call " in s or " = func.call" in s
                or s.startswith(("stablehlo.", "func.call", "call ", "sdy."))
                or " = sdy." in s):
            n += 1
    return n


def _step_case(name: str, layers: int | None = None):
    """(lower function, args, info) of compare.py's default train step (``layers``: the
    model's depth instead of compare.py's default)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import compare  # noqa: PLC0415
    import jax  # noqa: PLC0415
    import train_llama as tl  # noqa: PLC0415
    from llama import LlamaConfig  # noqa: PLC0415

    a = compare.parse_args([] if layers is None else ["--layers", str(layers)])
    recipe = "bf16" if name == "step_bf16" else "nvfp4"
    impl = name.rsplit("_", 1)[-1] if recipe != "bf16" else "xla"
    model_cfg = LlamaConfig(dim=a.dim, layers=a.layers, heads=a.heads,
                            dtype=tl.compute_dtype(a.dtype))
    cfg = tl.RunConfig(recipe=recipe, batch=a.batch, seq=a.seq, lr=a.lr, seed=a.seed,
                       eval_batches=a.eval_batches, impl=impl)
    trainer = tl.Trainer(model_cfg, cfg, total_steps=a.steps)
    state = trainer.init(a.steps)
    tok = jax.ShapeDtypeStruct((a.batch, a.seq), jax.numpy.int32)
    info = {"model": f"Llama dim={a.dim} layers={a.layers} heads={a.heads}, batch {a.batch} x "
                     f"seq {a.seq}, compute {model_cfg.dtype}", "impl": impl}
    return (lambda s, b: trainer.step.jitted.lower(s, b, mode="recipe")), (state, (tok, tok)), info


def _op_case(name: str, impl: str = "xla"):
    """(lower function, args) of one fp4jax operation alone."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    import fp4jax  # noqa: PLC0415

    key = jax.random.key(0)
    if name.startswith("quantize"):
        x = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
        kw = {"quantize_1d_rne": {},
              "quantize_2d": {"block_2d": True},
              "quantize_rht_sr": {"axis": 0, "hadamard": True, "rounding": "stochastic"}}[name]

        def f(x, key):
            q = fp4jax.quantize(x, key=key if "rounding" in kw else None, impl=impl, **kw)
            return q.data, q.scales, q.amax

        return jax.jit(f).lower, (x, key), {"shape": "4096x4096 bfloat16", "impl": impl, **kw}
    dn = (((1,), (0,)), ((), ()))
    x = jax.ShapeDtypeStruct((32768, 768), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((768, 2048), jnp.bfloat16)

    def g(x, w, ct, key):
        y, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, dn, key=key, impl=impl), x, w)
        return y, *vjp(ct)

    ct = jax.ShapeDtypeStruct((32768, 2048), jnp.bfloat16)
    return jax.jit(g).lower, (x, w, ct, key), {"shape": "(32768, 768) x (768, 2048) bfloat16",
                                               "impl": impl}


def run_case(name: str, dump: str | None = None, layers: int | None = None,
             impl: str = "xla") -> dict[str, Any]:
    """Lowers and compiles one case in this process; returns times and sizes."""
    import jax  # noqa: PLC0415

    lower, args, info = _step_case(name, layers) if name in STEP_CASES else _op_case(name, impl)
    t0, c0 = time.perf_counter(), time.process_time()
    lowered = lower(*args)
    t1, c1 = time.perf_counter(), time.process_time()
    print(_COMPILE_MARK, file=sys.stderr, flush=True)  # XLA's logs after it are this compile's
    compiled = lowered.compile()
    t2, c2 = time.perf_counter(), time.process_time()
    row = {"case": name, **info, "lower_s": t1 - t0, "compile_s": t2 - t1,
           "lower_cpu_s": c1 - c0, "compile_cpu_s": c2 - c1,
           "hlo_before_opt": inlined_size(lowered.as_text(dialect="hlo")),
           "stablehlo_ops": stablehlo_ops(lowered.as_text()),
           **{f"hlo_{k}": v for k, v in hlo_stats(compiled.as_text()).items()}}
    if dump:
        row["dump"] = dump
    row["backend"] = jax.default_backend()
    return row


_COMPILE_MARK = "=== compile_time.py: compile() starts ==="
_TIMER = re.compile(r"\] (.+?) time: ([\d.]+) (us|ms|s|min)\b")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}


def pass_times(log: str, top: int = 20) -> dict[str, dict[str, float]]:
    r"""Seconds per XLA pass and per other timed phase, from XLA's verbose log of one
    ``compile()`` (``--log-passes``). Pipelines appear beside the passes they contain.

    Example:
      >>> log = ("x.cc:1] HLO pass: algsimp time: 2.5 ms (2500 us)\n"
      ...        "x.cc:1] HLO pass: algsimp time: 1.5 ms (1500 us)\n")
      >>> pass_times(log)["passes"]
      {'algsimp': 0.004}
    """
    passes: dict[str, float] = {}
    other: dict[str, float] = {}
    for m in _TIMER.finditer(log.split(_COMPILE_MARK)[-1]):
        label, seconds = m.group(1), float(m.group(2)) * _UNIT[m.group(3)]
        if label.startswith("HLO pass: "):
            label = label[len("HLO pass: "):]
            passes[label] = passes.get(label, 0.0) + seconds
        else:
            other[label] = other.get(label, 0.0) + seconds
    best = lambda d: dict(sorted(d.items(), key=lambda kv: -kv[1])[:top])  # noqa: E731
    return {"passes": best(passes), "other": best(other)}


def _in_subprocess(name: str, a: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    flags = [env.get("XLA_FLAGS", ""), a.xla_flags or ""]
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
        flags.append(f"--xla_dump_to={os.path.join(a.dump, name)} --xla_dump_hlo_pass_re=.* "
                     "--xla_dump_hlo_as_text")
    if any(flags):
        env["XLA_FLAGS"] = " ".join(f for f in flags if f)
    if a.log_passes:
        env["TF_CPP_MIN_LOG_LEVEL"] = "0"
        env["TF_CPP_VMODULE"] = "hlo_pass_pipeline=1,cpu_compiler=1,gpu_compiler=1"
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name]
                         + (["--dump", a.dump] if a.dump else [])
                         + (["--layers", str(a.layers)] if a.layers else [])
                         + ["--impl", a.impl],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"case {name} failed:\n{out.stderr[-4000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if a.log_passes:
        row["log"] = pass_times(out.stderr)
    if a.xla_flags:
        row["xla_flags"] = a.xla_flags
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table; the step cases also as a multiple of the BF16 step's lower + compile."""
    base = next((r for r in rows if r["case"] == "step_bf16"), None)
    lines = ["| case | lower s | compile s | compile CPU s | × BF16 step | HLO before opt | "
             "HLO after opt | fusions | whiles |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ratio = ""
        if base is not None and r["case"].startswith("step"):
            ratio = f"{(r['lower_s'] + r['compile_s']) / (base['lower_s'] + base['compile_s']):.1f}"
        name = r["case"]
        if not name.startswith("step") and r.get("impl", "xla") != "xla":
            name += f" ({r['impl']})"
        lines.append(f"| {name} | {r['lower_s']:.2f} | {r['compile_s']:.2f} | "
                     f"{r['compile_cpu_s']:.2f} | {ratio} | {r['hlo_before_opt']} | "
                     f"{r['hlo_instructions']} | {r['hlo_fusions']} | {r['hlo_whiles']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {CASES}")
    p.add_argument("--dump", default=None,
                   help="directory for XLA's per-pass HLO dumps (one subdirectory per case)")
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--repeats", type=int, default=1,
                   help="run each case this many times (fresh processes); keep the fastest")
    p.add_argument("--layers", type=int, default=None,
                   help="the step cases' model depth (default: compare.py's, 4)")
    p.add_argument("--impl", default="xla",
                   help="fp4jax impl of the quantize and dot_general cases (xla, auto, pallas)")
    p.add_argument("--log-passes", action="store_true",
                   help="time XLA's passes from its verbose log (slows compilation down)")
    p.add_argument("--xla-flags", default=None,
                   help="extra XLA_FLAGS for the cases' processes, e.g. --xla_gpu_autotune_level=0")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one case, JSON out
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(run_case(a.one, a.dump, a.layers, a.impl)))
        return {}
    names = [c for c in a.cases.split(",") if c]
    bad = [c for c in names if c not in CASES]
    if bad:
        raise SystemExit(f"unknown cases {bad}; choose from {CASES}")
    sys.path.insert(0, ROOT)
    from pallas_kernels import timing  # noqa: PLC0415

    rows = []
    for n in names:
        runs = [_in_subprocess(n, a) for _ in range(a.repeats)]
        rows.append(min(runs, key=lambda r: r["lower_s"] + r["compile_s"]))
        r = rows[-1]
        print(f"{n}: lower {r['lower_s']:.2f}s, compile {r['compile_s']:.2f}s, "
              f"{r['hlo_instructions']} HLO instructions", flush=True)
    result = {**timing.environment(), "rows": rows, "table": table(rows)}
    print(f"\n{result['device']} ({result['platform']}), jax {result['jax']}, {result['date']}")
    print(result["table"])
    for r in rows:
        if "log" in r:
            print(f"\n{r['case']}: XLA passes (s): " + ", ".join(
                f"{k} {v:.2f}" for k, v in list(r["log"]["passes"].items())[:12]))
            print(f"{r['case']}: other phases (s): " + ", ".join(
                f"{k} {v:.2f}" for k, v in list(r["log"]["other"].items())[:6]))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
