"""Compile time and step time of the examples' jitted train step, BF16 vs NVFP4.

    PYTHONPATH=. python benchmarks/train_step.py --out /tmp/step.json                  # GPU
    PYTHONPATH=. python benchmarks/train_step.py --dim 2048 --out /tmp/step_2048.json  # wider
    PYTHONPATH=. python benchmarks/train_step.py --dim 128 --layers 2 --heads 2 \\
        --batch 4 --seq 64                                                             # CPU smoke

The step is the one the examples train with and `train_loop.py` measures: a
`train_llama.Trainer`'s (its AdamW with the warmup-cosine schedule, clipping, the
precision schedule, ``donate=True``), on a batch of the training corpus already on
the device. It is compiled with ``.lower().compile()``, then timed by
`threaded_step_seconds`: the donated state is threaded from call to call, as in a
training loop with no host work.

``--embed gather,onehot --tokens corpus,random`` measures the embedding lookups of
`llama.LlamaConfig.embed_lookup` on corpus and on uniformly random tokens (one
compilation per recipe and lookup); the gather's backward, an atomic scatter-add,
depends on how often tokens repeat, the one-hot GEMM does not.

For each NVFP4 recipe it prints the policy report (which layers are NVFP4; the
embedding, norms, attention products and output head stay BF16) and where each
quantized GEMM of the step runs (`auto_gemm_backends`): ``impl="auto"`` picks the
Pallas kernel or the XLA path per (layout, M, N, K) from the measured table
`fp4jax.gemm_table`, so the NVFP4 step time depends on those choices as much as on
the policy. ``--impls xla,auto`` measures both side by side.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
import time
from collections.abc import Callable

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import data as data_lib  # noqa: E402
import train_llama as tl  # noqa: E402
from llama import LlamaConfig  # noqa: E402

from benchmarks import gemm_auto_table, trace_summary  # noqa: E402
from fp4jax import implementation  # noqa: E402
from fp4jax.flax.nnx import matmul_layers  # noqa: E402
from fp4jax.reference import gemm as gemm_lib  # noqa: E402
from fp4jax.reference import quantization  # noqa: E402
from pallas_kernels import gemm, gemm_config, gemm_data, timing  # noqa: E402

TOKENS = ("corpus", "random")


def threaded_step_seconds(step_fn: Callable, state, batch, *, iters: int, reps: int) -> float:
    """Median seconds per call of ``state, _ = step_fn(state, batch)``, the state threaded.

    Every call takes the state the previous one returned (a donating step invalidates
    its input), so the calls run back to back on the device like a training loop's
    steps with no host work in between; `pallas_kernels.timing.time_fn` synchronizes
    once per ``reps`` calls.
    """
    cell = [state]

    def one_step():
        cell[0], _ = step_fn(cell[0], batch)
        return cell[0]

    return timing.time_fn(one_step, [()], warmup=2, iters=iters, reps=reps)


def auto_gemm_backends(trainer: tl.Trainer, tokens: int) -> list[dict]:
    """Where the NVFP4 GEMMs of one training step run: one row per (layout, M, N, K).

    Each quantized ``nnx.Linear`` (``d_in → d_out``) of ``trainer`` contributes the GEMMs
    its recipe quantizes, with the operand layouts `fp4jax.dot_general` builds (those
    `benchmarks.gemm_auto_table` measures): fprop ``(tokens, d_out, d_in)``, dgrad
    ``(tokens, d_in, d_out)``, wgrad ``(d_in, d_out, tokens)`` as (M, N, K). A row gives
    ``gemms`` (how many per step), ``sm90``: what ``impl="auto"`` runs on an H200 (the
    table's verdict, where the kernel takes the operands), ``here``: what the trainer's
    ``impl`` runs on this device, and ``kernel_ctas``: the Pallas kernel's grid (CTA
    tiles × K splits of its default tuning), to compare with the GPU's SM count.
    """
    if trainer.report is None:
        return []
    recipes = {d.path: d.recipe for d in trainer.report.decisions}
    counts: collections.Counter = collections.Counter()
    for path, layer in matmul_layers(trainer.model):
        recipe = recipes.get(path)
        if path not in trainer.report.quantized or not hasattr(layer, "in_features"):
            continue
        d_in, d_out = layer.in_features, layer.out_features
        for layout, operand in (("fprop", recipe.fprop_lhs), ("dgrad", recipe.dgrad_grad),
                                ("wgrad", recipe.wgrad_lhs)):
            if operand.quantized:
                counts[(layout, d_in, d_out)] += 1
    rows = []
    for (layout, d_in, d_out), n in counts.items():
        meta = []

        def abstract(layout=layout, d_in=d_in, d_out=d_out, meta=meta):
            lhs, rhs, mnk = gemm_auto_table.operands(layout, tokens, d_in, d_out, 0)
            lhs, rhs, kw = gemm_data.views(layout, lhs, rhs)
            meta.append((kw.get("lhs_from_mT", False), mnk))
            return lhs, rhs

        lhs, rhs = jax.eval_shape(abstract)
        from_mt, (m, n_, k) = meta[0]
        prefers = implementation.auto_prefers_gemm_kernel(m, n_, k, layout)
        reason = gemm.supports(lhs, rhs, lhs_from_mT=from_mt)
        here = implementation.choose(trainer.cfg.impl, gemm=True, kernel_reason=lambda r=reason: r,
                                     auto_prefers_kernel=prefers)
        c = gemm_config.default_config(m, n_, k)
        rows.append({"layout": layout, "m": m, "n": n_, "k": k, "gemms": n,
                     "sm90": "pallas" if prefers and reason is None else "xla", "here": here,
                     "kernel_ctas": -(-m // c.cta_tile_m) * (n_ // c.cta_tile_n) * c.k_splits})
    return rows


def describe_nvfp4(trainer: tl.Trainer, gemms: list[dict]) -> str:
    """The policy report and the GEMM backend table of `auto_gemm_backends`."""
    sms = getattr(jax.devices()[0], "core_count", None)
    lines = [f"[{trainer.cfg.recipe}, impl={trainer.cfg.impl}] policy "
             "(the embedding lookup, norms and attention products are no matmul layers: BF16):",
             str(trainer.report),
             f"NVFP4 GEMMs of one step (sm90: impl='auto' on an H200, from fp4jax.gemm_table; "
             f"here: on {jax.devices()[0].device_kind}"
             + (f", {sms} SMs" if sms else "") + "):",
             "| layout | M | N | K | GEMMs | sm90 | here | kernel CTAs |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {g['layout']} | {g['m']} | {g['n']} | {g['k']} | {g['gemms']} | {g['sm90']} | "
              f"{g['here']} | {g['kernel_ctas']} |" for g in gemms]
    return "\n".join(lines)


def decode_columns_by_transpose() -> None:
    """Makes the XLA GEMM decode column-packed operands through the ``.mT`` view (a
    transpose fused into the decode) instead of as uint32 column pairs.

    A benchmark switch (the library picks the pairs form on one device): the two
    decode the same values, so only the step time can differ.
    """
    def through_transpose(q, column_pairs=False):
        del column_pairs
        return quantization.scaled_codes_bf16(q, column_pairs=False)

    gemm_lib.scaled_codes_bf16 = through_transpose


def default_heads(dim: int) -> int:
    """Heads of width 64 (dim 768: 12, as in compare.py; dim 2048: 32)."""
    return max(dim // 64, 1)


def add_model_arguments(p: argparse.ArgumentParser, *, dtypes: tuple[str, ...] = (
        "auto", "bfloat16", "float32")) -> None:
    """The benchmarks' model and batch options: ``--dim --layers --heads --batch --seq
    --dtype`` (the first of ``dtypes`` is the default; ``auto``: bfloat16 on GPU, float32
    on CPU)."""
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=None, help="default: dim // 64")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dtype", default=dtypes[0], choices=list(dtypes), help="compute dtype" + (
        "; auto: bfloat16 on GPU, float32 on CPU" if "auto" in dtypes else ""))


def run_config(recipe: str, *, batch: int, seq: int, **kw) -> tl.RunConfig:
    """The run settings both benchmarks use (compare.py's optimizer and clipping)."""
    return tl.RunConfig(**{"recipe": recipe, "batch": batch, "seq": seq, "lr": 1.5e-3,
                           "eval_batches": 1, "eval_bf16_forward": False, **kw})


def token_batch(kind: str, batches: data_lib.Batches, vocab: int) -> tuple:
    """The timed batch on the device: the corpus's first batch, or uniform random tokens."""
    if kind == "corpus":
        return jax.device_put(batches(0))
    rng = np.random.default_rng(0)
    w = rng.integers(0, vocab, (batches.batch, batches.seq + 1)).astype(np.int32)
    return jax.device_put((w[:, :-1], w[:, 1:]))


def trace_kinds(step_fn: Callable, state, batch, trace_dir: str, steps: int = 3) -> dict:
    """Device ms per step by kind of op (`trace_summary.by_kind`) and the top ops."""
    state, _ = step_fn(state, batch)  # warm: the traced steps run compiled code only
    jax.block_until_ready(state)
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(steps):
            state, _ = step_fn(state, batch)
        jax.block_until_ready(state)
    ops = trace_summary.summarize(trace_dir)
    kinds = trace_summary.by_kind(ops)
    return {"kinds_ms_per_step": {k: ms / steps for k, (ms, _) in kinds.items()},
            "kernels_per_step": {k: c / steps for k, (_, c) in kinds.items()},
            "top_ops": [(n, ms / steps, c / steps) for n, ms, c in ops[:60]]}


def measure(model_cfg: LlamaConfig, cfg: tl.RunConfig, data: dict[str, tuple], *,
            iters: int, reps: int, trace_dir: str | None = None,
            hlo_dir: str | None = None) -> list[dict]:
    """One recipe and lookup: compile once, then time the step on each batch of ``data``.

    With ``trace_dir`` it also traces a few steps on the first batch (`trace_kinds`).
    """
    trainer = tl.Trainer(model_cfg, cfg, 1)
    steps = 2 + iters * reps
    first = next(iter(data.values()))
    t0 = time.perf_counter()
    compiled = trainer.step.jitted.lower(trainer.init(steps), first, mode="recipe").compile()
    compile_s = time.perf_counter() - t0
    nvfp4 = {}
    if trainer.report is not None:
        gemms = auto_gemm_backends(trainer, cfg.batch * cfg.seq)
        print(describe_nvfp4(trainer, gemms), flush=True)
        nvfp4 = {"quantized_layers": list(trainer.report.quantized),
                 "high_precision_layers": list(trainer.report.high_precision),
                 "gemms": gemms,
                 "kernel_gemms": sum(g["gemms"] for g in gemms if g["here"] == "pallas")}
    if hlo_dir:  # the optimized program, to look up the fusions the trace names
        os.makedirs(hlo_dir, exist_ok=True)
        path = os.path.join(hlo_dir, f"{cfg.recipe}_{cfg.impl}_{model_cfg.embed_lookup}.hlo.gz")
        with gzip.open(path, "wt") as f:
            f.write(compiled.as_text())
    traced = {}
    if trace_dir:
        name = f"{cfg.recipe}_{cfg.impl}_{model_cfg.embed_lookup}"
        traced = {"trace": trace_kinds(compiled, trainer.init(steps), first,
                                       os.path.join(trace_dir, name))}
    rows = []
    for kind, batch in data.items():
        step_s = threaded_step_seconds(compiled, trainer.init(steps), batch, iters=iters,
                                       reps=reps)
        rows.append({"recipe": cfg.recipe, "impl": cfg.impl if cfg.recipe != "bf16" else "-",
                     "embed": model_cfg.embed_lookup, "tokens": kind, "compile_s": compile_s,
                     "step_ms": step_s * 1e3, **nvfp4, **traced})
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--recipes", default="bf16,nvfp4")
    p.add_argument("--impls", default="auto", help="NVFP4 implementations, comma-separated")
    p.add_argument("--keep-last", type=int, default=0,
                   help="NVFP4 recipes: blocks kept in BF16 at the end (the paper's recipe "
                        "keeps ~15%%: 1 of 4); 0: every block NVFP4")
    p.add_argument("--embed", default="onehot",
                   help="embedding lookups (LlamaConfig.embed_lookup), comma-separated")
    p.add_argument("--tokens", default="corpus", help=f"timed batches from {TOKENS}")
    p.add_argument("--iters", type=int, default=5, help="samples (time_fn iters)")
    p.add_argument("--reps", type=int, default=4, help="steps per sample (time_fn reps)")
    p.add_argument("--data", default=None,
                   help="a text tree to train on (default: this interpreter's Python sources)")
    p.add_argument("--out", default=None)
    p.add_argument("--trace", default=None,
                   help="also trace 3 steps per recipe here and print device time by kind")
    p.add_argument("--hlo", default=None,
                   help="also write each step's optimized HLO here (gzipped text)")
    p.add_argument("--column-decode", default="pairs", choices=["pairs", "transpose"],
                   help="how the XLA GEMM decodes column-packed operands (see "
                        "decode_columns_by_transpose)")
    a = p.parse_args(argv)
    if a.column_decode == "transpose":
        decode_columns_by_transpose()
    a.heads = a.heads or default_heads(a.dim)
    kinds = a.tokens.split(",")
    if not set(kinds) <= set(TOKENS):
        raise ValueError(f"--tokens must be from {TOKENS}, got {a.tokens!r}")
    corpus = data_lib.load_corpus([a.data] if a.data else None, suffix=None if a.data else ".py")
    batches = data_lib.Batches(corpus.train, batch=a.batch, seq=a.seq, seed=0)
    rows = []
    for embed in a.embed.split(","):
        model_cfg = LlamaConfig(dim=a.dim, layers=a.layers, heads=a.heads,
                                dtype=tl.compute_dtype(a.dtype), embed_lookup=embed)
        data = {k: token_batch(k, batches, model_cfg.vocab) for k in kinds}
        for recipe in a.recipes.split(","):
            for impl in (a.impls.split(",") if recipe != "bf16" else ["auto"]):
                cfg = run_config(recipe, batch=a.batch, seq=a.seq, impl=impl,
                                 keep_last=a.keep_last if recipe != "bf16" else 0)
                rows += measure(model_cfg, cfg, data, iters=a.iters, reps=a.reps,
                                trace_dir=a.trace, hlo_dir=a.hlo)
    for r in rows:  # against BF16 with the same lookup and tokens
        base = next((b for b in rows if b["recipe"] == "bf16" and b["embed"] == r["embed"]
                     and b["tokens"] == r["tokens"]), rows[0])
        r["step_ratio"] = r["step_ms"] / base["step_ms"]
        r["compile_ratio"] = r["compile_s"] / base["compile_s"]
    command = "python " + " ".join([os.path.relpath(__file__)]
                                   + (sys.argv[1:] if argv is None else list(argv)))
    result = {**timing.environment(), "command": command, "model": vars(a),
              "compute_dtype": tl.compute_dtype(a.dtype), "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{result['device']}, jax {result['jax']}, {result['date']}")
    print(f"command: {command}")
    print(f"Llama dim={a.dim} layers={a.layers} heads={a.heads}, batch {a.batch} x seq {a.seq}, "
          f"compute {result['compute_dtype']}; the examples' Trainer step, state threaded")
    print("| recipe | impl | embed | tokens | NVFP4 layers | kernel GEMMs | compile s | x BF16 "
          "| step ms | x BF16 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        layers = len(r.get("quantized_layers", []))
        total = layers + len(r.get("high_precision_layers", []))
        print(f"| {r['recipe']} | {r['impl']} | {r['embed']} | {r['tokens']} | "
              f"{f'{layers} of {total}' if total else '-'} | {r.get('kernel_gemms', '-')} | "
              f"{r['compile_s']:.1f} | {r['compile_ratio']:.2f} | {r['step_ms']:.2f} | "
              f"{r['step_ratio']:.2f} |")
    traced = [r for r in rows if "trace" in r]
    if traced:
        print("\nDevice ms per step by kind of op (jax.profiler trace of 3 steps, first batch):")
        print("| kind | " + " | ".join(f"{r['recipe']} {r['impl']}" for r in traced) + " |")
        print("| --- |" + " --- |" * len(traced))
        for kind, _ in trace_summary.KINDS:
            print(f"| {kind} | " + " | ".join(
                f"{r['trace']['kinds_ms_per_step'][kind]:.2f} "
                f"({r['trace']['kernels_per_step'][kind]:.0f})" for r in traced) + " |")
        print("| all device ops | " + " | ".join(
            f"{sum(r['trace']['kinds_ms_per_step'].values()):.2f}" for r in traced) + " |")
        for r in traced:
            print(f"\ntop ops, {r['recipe']} {r['impl']} (ms per step, calls per step):")
            for n, ms, c in r["trace"]["top_ops"][:25]:
                print(f"  {ms:8.3f}  {c:5.1f}x  {n[:90]}")
    return result


if __name__ == "__main__":
    main()
