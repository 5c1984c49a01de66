"""examples/llama.py: the token embedding's lookup and the backward pass it compiles to."""

import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

from llama import Llama, LlamaConfig, embed_tokens, loss_and_metrics  # noqa: E402

from fp4jax.train import nnx_loss_fn  # noqa: E402


def _scatter_shapes(compiled_text: str) -> list[str]:
    """Result shapes of the scatters in a compiled HLO module."""
    return re.findall(r"= (\S+?)\{[^}]*\} scatter\(", compiled_text)


def _stablehlo_scatter_results(text: str) -> list[str]:
    """Result types of the scatters in a lowered (StableHLO) module."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        if '"stablehlo.scatter"' in line:  # its region ends at "}) : (operands) -> result"
            end = next(x for x in lines[i:] if x.lstrip().startswith("}) :"))
            out.append(end.rsplit("-> ", 1)[1].strip())
    return out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_onehot_lookup_equals_the_gather_forward_and_backward(dtype):
    """On repeated tokens, the one-hot product gives the gather's embeddings and table
    gradient bit for bit (the cotangents are small integers, so every summation order
    is exact), and compiles to no scatter at all."""
    emb = nnx.Embed(256, 16, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(emb)
    tokens = jnp.array([[32, 32, 101, 32], [0, 255, 32, 32]])
    cot = jnp.asarray(np.random.default_rng(0).integers(-4, 5, (2, 4, 16)), dtype)

    out, scatters = {}, {}
    for kind in ("gather", "onehot"):
        @jax.jit
        def fwd_bwd(p, t, c, kind=kind):
            y, vjp = jax.vjp(lambda q: embed_tokens(nnx.merge(graphdef, q), t, kind), p)
            return y, vjp(c)[0]["embedding"][...]

        out[kind] = fwd_bwd(params, tokens, cot)
        scatters[kind] = _scatter_shapes(fwd_bwd.lower(params, tokens, cot).compile().as_text())
    assert out["onehot"][0].dtype == dtype
    assert all(np.array_equal(a, b) for a, b in zip(out["gather"], out["onehot"]))
    assert scatters["onehot"] == [] and scatters["gather"] != []


def test_llama_backward_has_no_scatter_into_the_embedding_table():
    """The model's default lookup leaves no scatter into the (vocab, dim) table in the
    compiled gradient (on the GPU its atomics serialize on repeated tokens: 2.4x the
    step on Python source); ``embed_lookup="gather"`` does (the check can fail)."""
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 9)), jnp.int32)
    batch = (tokens[:, :-1], tokens[:, 1:])
    shapes = {}
    for kind in ("onehot", "gather"):
        cfg = LlamaConfig(dim=16, layers=1, heads=2, dtype="float32", embed_lookup=kind)
        loss_fn, params = nnx_loss_fn(Llama(cfg, rngs=nnx.Rngs(0)), loss_and_metrics)
        grad = jax.jit(jax.grad(lambda p, b: loss_fn(p, b)[0]))  # noqa: B023
        shapes[kind] = _stablehlo_scatter_results(grad.lower(params, batch).as_text())
    assert LlamaConfig().embed_lookup == "onehot"
    table = "tensor<256x16xf32>"
    assert table not in shapes["onehot"] and table in shapes["gather"]
    with pytest.raises(ValueError, match="embed_lookup"):
        LlamaConfig(embed_lookup="take")
