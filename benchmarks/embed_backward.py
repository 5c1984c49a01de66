"""The embedding table's gradient alone: gather (scatter-add backward) vs one-hot GEMM, by data.

    PYTHONPATH=. python benchmarks/embed_backward.py --out /tmp/embed.json            # GPU
    PYTHONPATH=. python benchmarks/embed_backward.py --dim 128 --batch 4 --seq 64     # CPU smoke

Times the backward pass of `llama.embed_tokens` (the example Llama's token lookup)
with respect to the table, for each lookup of `llama.LlamaConfig.embed_lookup`, on
three token batches of the same shape: the training corpus's first batch (Python
source: about a quarter of the bytes are spaces), uniformly random bytes, and a
single repeated byte. The gather's backward is a scatter-add whose updates to one
table row are atomics on the same addresses, so its time depends on how often tokens
repeat; the one-hot GEMM's does not. ``scatters`` counts the scatter ops left in the
compiled program.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import data as data_lib  # noqa: E402
from llama import embed_tokens  # noqa: E402

from pallas_kernels import timing  # noqa: E402

VOCAB = 256


def token_sets(batch: int, seq: int, data: str | None) -> dict[str, np.ndarray]:
    """``(batch, seq)`` int32 tokens: corpus, uniform random, one repeated byte (space)."""
    corpus = data_lib.load_corpus([data] if data else None, suffix=None if data else ".py")
    return {
        "corpus": data_lib.Batches(corpus.train, batch=batch, seq=seq, seed=0)(0)[0],
        "random": np.random.default_rng(0).integers(0, VOCAB, (batch, seq)).astype(np.int32),
        "one byte": np.full((batch, seq), ord(" "), np.int32),
    }


def table_grad_fn(dim: int, dtype: str, lookup: str):
    """``(jitted grad(params, tokens, cotangent), params)`` of the lookup w.r.t. the table."""
    emb = nnx.Embed(VOCAB, dim, dtype=jnp.dtype(dtype), param_dtype=jnp.float32,
                    rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(emb)

    @jax.jit
    def grad(params, tokens, cotangent):
        _, vjp = jax.vjp(lambda p: embed_tokens(nnx.merge(graphdef, p), tokens, lookup), params)
        return vjp(cotangent)[0]

    return grad, params


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dtypes", default="bfloat16,float32", help="table compute dtypes")
    p.add_argument("--data", default=None,
                   help="a text tree (default: this interpreter's Python sources)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    tokens = {k: jax.device_put(v) for k, v in token_sets(a.batch, a.seq, a.data).items()}
    rows = []
    for dtype in a.dtypes.split(","):
        cot = jax.random.normal(jax.random.key(0), (a.batch, a.seq, a.dim)).astype(dtype)
        for lookup in ("gather", "onehot"):
            grad, params = table_grad_fn(a.dim, dtype, lookup)
            hlo = grad.lower(params, tokens["corpus"], cot).compile().as_text()
            scatters = len(re.findall(r"= \S+ scatter\(", hlo))
            for kind, tok in tokens.items():
                ms = timing.time_fn(grad, [(params, tok, cot)], warmup=2, iters=5, reps=5) * 1e3
                hottest = int(np.bincount(np.asarray(tok).ravel(), minlength=VOCAB).max())
                rows.append({"dtype": dtype, "lookup": lookup, "tokens": kind, "ms": ms,
                             "hottest_token_count": hottest, "scatters": scatters})
    result = {**timing.environment(), "shape": vars(a), "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{result['device']}, jax {result['jax']}, {result['date']}: embedding table gradient, "
          f"{a.batch}x{a.seq} tokens, table {VOCAB}x{a.dim}")
    print("| dtype | lookup | tokens | most frequent token: count | scatters | ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['dtype']} | {r['lookup']} | {r['tokens']} | {r['hottest_token_count']} | "
              f"{r['scatters']} | {r['ms']:.3f} |")
    return result


if __name__ == "__main__":
    main()
