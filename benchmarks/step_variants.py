"""Diagnosis of the NVFP4 step time: the examples' Trainer step vs the earlier benchmark's
build, and ``impl="auto"``'s GEMM choices from the measured table vs the earlier rule.

    PYTHONPATH=. python benchmarks/step_variants.py \\
        trainer/nvfp4/table trainer/nvfp4/m64 old/nvfp4/m64 trainer/bf16/table      # GPU
    PYTHONPATH=. python benchmarks/step_variants.py --small trainer/nvfp4/table     # CPU smoke

A variant is ``BUILD/RECIPE/RULE``:

* BUILD ``trainer``: `benchmarks.train_step`'s step (the examples' `train_llama.Trainer`:
  its optimizer, schedule, donation, one-hot embedding), timed with the state threaded,
  on a corpus batch; ``old``: the build of ``benchmarks/train_step.py`` before it timed
  the Trainer (``paper_policy`` + ``nnx.quantize`` + ``optax.adamw(1e-3)`` +
  ``TrainStep(max_grad_norm=1.0)``, gather embedding), timed on the same undonated
  state every call, on uniformly random tokens.
* RULE ``table``: ``impl="auto"`` as it is (`fp4jax.implementation.auto_prefers_gemm_kernel`
  reads `fp4jax.gemm_table`); ``m64``: the rule before the table (the kernel for M ≤ 64
  only). The quantization kernels are the same under both rules: only GEMM choices differ.

Each variant prints its compile time, its step time and the rule's verdict for each GEMM
shape traced (layout, M, N, K, verdict; distinct shapes, not calls). On an H200 the verdict
is the backend where the kernel takes the shape; elsewhere ``auto`` runs XLA regardless.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import jax
import optax
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import train_llama as tl  # noqa: E402
from llama import Llama, LlamaConfig, loss_and_metrics  # noqa: E402

import fp4jax  # noqa: E402
from benchmarks import train_step as ts  # noqa: E402
from fp4jax import implementation  # noqa: E402
from fp4jax import train as train_lib  # noqa: E402

TABLE_RULE = implementation.auto_prefers_gemm_kernel


def m64_rule(m: int, n: int, k: int, layout: str = "fprop") -> bool:
    """``auto``'s GEMM rule before the measured table: the kernel for M ≤ 64."""
    del n, k, layout
    return m <= 64


def logging_rule(rule, choices: collections.Counter):
    """``rule``, recording each verdict in ``choices``."""

    def logged(m, n, k, layout="fprop"):
        verdict = rule(m, n, k, layout)
        choices[(layout, m, n, k, "pallas" if verdict else "xla")] += 1
        return verdict

    return logged


def old_build(cfg: LlamaConfig, impl: str):
    """(step, init) of the benchmark before it timed the Trainer (commit d688b6f)."""
    model = Llama(cfg, rngs=nnx.Rngs(0))
    policy = fp4jax.flax.paper_policy(num_blocks=cfg.layers, recipe=fp4jax.Recipe.nvfp4())
    fp4jax.flax.nnx.quantize(model, policy, impl=impl)
    loss_fn, params = train_lib.nnx_loss_fn(model, loss_and_metrics)
    opt = optax.adamw(1e-3)
    step = train_lib.TrainStep(loss_fn, opt, has_aux=True, max_grad_norm=1.0)
    return step, lambda: train_lib.init_state(params, opt, jax.random.key(0))


def run(variant: str, size: dict, batches) -> dict:
    build, recipe, rule = variant.split("/")
    if build not in ("trainer", "old") or rule not in ("table", "m64"):
        raise ValueError(f"variant must be trainer|old / RECIPE / table|m64, got {variant!r}")
    choices: collections.Counter = collections.Counter()
    # The module global is what `implementation.matmul` calls; fp4jax's jitted
    # dot_general caches traces by shape, so clear them for the new rule to be traced.
    implementation.auto_prefers_gemm_kernel = logging_rule(
        TABLE_RULE if rule == "table" else m64_rule, choices)
    jax.clear_caches()
    cfg = LlamaConfig(dim=size["dim"], layers=size["layers"], heads=size["heads"],
                      dtype="bfloat16", embed_lookup="onehot" if build == "trainer" else "gather")
    batch = ts.token_batch("corpus" if build == "trainer" else "random", batches, cfg.vocab)
    if build == "trainer":
        trainer = tl.Trainer(cfg, ts.run_config(recipe, batch=size["batch"], seq=size["seq"],
                                                impl="auto"), 1)
        step, init = trainer.step, lambda: trainer.init(100)
    else:
        if recipe != "nvfp4":
            raise ValueError("the old build is NVFP4 only")
        step, init = old_build(cfg, "auto")
    t0 = time.perf_counter()
    compiled = step.jitted.lower(init(), batch, mode="recipe").compile()
    compile_s = time.perf_counter() - t0
    if build == "trainer":
        step_s = ts.threaded_step_seconds(compiled, init(), batch, iters=5, reps=4)
    else:
        state = init()
        step_s = ts.timing.time_fn(lambda s: compiled(s, batch)[0], [(state,)], warmup=2,
                                   iters=5, reps=4)
    implementation.auto_prefers_gemm_kernel = TABLE_RULE
    return {"variant": variant, "compile_s": compile_s, "step_ms": 1e3 * step_s,
            "choices": sorted(choices)}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", nargs="+", help="BUILD/RECIPE/RULE, e.g. trainer/nvfp4/m64")
    p.add_argument("--small", action="store_true", help="dim 128, 2 layers, batch 4 x seq 64")
    a = p.parse_args(argv)
    size = (dict(dim=128, layers=2, heads=2, batch=4, seq=64) if a.small
            else dict(dim=768, layers=4, heads=12, batch=64, seq=512))
    corpus = ts.data_lib.load_corpus(None, suffix=".py")
    batches = ts.data_lib.Batches(corpus.train, batch=size["batch"], seq=size["seq"], seed=0)
    env = ts.timing.environment()
    print(f"{env['device']}, jax {env['jax']}, {env['date']}; {size}", flush=True)
    rows = []
    for v in a.variants:
        r = run(v, size, batches)
        rows.append(r)
        print(f"{v}: compile {r['compile_s']:.1f} s, step {r['step_ms']:.2f} ms", flush=True)
        for c in r["choices"]:
            print(f"    {c}")
    return rows


if __name__ == "__main__":
    main()
