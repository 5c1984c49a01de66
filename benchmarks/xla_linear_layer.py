"""Pure-XLA NVFP4 linear layer (fwd+bwd) vs BF16 at 8192 tokens, 8192 -> 8192.

Usage: PYTHONPATH=. python benchmarks/xla_linear_layer.py [--tokens 8192 --k 8192 --n 8192]
Prints a table and writes JSON to --out (default: stdout only).
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax
from pallas_kernels.timing import environment, time_fn

LINEAR = (((1,), (0,)), ((), ()))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (a.tokens, a.k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (a.k, a.n), jnp.float32) / np.sqrt(a.k)).astype(jnp.bfloat16)
    ct = jax.random.normal(keys[2], (a.tokens, a.n), jnp.bfloat16)

    def layer(dg):
        def f(x, w, ct, key):
            y, vjp = jax.vjp(lambda x, w: dg(x, w, LINEAR, key=key), x, w)
            return y, *vjp(ct)
        return jax.jit(f)

    bf16 = layer(lambda x, w, dn, key: jax.lax.dot_general(x, w, dn))
    nvfp4 = layer(functools.partial(fp4jax.dot_general, recipe=fp4jax.Recipe.nvfp4(), impl="xla"))
    fwd_bf16 = jax.jit(lambda x, w: jax.lax.dot_general(x, w, LINEAR))
    fwd_nvfp4 = jax.jit(lambda x, w, key: fp4jax.dot_general(x, w, LINEAR, key=key))
    args = [(x, w, ct, keys[3]), (x * 0.5, w, ct, keys[2])]
    res = {
        "shape": [a.tokens, a.k, a.n],
        "bf16_fwd_bwd_ms": 1e3 * time_fn(bf16, args, iters=a.iters),
        "nvfp4_xla_fwd_bwd_ms": 1e3 * time_fn(nvfp4, args, iters=a.iters),
        "bf16_fwd_ms": 1e3 * time_fn(fwd_bf16, [t[:2] for t in args], iters=a.iters),
        "nvfp4_xla_fwd_ms": 1e3 * time_fn(fwd_nvfp4, [(t[0], t[1], t[3]) for t in args],
                                          iters=a.iters),
        **environment(),
    }
    res["fwd_bwd_ratio"] = res["nvfp4_xla_fwd_bwd_ms"] / res["bf16_fwd_bwd_ms"]
    _, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, LINEAR, key=keys[3]), x, w)
    saved = sum(l.nbytes for l in jax.tree_util.tree_leaves(vjp) if hasattr(l, "nbytes"))
    res["saved_for_backward_bytes"] = int(saved)
    res["bf16_saved_for_backward_bytes"] = int(x.nbytes + w.nbytes)
    print(f"| path | fwd ms | fwd+bwd ms |\n|---|---|---|\n"
          f"| BF16 lax.dot_general | {res['bf16_fwd_ms']:.3f} | {res['bf16_fwd_bwd_ms']:.3f} |\n"
          f"| fp4jax NVFP4 (impl=xla) | {res['nvfp4_xla_fwd_ms']:.3f} | "
          f"{res['nvfp4_xla_fwd_bwd_ms']:.3f} |\n"
          f"fwd+bwd ratio {res['fwd_bwd_ratio']:.2f}x; saved for backward "
          f"{saved / 2**20:.1f} MiB vs "
          f"{res['bf16_saved_for_backward_bytes'] / 2**20:.1f} MiB BF16; "
          f"{res['device']}, jax {res['jax']}, {res['date']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
