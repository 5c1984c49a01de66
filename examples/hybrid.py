"""A small hybrid Mamba-Transformer in Flax nnx: Mamba-2 mixers, a few attention layers, SwiGLU.

The model family of the NVFP4 paper's 12B run (Nemotron-H): a stack of single-purpose
residual blocks, each ``x + mixer(RMSNorm(x))``, whose mixer is a Mamba-2 selective
state-space layer (``M``), causal self-attention (``*``) or a SwiGLU MLP (``-``).
`HybridConfig.pattern` spells the stack: ``layers`` sequence mixers, one attention
mixer in the middle of every ``attn_every`` of them (Jamba's placement, so the first
and last mixers are Mamba), each followed by an MLP block when ``mlp`` — e.g.
``"M-M-*-M-"`` for 4 mixers with ``attn_every=4``. Blocks are numbered in that order,
whatever their type (``blocks.3.mlp.up``), so `fp4jax.flax.paper_policy`'s "first N /
last M blocks in BF16" counts them as the paper counted its 62 layers.

Like ``llama.py`` (whose attention, MLP, embedding lookup and loss it reuses), it is
plain nnx: NVFP4 comes afterwards from `fp4jax.flax.nnx.quantize` and a policy. Only
the big projections are ``nnx.Linear`` layers — a Mamba mixer's ``in_proj`` and
``out_proj``, attention's q/k/v/o, the MLP's gate/up/down — so a policy quantizes
exactly those by path; the depthwise convolution, the state-space scan, ``A_log``,
``D``, ``dt_bias`` and the norms are plain parameters and float32 code that no policy
touches (state-space recurrences multiply many decays, so they are computed in
float32 whatever the compute dtype). Big matmuls compute in ``dtype`` (BF16 on a
GPU), parameters are FP32.

**Taken from Mamba-2** (Dao & Gu 2024, the SSD layer): one input projection to
``z`` (gate), ``x``, ``B``, ``C`` and a per-head ``dt``; a short causal depthwise
convolution (width 4) with SiLU over ``x``, ``B``, ``C``; ``dt = softplus(dt + dt_bias)``
with ``dt_bias`` initialised so that ``dt`` starts log-uniform in [0.001, 0.1]; a
scalar negative decay per head, ``A = -exp(A_log)`` with ``A`` initialised uniform in
[1, 16]; the recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_tᵀ``,
``y_t = h_t C_t + D x_t``; the gated RMSNorm ``RMSNorm(y · silu(z))``; the output
projection. The scan is the SSD chunked form (`ssd_scan`): quadratic "attention"
within chunks of ``chunk`` tokens, a linear recurrence of chunk states across chunks —
all matrix products, exact to float32 rounding against the sequential recurrence.

**Simplified**: one group of ``B``/``C`` shared by all heads (Mamba-2's
``ngroups=1``); no ``dt`` clamping (``dt_limit``), no initial state, no fused kernels;
no tensor-parallel split of the Mamba mixers (their parameters use their own logical
axis names, which `fp4jax.parallel.DEFAULT_RULES` replicate over ``model``; FSDP
still shards their ``embed`` dimension; attention and MLP blocks split as in
``llama.py``). The sequence is zero-padded at the end to whole chunks (causal, so
the padding changes no output).

Logical axis names: ``embed``, ``heads``, ``mlp``, ``vocab``, ``norm`` as in
``llama.py``; ``ssm_proj`` (``in_proj``'s outputs), ``ssm_inner`` (``out_proj``'s
inputs), ``ssm_conv``/``conv_width`` (the convolution), ``ssm_heads`` (per-head
``A_log``, ``D``, ``dt_bias``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from llama import Attention, LanguageModel, LlamaConfig, SwiGLU, axes  # noqa: E402
from llama import loss_and_metrics as loss_and_metrics  # noqa: E402  (same loss)

MAMBA, ATTENTION, MLP = "M", "*", "-"
"""Block kinds in `HybridConfig.pattern` (Nemotron-H's notation)."""

HIGHEST = jax.lax.Precision.HIGHEST
"""The scan's products keep float32 (no TF32 rounding on a GPU)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class HybridConfig:
    """Model size and block pattern.

    Attributes:
      vocab: vocabulary size (256 for bytes).
      dim: model width (a multiple of ``heads``, with even attention heads).
      layers: sequence mixers (Mamba-2 or attention); the block count is
        ``2 · layers`` with ``mlp``, else ``layers``.
      attn_every: one attention mixer per this many mixers, in the middle of each
        group (mixer ``i`` is attention when ``i % attn_every == attn_every // 2``);
        0: no attention (a pure Mamba-2 stack); 1: every mixer is attention.
      mlp: follow every mixer with a SwiGLU MLP block (Nemotron-H); False: mixers only
        (Mamba-2's own stack).
      heads: attention heads.
      hidden: SwiGLU hidden width (default: ~8/3·dim rounded up to a multiple of 64).
      state: state size per head (Mamba-2's ``d_state``, ``N``).
      expand: Mamba inner width = ``expand · dim``.
      ssm_head_dim: Mamba head width (``P``); ``expand · dim`` must be a multiple.
      conv_width: causal depthwise convolution width.
      chunk: SSD chunk length (tokens); the scan's cost grows with it, its sequential
        part shrinks.
      rope_theta: RoPE base of the attention layers.
      dtype: computation dtype of the big matmuls (the scan is float32).
      embed_lookup: ``"onehot"`` or ``"gather"`` (see `llama.LlamaConfig`).

    Example:
      >>> HybridConfig(layers=4, attn_every=4).pattern
      'M-M-*-M-'
      >>> HybridConfig(layers=3, attn_every=0, mlp=False).pattern
      'MMM'
      >>> HybridConfig(dim=80, expand=2, ssm_head_dim=64)
      Traceback (most recent call last):
      ...
      ValueError: expand * dim = 160 must be a multiple of ssm_head_dim=64
    """

    vocab: int = 256
    dim: int = 256
    layers: int = 4
    attn_every: int = 4
    mlp: bool = True
    heads: int = 4
    hidden: int | None = None
    state: int = 64
    expand: int = 2
    ssm_head_dim: int = 64
    conv_width: int = 4
    chunk: int = 64
    rope_theta: float = 10_000.0
    dtype: str = "bfloat16"
    embed_lookup: str = "onehot"

    def __post_init__(self):
        for name in ("vocab", "dim", "layers", "heads", "state", "expand", "ssm_head_dim",
                     "conv_width", "chunk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(self.attn_every, int) or self.attn_every < 0:
            raise ValueError(f"attn_every must be a non-negative int (0: no attention), "
                             f"got {self.attn_every!r}")
        if not isinstance(self.mlp, bool):
            raise ValueError(f"mlp must be a bool, got {self.mlp!r}")
        if self.hidden is not None and (not isinstance(self.hidden, int) or self.hidden < 1):
            raise ValueError(f"hidden must be a positive int or None, got {self.hidden!r}")
        # The attention and MLP sizes and the embedding lookup are the Llama's: its checks
        # (embed_lookup, heads of even size) and its default hidden width apply.
        object.__setattr__(self, "hidden", self.llama_config().hidden)
        if (self.expand * self.dim) % self.ssm_head_dim:
            raise ValueError(f"expand * dim = {self.expand * self.dim} must be a multiple of "
                             f"ssm_head_dim={self.ssm_head_dim}")

    @property
    def compute_dtype(self) -> jnp.dtype:
        """``dtype`` as a numpy dtype."""
        return jnp.dtype(self.dtype)

    @property
    def pattern(self) -> str:
        """The blocks in order: ``M`` Mamba-2, ``*`` attention, ``-`` MLP."""
        k = self.attn_every
        mixers = [ATTENTION if k and i % k == k // 2 else MAMBA for i in range(self.layers)]
        return "".join(m + (MLP if self.mlp else "") for m in mixers)

    @property
    def num_blocks(self) -> int:
        """Residual blocks, whatever their type (what `fp4jax.flax.paper_policy` counts)."""
        return len(self.pattern)

    @property
    def d_inner(self) -> int:
        """Mamba inner width (``expand · dim``)."""
        return self.expand * self.dim

    @property
    def ssm_heads(self) -> int:
        """Mamba heads (``d_inner / ssm_head_dim``)."""
        return self.d_inner // self.ssm_head_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the depthwise convolution: ``x``, ``B`` and ``C``."""
        return self.d_inner + 2 * self.state

    @property
    def in_proj_features(self) -> int:
        """``in_proj`` outputs: ``z``, ``x``, ``B``, ``C`` and one ``dt`` per head."""
        return 2 * self.d_inner + 2 * self.state + self.ssm_heads

    def llama_config(self) -> LlamaConfig:
        """The attention and MLP sizes as a `LlamaConfig` (``llama.Attention`` and
        ``llama.SwiGLU`` take one). Its ``layers`` is half the block count rounded up:
        their output projections' init scale 0.02/sqrt(2·layers) is then ~0.02/sqrt(number
        of residual branches), as in the Llama."""
        return LlamaConfig(vocab=self.vocab, dim=self.dim, layers=-(-self.num_blocks // 2),
                           heads=self.heads, hidden=self.hidden, rope_theta=self.rope_theta,
                           dtype=self.dtype, embed_lookup=self.embed_lookup)

    def param_counts(self) -> dict[str, int]:
        """Parameter counts: embedding, quantizable block matmuls, head, norms, the
        Mamba mixers' small parameters (``ssm``: convolution, ``A_log``, ``D``,
        ``dt_bias``), total."""
        d, v, p = self.dim, self.vocab, self.pattern
        per = {MAMBA: d * self.in_proj_features + self.d_inner * d,
               ATTENTION: 4 * d * d, MLP: 3 * d * self.hidden}
        blocks = sum(per[k] for k in p)
        mambas = p.count(MAMBA)
        norms = len(p) * d + d + mambas * self.d_inner  # block norms, final, gated norms
        ssm = mambas * ((self.conv_width + 1) * self.conv_channels + 3 * self.ssm_heads)
        return {"embedding": v * d, "block_matmuls": blocks, "head": d * v, "norms": norms,
                "ssm": ssm, "total": v * d + blocks + d * v + norms + ssm}

    def train_flops_per_token(self, seq: int) -> dict[str, float]:
        """Training FLOPs per token (forward + backward = 3× forward).

        ``block_matmuls`` (the GEMMs fp4jax may quantize), ``head`` (BF16),
        ``attention`` (score and value products of the attention layers, full — not
        causal-halved) and ``scan`` (the SSD's float32 products per Mamba layer: within
        a chunk ``C·Bᵀ`` and its product with ``x``, 2·chunk·(state + inner); the chunk
        states and their outputs, 2·2·state·inner; the cross-chunk pass is negligible;
        a sequence shorter than a chunk is padded to one, hence the ratio).
        """
        c = self.param_counts()
        q = self.chunk * math.ceil(seq / self.chunk) * self.chunk / seq
        scan = 2 * q * (self.state + self.d_inner) + 4 * self.state * self.d_inner
        return {
            "block_matmuls": 6.0 * c["block_matmuls"],
            "head": 6.0 * c["head"],
            "attention": 3.0 * 4.0 * self.pattern.count(ATTENTION) * seq * self.dim,
            "scan": 3.0 * self.pattern.count(MAMBA) * scan,
        }


def segsum(x: jax.Array) -> jax.Array:
    """``out[..., i, j] = x[..., j+1] + … + x[..., i]`` for ``i ≥ j``, ``-inf`` above the
    diagonal: the log of the decay from position ``j`` to ``i``.

    Summed as a masked cumulative sum (not a difference of prefix sums, which would
    cancel large prefixes).

    Example:
      >>> segsum(jnp.array([1.0, 2.0, 3.0])).tolist()
      [[0.0, -inf, -inf], [2.0, 0.0, -inf], [5.0, 3.0, 0.0]]
    """
    t = x.shape[-1]
    below = jnp.tril(jnp.ones((t, t), bool), -1)
    terms = jnp.where(below, x[..., :, None], 0.0)  # [.., k, j] = x_k for k > j
    sums = jnp.cumsum(terms, axis=-2)
    return jnp.where(jnp.tril(jnp.ones((t, t), bool)), sums, -jnp.inf)


def ssd_scan(x: jax.Array, dt: jax.Array, a: jax.Array, b: jax.Array, c: jax.Array, *,
             chunk: int) -> jax.Array:
    """The Mamba-2 selective scan, chunked (SSD), in float32.

    Computes ``h_t = exp(dt_t·a) h_{t-1} + dt_t x_t b_tᵀ`` and ``y_t = h_t c_t`` from
    ``h_{-1} = 0``, per head, for every ``t``: within each chunk of ``chunk`` tokens as
    a decay-masked ``(c·bᵀ) x`` product, across chunks by carrying each chunk's final
    state (Mamba-2's ``ssd_minimal_discrete``).

    Args:
      x: ``(batch, seq, heads, head_dim)`` inputs.
      dt: ``(batch, seq, heads)`` positive step sizes.
      a: ``(heads,)`` negative decay rates.
      b: ``(batch, seq, state)`` input maps (shared by all heads).
      c: ``(batch, seq, state)`` output maps.
      chunk: chunk length; ``seq`` is zero-padded to a multiple of it.

    Returns:
      ``y``, shaped like ``x``, float32 (the ``D·x`` skip not included).

    Example:
      >>> x = jnp.ones((1, 3, 1, 1)); dt = jnp.ones((1, 3, 1)); bc = jnp.ones((1, 3, 1))
      >>> ssd_scan(x, dt, -jnp.log(jnp.array([2.0])), bc, bc, chunk=2)[0, :, 0, 0].tolist()
      [1.0, 1.5, 1.75]
    """
    f32 = jnp.float32
    x, dt, a, b, c = (t.astype(f32) for t in (x, dt, a, b, c))
    bsz, seq, heads, hd = x.shape
    if dt.shape != (bsz, seq, heads) or a.shape != (heads,):
        raise ValueError(f"dt {dt.shape} must be {(bsz, seq, heads)} and a {a.shape} "
                         f"{(heads,)} for x of shape {x.shape}")
    if b.shape[:2] != (bsz, seq) or b.ndim != 3 or c.shape != b.shape:
        raise ValueError(f"b {b.shape} and c {c.shape} must both be (batch={bsz}, seq={seq}, "
                         "state)")
    pad = -seq % chunk
    if pad:  # at the end: zero inputs and no decay after the last real token
        x, dt, b, c = (jnp.pad(t, [(0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 2))
                       for t in (x, dt, b, c))
    n = (seq + pad) // chunk
    xd = (x * dt[..., None]).reshape(bsz, n, chunk, heads, hd)      # b c l h p
    log_a = (dt * a).reshape(bsz, n, chunk, heads).transpose(0, 3, 1, 2)  # b h c l
    b = b.reshape(bsz, n, chunk, -1)                                  # b c l n
    c = c.reshape(bsz, n, chunk, -1)
    cum = jnp.cumsum(log_a, axis=-1)
    ein = lambda s, *ops: jnp.einsum(s, *ops, precision=HIGHEST,  # noqa: E731
                                     preferred_element_type=f32)
    # Within chunks: y_i = Σ_{j ≤ i} (c_i·b_j) exp(Σ_{j<k≤i} log_a_k) dt_j x_j.
    scores = ein("bcin,bcjn->bcij", c, b)[:, None] * jnp.exp(segsum(log_a))  # b h c i j
    y = ein("bhcij,bcjhp->bcihp", scores, xd)
    # Each chunk's final state from its own inputs, then the states entering each chunk.
    states = ein("bcjn,bhcj,bcjhp->bchpn", b, jnp.exp(cum[..., -1:] - cum), xd)
    states = jnp.concatenate([jnp.zeros_like(states[:, :1]), states], axis=1)
    totals = jnp.pad(cum[..., -1], [(0, 0), (0, 0), (1, 0)])          # b h (c+1)
    entering = ein("bhzc,bchpn->bzhpn", jnp.exp(segsum(totals)), states)[:, :-1]
    y = y + ein("bcin,bchpn,bhci->bcihp", c, entering, jnp.exp(cum))
    return y.reshape(bsz, n * chunk, heads, hd)[:, :seq]


def causal_conv(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """Depthwise causal convolution along the sequence, in float32.

    ``out[:, t, ch] = bias[ch] + Σ_k kernel[k, ch] · x[:, t - (w-1) + k, ch]`` (zero
    before the start), for ``x`` of shape ``(batch, seq, channels)`` and ``kernel``
    ``(w, channels)``: ``w`` shifted multiply-adds, no GEMM (so no policy sees it).

    Example:
      >>> causal_conv(jnp.arange(1.0, 4.0)[None, :, None], jnp.array([[1.0], [10.0]]),
      ...             jnp.zeros(1))[0, :, 0].tolist()
      [10.0, 21.0, 32.0]
    """
    w, seq = kernel.shape[0], x.shape[1]
    x = jnp.pad(x.astype(jnp.float32), [(0, 0), (w - 1, 0), (0, 0)])
    out = sum(x[:, k:k + seq] * kernel[k] for k in range(w))
    return out + bias


def conv_init(width: int) -> nnx.Initializer:
    """PyTorch's ``Conv1d`` weight init for a depthwise kernel: uniform in ±1/sqrt(width)."""
    bound = 1.0 / math.sqrt(width)
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, dtype, -bound, bound)


def dt_bias_init(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """Mamba-2's ``dt_bias``: the inverse softplus of a ``dt`` log-uniform in [1e-3, 0.1]."""
    dt = jnp.exp(jax.random.uniform(key, shape, dtype, math.log(1e-3), math.log(0.1)))
    return dt + jnp.log(-jnp.expm1(-dt))


def a_log_init(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """Mamba-2's ``A_log``: ``log A`` for ``A`` uniform in [1, 16] (decay ``-A``)."""
    return jnp.log(jax.random.uniform(key, shape, dtype, 1.0, 16.0))


class Mamba2(nnx.Module):
    """The Mamba-2 mixer: ``in_proj`` → conv → SSD scan → gated RMSNorm → ``out_proj``."""

    def __init__(self, cfg: HybridConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        init = nnx.initializers.normal(0.02)
        out_init = nnx.initializers.normal(0.02 / math.sqrt(cfg.num_blocks))
        lin = dict(use_bias=False, dtype=cfg.compute_dtype, param_dtype=jnp.float32, rngs=rngs)
        self.in_proj = nnx.Linear(cfg.dim, cfg.in_proj_features,
                                  kernel_init=axes(init, "embed", "ssm_proj"), **lin)
        self.out_proj = nnx.Linear(cfg.d_inner, cfg.dim,
                                   kernel_init=axes(out_init, "ssm_inner", "embed"), **lin)
        h, param = cfg.ssm_heads, lambda init, shape, *names: nnx.Param(  # noqa: E731
            axes(init, *names)(rngs.params(), shape, jnp.float32))
        self.conv_kernel = param(conv_init(cfg.conv_width), (cfg.conv_width, cfg.conv_channels),
                                 "conv_width", "ssm_conv")
        self.conv_bias = param(nnx.initializers.zeros, (cfg.conv_channels,), "ssm_conv")
        self.dt_bias = param(dt_bias_init, (h,), "ssm_heads")
        self.A_log = param(a_log_init, (h,), "ssm_heads")
        self.D = param(nnx.initializers.ones, (h,), "ssm_heads")
        self.norm = nnx.RMSNorm(cfg.d_inner, epsilon=1e-5, dtype=jnp.float32,
                                param_dtype=jnp.float32, rngs=rngs,
                                scale_init=axes(nnx.initializers.ones, "norm"))

    def __call__(self, u: jax.Array) -> jax.Array:
        cfg = self.cfg
        bsz, seq, _ = u.shape
        di, n, h = cfg.d_inner, cfg.state, cfg.ssm_heads
        zxbc_dt = self.in_proj(u).astype(jnp.float32)
        z, xbc, dt = jnp.split(zxbc_dt, [di, 2 * di + 2 * n], axis=-1)
        xbc = nnx.silu(causal_conv(xbc, self.conv_kernel[...], self.conv_bias[...]))
        x, b, c = jnp.split(xbc, [di, di + n], axis=-1)
        x = x.reshape(bsz, seq, h, cfg.ssm_head_dim)
        dt = jax.nn.softplus(dt + self.dt_bias[...])
        y = ssd_scan(x, dt, -jnp.exp(self.A_log[...]), b, c, chunk=cfg.chunk)
        y = (y + self.D[...][:, None] * x).reshape(bsz, seq, di)
        return self.out_proj(self.norm(y * nnx.silu(z)).astype(cfg.compute_dtype))


class Block(nnx.Module):
    """Pre-norm residual block ``x + mixer(RMSNorm(x))``; the mixer's attribute is named
    for its kind (``mamba``, ``attn``, ``mlp``), so policies can match it by path."""

    def __init__(self, cfg: HybridConfig, kind: str, *, rngs: nnx.Rngs):
        self.kind = kind
        self.norm = nnx.RMSNorm(cfg.dim, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
                                scale_init=axes(nnx.initializers.ones, "norm"), rngs=rngs)
        if kind == MAMBA:
            self.mamba = Mamba2(cfg, rngs=rngs)
        elif kind == ATTENTION:
            self.attn = Attention(cfg.llama_config(), rngs=rngs)
        elif kind == MLP:
            self.mlp = SwiGLU(cfg.llama_config(), rngs=rngs)
        else:
            raise ValueError(f"block kind must be one of {MAMBA!r}, {ATTENTION!r}, {MLP!r}, "
                             f"got {kind!r}")

    def __call__(self, x: jax.Array) -> jax.Array:
        mixer = {MAMBA: "mamba", ATTENTION: "attn", MLP: "mlp"}[self.kind]
        return x + getattr(self, mixer)(self.norm(x))


class Hybrid(LanguageModel):
    """Token embedding → blocks (`HybridConfig.pattern`) → RMSNorm → head (float32 logits).

    Example:
      >>> cfg = HybridConfig(dim=32, layers=2, attn_every=2, heads=2, state=8,
      ...                    ssm_head_dim=16, chunk=4, dtype="float32")
      >>> model = Hybrid(cfg, rngs=nnx.Rngs(0))
      >>> cfg.pattern, model(jnp.zeros((1, 6), jnp.int32)).shape
      ('M-*-', (1, 6, 256))
    """

    def __init__(self, cfg: HybridConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, lambda: [Block(cfg, k, rngs=rngs) for k in cfg.pattern],
                         rngs=rngs)
