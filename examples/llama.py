"""A small Llama-style decoder in Flax nnx: RMSNorm, RoPE, causal attention, SwiGLU.

Plain nnx code with plain ``nnx.Linear`` layers — nothing fp4jax-specific. NVFP4 is
applied afterwards, without editing the model, by `fp4jax.flax.nnx.quantize` and a
policy (see ``train_llama.py``). Computation in BF16 (``dtype``), parameters in FP32
(``param_dtype``): the FP32 masters of RECIPE.md §7.

Every parameter names its axes, Flax style (``nnx.with_partitioning``): ``embed``
(the model width), ``heads`` (attention heads × head dimension), ``mlp`` (the SwiGLU
hidden width), ``vocab`` and ``norm``. `fp4jax.parallel.DEFAULT_RULES` map them to a
mesh's ``data``/``fsdp``/``model`` axes: FSDP shards ``embed``; tensor parallelism
splits q/k/v and gate/up by columns (``heads``/``mlp`` outputs) and o and down by rows
(Megatron), the embedding and output head along ``vocab``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Model size.

    Attributes:
      vocab: vocabulary size (256 for bytes).
      dim: model width (a multiple of 16 and of ``heads``).
      layers: number of transformer blocks.
      heads: attention heads.
      hidden: SwiGLU hidden width (default: ~8/3·dim rounded up to a multiple of 64).
      rope_theta: RoPE base.
      dtype: computation dtype.
      embed_lookup: how tokens select their embedding rows: ``"onehot"``, a one-hot ×
        table product (`embed_tokens`), or ``"gather"``, ``nnx.Embed``'s ``jnp.take``.
        Both give the same embeddings; they differ in the backward pass. The gather's is
        a scatter-add into the table whose GPU atomics serialize on repeated tokens: on
        Python source, where a quarter of the bytes are spaces, the BF16 step (64×512
        tokens, dim 768, H200) took 61 ms against 25 ms on uniformly random tokens. The
        one-hot's is a GEMM, as fast on any data; it costs 2·vocab·dim FLOPs per token
        each way, negligible for the 256-byte vocabulary, not for a 32k one.
    """

    vocab: int = 256
    dim: int = 256
    layers: int = 4
    heads: int = 4
    hidden: int | None = None
    rope_theta: float = 10_000.0
    dtype: str = "bfloat16"
    embed_lookup: str = "onehot"

    def __post_init__(self):
        if self.embed_lookup not in ("onehot", "gather"):
            raise ValueError(
                f"embed_lookup must be 'onehot' or 'gather', got {self.embed_lookup!r}")
        for name in ("vocab", "dim", "layers", "heads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(f"dim={self.dim} must split into {self.heads} heads of even size")
        if self.hidden is None:
            object.__setattr__(self, "hidden", -(-(8 * self.dim // 3) // 64) * 64)

    @property
    def compute_dtype(self) -> jnp.dtype:
        """``dtype`` as a numpy dtype."""
        return jnp.dtype(self.dtype)

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.heads

    def param_counts(self) -> dict[str, int]:
        """Parameter counts: embedding, quantizable block matmuls, head, norms, total."""
        d, h, v, n = self.dim, self.hidden, self.vocab, self.layers
        blocks = n * (4 * d * d + 3 * d * h)
        norms = n * 2 * d + d
        return {"embedding": v * d, "block_matmuls": blocks, "head": d * v,
                "norms": norms, "total": v * d + blocks + d * v + norms}

    def train_flops_per_token(self, seq: int) -> dict[str, float]:
        """Training FLOPs per token (forward + backward = 3× forward).

        ``block_matmuls`` (the GEMMs fp4jax may quantize), ``head`` (BF16) and
        ``attention`` (the score and value products, 2·2·seq·dim per layer forward,
        counted in full — the causal mask is not exploited by XLA's attention).
        """
        c = self.param_counts()
        return {
            "block_matmuls": 6.0 * c["block_matmuls"],
            "head": 6.0 * c["head"],
            "attention": 3.0 * 4.0 * self.layers * seq * self.dim,
        }


def embed_tokens(embed: nnx.Embed, tokens: jax.Array, lookup: str = "onehot") -> jax.Array:
    """The embedding rows of ``tokens`` in ``embed.dtype`` (see `LlamaConfig.embed_lookup`).

    ``"onehot"`` multiplies a one-hot encoding of the tokens by the table: each output is
    one table entry times one (plus zeros), so it equals the gather exactly, and the
    table's gradient is a GEMM accumulated in float32 instead of an atomic scatter-add.

    Example:
      >>> import jax.numpy as jnp
      >>> e = nnx.Embed(8, 4, rngs=nnx.Rngs(0))
      >>> t = jnp.array([[1, 7, 1]])
      >>> bool(jnp.array_equal(embed_tokens(e, t), e(t)))
      True
    """
    if lookup == "gather":
        return embed(tokens)
    table = embed.embedding[...]
    table = table.astype(embed.dtype) if embed.dtype is not None else table
    if not jax.sharding.get_abstract_mesh().empty:
        # On a mesh: the (vocab, dim) table is small, so it is gathered whole (FSDP) for a
        # local product with the token-sharded one-hot; left to itself XLA's partitioner
        # all-gathers the one-hot (batch x seq x vocab) and its gradient instead.
        table = jax.lax.with_sharding_constraint(table, jax.sharding.PartitionSpec())
    onehot = jax.nn.one_hot(tokens, embed.num_embeddings, dtype=table.dtype)
    # A float32 table must not be rounded to TF32 on the way through the GEMM; BF16
    # operands are exact at the default precision.
    exact = jax.lax.Precision.HIGHEST if table.dtype == jnp.float32 else None
    return jnp.dot(onehot, table, precision=exact)


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding on ``(batch, seq, heads, head_dim)`` (half-split form)."""
    seq, hd = x.shape[1], x.shape[-1]
    freqs = 1.0 / theta ** (jnp.arange(0, hd // 2, dtype=jnp.float32) * 2.0 / hd)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x.dtype)


def axes(init: nnx.Initializer, *names: str) -> nnx.Initializer:
    """``init`` whose parameter has these logical axis names (for a mesh's rules).

    Not sharded when created (``eager_sharding=False``): the model builds the same
    with or without a mesh, and `fp4jax.train` places the state by the rules.
    """
    return nnx.with_partitioning(init, names, eager_sharding=False)


class Attention(nnx.Module):
    """Causal multi-head self-attention with RoPE; q/k/v/o are ``nnx.Linear``."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        out_init = nnx.initializers.normal(0.02 / (2 * cfg.layers) ** 0.5)
        lin = dict(use_bias=False, dtype=cfg.compute_dtype, param_dtype=jnp.float32, rngs=rngs)
        self.cfg = cfg
        column, row = axes(init, "embed", "heads"), axes(out_init, "heads", "embed")
        self.q = nnx.Linear(cfg.dim, cfg.dim, kernel_init=column, **lin)
        self.k = nnx.Linear(cfg.dim, cfg.dim, kernel_init=column, **lin)
        self.v = nnx.Linear(cfg.dim, cfg.dim, kernel_init=column, **lin)
        self.o = nnx.Linear(cfg.dim, cfg.dim, kernel_init=row, **lin)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, s, _ = x.shape
        shape = (b, s, self.cfg.heads, self.cfg.head_dim)
        q = rope(self.q(x).reshape(shape), self.cfg.rope_theta)
        k = rope(self.k(x).reshape(shape), self.cfg.rope_theta)
        v = self.v(x).reshape(shape)
        # Score and value products stay in BF16 (RECIPE.md §7): not an nnx.Linear.
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.reshape(b, s, self.cfg.dim))


class SwiGLU(nnx.Module):
    """``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        out_init = nnx.initializers.normal(0.02 / (2 * cfg.layers) ** 0.5)
        lin = dict(use_bias=False, dtype=cfg.compute_dtype, param_dtype=jnp.float32, rngs=rngs)
        column, row = axes(init, "embed", "mlp"), axes(out_init, "mlp", "embed")
        self.gate = nnx.Linear(cfg.dim, cfg.hidden, kernel_init=column, **lin)
        self.up = nnx.Linear(cfg.dim, cfg.hidden, kernel_init=column, **lin)
        self.down = nnx.Linear(cfg.hidden, cfg.dim, kernel_init=row, **lin)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(nnx.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        norm = dict(dtype=cfg.compute_dtype, param_dtype=jnp.float32, rngs=rngs,
                    scale_init=axes(nnx.initializers.ones, "norm"))
        self.attn_norm = nnx.RMSNorm(cfg.dim, **norm)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(cfg.dim, **norm)
        self.mlp = SwiGLU(cfg, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class LanguageModel(nnx.Module):
    """Token embedding → blocks → RMSNorm → output head (logits in float32): the trunk
    `Llama` and `hybrid.Hybrid` share.

    ``make_blocks()`` builds the blocks; it is called after the embedding and before the
    norm and the head, so every parameter draws its initial value in that order.
    """

    def __init__(self, cfg: Any, make_blocks: Callable[[], list[nnx.Module]], *,
                 rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(
            cfg.vocab, cfg.dim, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
            embedding_init=axes(nnx.initializers.normal(0.02), "vocab", "embed"), rngs=rngs)
        self.blocks = nnx.List(make_blocks())
        self.norm = nnx.RMSNorm(cfg.dim, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
                                scale_init=axes(nnx.initializers.ones, "norm"), rngs=rngs)
        self.lm_head = nnx.Linear(
            cfg.dim, cfg.vocab, use_bias=False, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
            kernel_init=axes(nnx.initializers.normal(0.02), "embed", "vocab"), rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = embed_tokens(self.embed, tokens, self.cfg.embed_lookup)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x)).astype(jnp.float32)


class Llama(LanguageModel):
    """Token embedding → ``cfg.layers`` transformer blocks → RMSNorm → output head."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, lambda: [Block(cfg, rngs=rngs) for _ in range(cfg.layers)],
                         rngs=rngs)


def loss_and_metrics(model: Llama, batch: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, dict]:
    """Mean next-byte cross-entropy (nats) and ``bits_per_byte``."""
    import optax  # noqa: PLC0415

    x, y = batch
    logits = model(x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, {"bits_per_byte": loss / jnp.log(2.0)}
