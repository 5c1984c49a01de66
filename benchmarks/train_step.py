"""Compile time and step time of the example Llama's jitted train step, BF16 vs NVFP4.

    PYTHONPATH=. python benchmarks/train_step.py --out /tmp/step.json            # GPU
    PYTHONPATH=. python benchmarks/train_step.py --dim 128 --layers 2 --batch 4 --seq 64

The batch is on the device before timing, so this measures the step itself (the
examples' training loop is measured separately). Both programs are compiled with
``.lower().compile()`` and timed with `pallas_kernels.timing` on the same batch; the
NVFP4 model is the example's `paper_policy` conversion with ``impl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

from llama import Llama, LlamaConfig, loss_and_metrics  # noqa: E402

import fp4jax  # noqa: E402
from fp4jax import train as train_lib  # noqa: E402
from pallas_kernels import timing  # noqa: E402


def build(cfg: LlamaConfig, recipe: str, impl: str, seed: int = 0):
    """(jitted step function, state) for one precision."""
    import optax  # noqa: PLC0415

    model = Llama(cfg, rngs=nnx.Rngs(seed))
    if recipe != "bf16":
        policy = fp4jax.flax.paper_policy(num_blocks=cfg.layers, recipe=fp4jax.Recipe.nvfp4())
        fp4jax.flax.nnx.quantize(model, policy, impl=impl)
    loss_fn, params = train_lib.nnx_loss_fn(model, loss_and_metrics)
    opt = optax.adamw(1e-3)
    step = train_lib.TrainStep(loss_fn, opt, has_aux=True, max_grad_norm=1.0)
    state = train_lib.init_state(params, opt, jax.random.key(seed))
    return step, state


def measure(cfg: LlamaConfig, recipe: str, impl: str, batch: int, seq: int) -> dict:
    step, state = build(cfg, recipe, impl)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab, (batch, seq + 1)), jnp.int32)
    data = (tokens[:, :-1], tokens[:, 1:])
    t0 = time.perf_counter()
    compiled = step.jitted.lower(state, data, mode="recipe").compile()
    compile_s = time.perf_counter() - t0

    def run(state):
        return compiled(state, data)[0]

    step_s = timing.time_fn(run, [(state,)], warmup=2, iters=5, reps=4)
    return {"recipe": recipe, "impl": impl, "compile_s": compile_s, "step_ms": step_s * 1e3}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--impls", default="xla,auto")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    cfg = LlamaConfig(dim=a.dim, layers=a.layers, heads=a.heads)
    rows = [measure(cfg, "bf16", "xla", a.batch, a.seq)]
    rows += [measure(cfg, "nvfp4", impl, a.batch, a.seq) for impl in a.impls.split(",")]
    base = rows[0]
    for r in rows:
        r["step_ratio"] = r["step_ms"] / base["step_ms"]
        r["compile_ratio"] = r["compile_s"] / base["compile_s"]
    result = {**timing.environment(), "model": vars(a), "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{result['device']}, jax {result['jax']}, {result['date']}: Llama dim={a.dim} "
          f"layers={a.layers}, batch {a.batch} x seq {a.seq}")
    print("| recipe | impl | compile s | x BF16 | step ms | x BF16 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['recipe']} | {r['impl']} | {r['compile_s']:.1f} | {r['compile_ratio']:.2f} | "
              f"{r['step_ms']:.2f} | {r['step_ratio']:.2f} |")
    return result


if __name__ == "__main__":
    main()
