"""Where the time goes in one NVFP4 linear layer's fwd+bwd, pass by pass.

The layer is ``fp4jax.dot_general`` with `Recipe.nvfp4()` and ``impl="auto"`` on
``X (tokens, d_in) @ W (d_in, d_out)`` (default 8192 tokens, 8192 → 8192). Its passes
are timed one by one, each jitted alone on the operands the layer gives it, with the
project's timer (median of warm device-synchronized runs, inputs rotated):

* quantize X: rowwise RNE + columnwise RHT RNE (one two-output kernel call);
* quantize W: 16×16 tiles, RNE;
* quantize dY: rowwise SR + columnwise RHT SR (one two-output kernel call);
* the fprop, dgrad and wgrad GEMMs, with the implementation ``auto`` picks;

beside the whole layer and a BF16 layer (three ``jnp.dot``s). "everything else" is the
layer's time minus the passes' sum (launch gaps, reshapes, the output cast, fusion
differences). With ``--trace DIR`` it also writes a `jax.profiler` trace of the layer
(open it with TensorBoard/XProf or Perfetto) and prints the device ops found in it.

Usage (GPU machine, repo root)::

  PYTHONPATH=. python3 benchmarks/layer_breakdown.py --json OUT.json [--trace DIR]
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax
from benchmarks import trace_summary
from fp4jax import implementation
from pallas_kernels.timing import environment, time_fn

LINEAR = (((1,), (0,)), ((), ()))


def layer_fn(impl: str | None):
    """Jitted fwd+bwd of the layer (``impl=None``: BF16 ``lax.dot_general``)."""
    def f(x, w, ct, key):
        def fwd(x, w):
            if impl is None:
                return jax.lax.dot_general(x, w, LINEAR)
            return fp4jax.dot_general(x, w, LINEAR, key=key, impl=impl)
        y, vjp = jax.vjp(fwd, x, w)
        return y, *vjp(ct)
    return jax.jit(f)


def passes(x, w, ct, key) -> dict:
    """name -> (jitted fn, args) of each pass of the layer, as dot_general runs them."""
    sr = dict(rounding="stochastic")
    q_x = jax.jit(lambda a: implementation.quantize_rowwise_columnwise(a, impl="auto"))
    q_w = jax.jit(lambda a: implementation.quantize(a, axis=0, block_2d=True, impl="auto"))
    q_g = jax.jit(lambda a, k: implementation.quantize_rowwise_columnwise(
        a, row_key=jax.random.fold_in(k, 1), col_key=jax.random.fold_in(k, 2), impl="auto",
        **sr))
    xr, xc = q_x(x)
    qw = q_w(w)
    gr, gc = q_g(ct, key)
    mm = lambda t: jax.jit(lambda a, b: implementation.matmul(  # noqa: E731
        a, b, preferred_element_type=jnp.float32, impl="auto", lhs_from_mT=t))
    return {
        "quantize X (rowwise + columnwise RHT, RNE)": (q_x, (x,)),
        "quantize W (16x16 tiles, RNE)": (q_w, (w,)),
        "quantize dY (rowwise + columnwise RHT, SR)": (q_g, (ct, key)),
        "GEMM fprop  X @ W": (mm(False), (xr, qw)),
        "GEMM dgrad  dY @ W^T": (mm(False), (gr, qw.mT)),
        "GEMM wgrad  X^T @ dY": (mm(True), (xc.mT, gc)),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--d-in", type=int, default=8192)
    p.add_argument("--d-out", type=int, default=8192)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", required=True)
    p.add_argument("--trace", help="also write a jax.profiler trace of the layer here")
    p.add_argument("--hlo", help="also write the layer's optimized HLO text here (to map the "
                   "trace's fusion names to the layer's ops)")
    a = p.parse_args(argv)
    env = environment()
    ks = jax.random.split(jax.random.key(0), 8)
    sets = []
    for i in range(2):
        x = jax.random.normal(ks[4 * i], (a.tokens, a.d_in), jnp.bfloat16)
        w = (jax.random.normal(ks[4 * i + 1], (a.d_in, a.d_out)) / np.sqrt(a.d_in)).astype(
            jnp.bfloat16)
        ct = jax.random.normal(ks[4 * i + 2], (a.tokens, a.d_out), jnp.bfloat16)
        sets.append((x, w, ct, ks[4 * i + 3]))
    rows = {}
    rows["BF16 layer (3 jnp.dot)"] = time_fn(layer_fn(None), sets, iters=a.iters)
    layer = layer_fn("auto")
    rows["NVFP4 layer, impl=auto"] = time_fn(layer, sets, iters=a.iters)
    parts = [passes(*s) for s in sets]
    total = 0.0
    for name in parts[0]:
        fn = parts[0][name][0]
        t = time_fn(fn, [pp[name][1] for pp in parts], iters=a.iters)
        rows[name] = t
        total += t
    rows["everything else (layer - passes)"] = rows["NVFP4 layer, impl=auto"] - total
    bf16 = rows["BF16 layer (3 jnp.dot)"]
    print(f"{env['device']}, JAX {env['jax']}, {env['date']}: linear layer fwd+bwd, "
          f"{a.tokens} tokens, {a.d_in} -> {a.d_out}, Recipe.nvfp4(), impl=auto")
    print("| pass | ms | share of NVFP4 layer | x BF16 layer |")
    print("| --- | --- | --- | --- |")
    layer_s = rows["NVFP4 layer, impl=auto"]
    for name, t in rows.items():
        print(f"| {name} | {t * 1e3:.3f} | {t / layer_s:.0%} | {t / bf16:.2f} |")
    result = {"environment": env, "shape": [a.tokens, a.d_in, a.d_out],
              "ms": {k: v * 1e3 for k, v in rows.items()}}
    if a.hlo:
        with open(a.hlo, "w") as f:
            f.write(layer.lower(*sets[0]).compile().as_text())
    if a.trace:
        jax.block_until_ready(layer(*sets[0]))
        with jax.profiler.trace(a.trace, create_perfetto_trace=True):
            for _ in range(3):
                out = layer(*sets[0])
            jax.block_until_ready(out)
        ops = trace_summary.summarize(a.trace)[:25]
        result["trace_top_ops"] = ops
        print("\njax.profiler trace, device ops over 3 layer calls (name, total ms, count):")
        for name, ms, count in ops:
            print(f"  {ms:8.3f} ms  {count:4d}x  {name[:100]}")
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    sys.exit(main() and None)
