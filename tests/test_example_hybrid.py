"""examples/hybrid.py: the Mamba-2 scan, causality, parameters, the NVFP4 policy on the
hybrid, and ``train_llama.py --model hybrid``."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import compare  # noqa: E402
import train_llama  # noqa: E402
from hybrid import Hybrid, HybridConfig, causal_conv, segsum, ssd_scan  # noqa: E402

import fp4jax  # noqa: E402

TINY = dict(dim=32, heads=2, state=8, ssm_head_dim=16, chunk=4, dtype="float32")
"""A tiny hybrid: 4 Mamba heads of width 16, state 8, chunks of 4 tokens."""

TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 11)), jnp.int32)
"""Two sequences of 11 tokens: three chunks, the last one padded."""


@pytest.fixture(scope="module")
def tiny():
    """``(config, model, jitted forward)`` of a tiny ``M-*-M-`` hybrid, built and compiled
    once for the module (tests that convert it convert a clone)."""
    cfg = HybridConfig(layers=3, attn_every=3, **TINY)
    return cfg, Hybrid(cfg, rngs=nnx.Rngs(0)), nnx.jit(lambda m, t: m(t))


def sequential_scan(x, dt, a, b, c):
    """The recurrence itself, one token at a time (`jax.lax.scan`), float32 throughout:
    ``h_t = exp(dt_t a) h_{t-1} + dt_t x_t b_tᵀ``, ``y_t = h_t c_t``."""

    def step(h, inputs):
        xt, dtt, bt, ct = inputs  # (B, H, P), (B, H), (B, N), (B, N)
        h = (jnp.exp(dtt * a)[:, :, None, None] * h
             + (dtt[:, :, None] * xt)[..., None] * bt[:, None, None, :])
        return h, jnp.einsum("bhpn,bn->bhp", h, ct, precision="highest")

    h0 = jnp.zeros((x.shape[0], x.shape[2], x.shape[3], b.shape[-1]), jnp.float32)
    _, ys = jax.lax.scan(step, h0, tuple(t.swapaxes(0, 1) for t in (x, dt, b, c)))
    return ys.swapaxes(0, 1)


def _scan_inputs(seq=21, seed=0):
    r = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(r.normal(size=s), jnp.float32)  # noqa: E731
    dt = jax.nn.softplus(f(2, seq, 3) - 1.0)
    a = -jnp.asarray(r.uniform(0.5, 4.0, 3), jnp.float32)
    return f(2, seq, 3, 4), dt, a, f(2, seq, 5), f(2, seq, 5)


def test_chunked_scan_equals_the_sequential_recurrence():
    """SSD with chunks of 1 (a pure cross-chunk recurrence), of 4 (several chunks, the
    last one padded) and of 32 (one padded chunk, a pure intra-chunk product) equals the
    token-by-token recurrence to float32 rounding (measured: 1e-6 of the largest
    output); a wrong decay exponent, an off-by-one in the segment sums or a lost
    cross-chunk state is off by O(1)."""
    x, dt, a, b, c = _scan_inputs()
    want = jax.jit(sequential_scan)(x, dt, a, b, c)
    scan = jax.jit(ssd_scan, static_argnames="chunk")
    for chunk in (1, 4, 32):
        got = scan(x, dt, a, b, c, chunk=chunk)
        assert got.shape == want.shape and got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=1e-5,
                                   atol=1e-5 * float(jnp.abs(want).max()), err_msg=f"{chunk=}")


def test_segsum_and_causal_conv_match_their_definitions():
    """`segsum` sums ``x[j+1..i]`` below the diagonal (-inf above); `causal_conv` is
    ``bias + Σ_w kernel[w] · u[t - 3 + w]`` with zeros before the start."""
    r = np.random.default_rng(1)
    x = r.normal(size=(2, 6)).astype(np.float32)
    want = np.array([[[x[b, j + 1:i + 1].sum() if i >= j else -np.inf for j in range(6)]
                      for i in range(6)] for b in range(2)])
    np.testing.assert_allclose(np.asarray(segsum(jnp.asarray(x))), want, rtol=1e-6, atol=1e-6)
    u, k = r.normal(size=(1, 7, 3)).astype(np.float32), r.normal(size=(4, 3)).astype(np.float32)
    padded = np.concatenate([np.zeros((1, 3, 3), np.float32), u], axis=1)
    want = np.stack([(k * padded[0, t:t + 4]).sum(0) for t in range(7)]) + 1.0
    got = causal_conv(jnp.asarray(u), jnp.asarray(k), jnp.ones(3))
    np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-5, atol=1e-6)


def test_model_is_causal(tiny):
    """Changing the tokens after position t changes no logit at or before t (conv, scan,
    chunk padding and attention all look back only), and does change later ones."""
    _, model, fwd = tiny
    t = 5
    other = TOKENS.at[:, t + 1:].set((TOKENS[:, t + 1:] + 17) % 256)
    y, y2 = fwd(model, TOKENS), fwd(model, other)
    np.testing.assert_allclose(y2[:, :t + 1], y[:, :t + 1], rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(y2[:, t + 1:] - y[:, t + 1:]).min(axis=-1).max()) > 0


def test_pattern_shapes_and_logical_axes(tiny):
    """The block pattern, the logits' shape and dtype, FP32 parameters each naming one
    logical axis per dimension, `param_counts` equal to the parameters built, and the
    Mamba-2 initial ``A`` and ``dt`` ranges."""
    cfg, model, fwd = tiny
    assert cfg.pattern == "M-*-M-" and cfg.num_blocks == 6
    logits = fwd(model, TOKENS)
    assert logits.shape == (2, 11, 256) and logits.dtype == jnp.float32
    names = {}
    for path, p in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = p.get_metadata().get("out_sharding")
        assert p.get_value().dtype == jnp.float32, path
        assert axes is not None and len(axes) == p.get_value().ndim, (path, axes)
        names[".".join(map(str, path))] = tuple(axes)
    assert names["blocks.0.mamba.in_proj.kernel"] == ("embed", "ssm_proj")
    assert names["blocks.0.mamba.out_proj.kernel"] == ("ssm_inner", "embed")
    assert names["blocks.0.mamba.conv_kernel"] == ("conv_width", "ssm_conv")
    assert names["blocks.4.mamba.A_log"] == names["blocks.4.mamba.D"] == ("ssm_heads",)
    assert names["blocks.2.attn.q.kernel"] == ("embed", "heads")
    assert names["blocks.5.mlp.down.kernel"] == ("mlp", "embed")
    assert names["embed.embedding"] == ("vocab", "embed")
    size = sum(int(np.prod(p.get_value().shape))
               for _, p in nnx.to_flat_state(nnx.state(model, nnx.Param)))
    assert cfg.param_counts()["total"] == size
    mamba = model.blocks[0].mamba
    assert bool(jnp.all(-jnp.exp(mamba.A_log[...]) <= -1.0))  # A in [-16, -1]
    dt = jax.nn.softplus(mamba.dt_bias[...])
    assert bool(jnp.all((dt >= 1e-3 * 0.999) & (dt <= 0.1 * 1.001)))


def test_config_rejects_bad_sizes():
    for kwargs, what in [(dict(layers=0), "layers"), (dict(attn_every=-1), "attn_every"),
                         (dict(dim=80, ssm_head_dim=64), "ssm_head_dim"),
                         (dict(dim=30, heads=4), "heads"), (dict(mlp=1), "mlp"),
                         (dict(embed_lookup="take"), "embed_lookup")]:
        with pytest.raises(ValueError, match=what):
            HybridConfig(**kwargs)
    assert HybridConfig(layers=2, attn_every=0).pattern == "M-M-"
    assert HybridConfig(layers=2, attn_every=1, mlp=False).pattern == "**"


def test_paper_policy_quantizes_the_projections_and_counts_blocks_of_every_type(tiny):
    """`paper_policy` on the hybrid: the Mamba in/out projections, q/k/v/o and the MLP
    are the only matmul layers and go to NVFP4; the head stays high precision; the
    convolution and the scan are no layer at all (nothing unsupported); keep_first/last
    count the blocks in order whatever their type (here the last three are MLP, Mamba,
    MLP)."""
    cfg, model, _ = tiny  # M-*-M-
    policy = fp4jax.flax.paper_policy(num_blocks=cfg.num_blocks, first=1, last=3)
    report = fp4jax.flax.nnx.quantize(nnx.clone(model), policy)
    assert set(report.quantized) == {
        "blocks.1.mlp.gate", "blocks.1.mlp.up", "blocks.1.mlp.down",
        "blocks.2.attn.q", "blocks.2.attn.k", "blocks.2.attn.v", "blocks.2.attn.o"}
    assert set(report.high_precision) == {
        "lm_head", "blocks.0.mamba.in_proj", "blocks.0.mamba.out_proj",
        "blocks.3.mlp.gate", "blocks.3.mlp.up", "blocks.3.mlp.down",
        "blocks.4.mamba.in_proj", "blocks.4.mamba.out_proj",
        "blocks.5.mlp.gate", "blocks.5.mlp.up", "blocks.5.mlp.down"}
    assert report.unsupported == ()
    full = fp4jax.flax.nnx.quantize(nnx.clone(model),
                                    fp4jax.flax.paper_policy(num_blocks=cfg.num_blocks))
    assert len(full.quantized) == 2 * 2 + 4 + 3 * 3 and full.high_precision == ("lm_head",)


def test_nvfp4_forward_differs_from_the_unquantized_one_but_stays_close(tiny):
    """The same weights with the first Mamba mixer's ``in_proj`` in NVFP4 (one layer: each
    quantized layer costs seconds of CPU compilation) give other logits — quantization
    happened — yet close ones: measured 17% relative (4-bit operands are off by ~10% rms
    per GEMM, and at init that block's output dominates the residual stream), where an
    unscaled or misplaced block would be off by O(1)."""
    cfg, model, fwd = tiny
    keep = fp4jax.flax.Rule(pattern=r"blocks\.[1-5]\..*|.*out_proj", recipe=None)
    q_model = nnx.clone(model)
    report = fp4jax.flax.nnx.quantize(
        q_model, fp4jax.flax.paper_policy(num_blocks=cfg.num_blocks, extra_rules=[keep]))
    assert report.quantized == ("blocks.0.mamba.in_proj",)

    @nnx.jit
    def q_fwd(m, t):
        with fp4jax.flax.step_scope(jax.random.key(0)):
            return m(t)

    ref, q = fwd(model, TOKENS), q_fwd(q_model, TOKENS)
    rel = float(jnp.linalg.norm(q - ref) / jnp.linalg.norm(ref))
    assert 0.01 < rel < 0.35, rel


def test_train_llama_runs_the_hybrid(tmp_path):
    """``train_llama.py --model hybrid`` trains 2 steps end to end (the shared loop, data
    and metrics) and records the model; a hybrid flag with ``--model llama`` is refused.
    One Mamba-2 block only: its training step takes seconds to compile on a CPU, and the
    attention and MLP blocks are the Llama's (tests/test_train_loop.py trains those)."""
    src = tmp_path / "corpus"
    rng = np.random.default_rng(0)
    for i in range(24):  # enough files for a validation split (by content hash)
        (src / f"p{i % 3}").mkdir(parents=True, exist_ok=True)
        text = "".join(chr(c) for c in rng.integers(32, 127, 1500))
        (src / f"p{i % 3}" / f"m{i}.py").write_text(f"# {i}\n{text}\n")
    size = ["--dim", "32", "--heads", "2", "--batch", "2", "--seq", "8", "--data", str(src)]
    summary = train_llama.main(
        ["--model", "hybrid", "--recipe", "bf16", "--steps", "2", "--layers", "1",
         "--attn-every", "0", "--no-mlp", "--state", "8", "--ssm-head-dim", "16",
         "--chunk", "4", "--eval-batches", "1", "--log-every", "1", "--dtype", "float32",
         "--out", str(tmp_path / "out")] + size)
    assert summary["steps"] == 2 and np.isfinite(summary["final_val_bpb"])
    assert summary["model"] == "hybrid" and summary["model_config"]["attn_every"] == 0
    assert summary["params"]["ssm"] > 0 and (tmp_path / "out" / "summary.json").exists()
    assert "mamba" in summary["final_state"].params["blocks"][0]
    with pytest.raises(ValueError, match="--state"):
        train_llama.main(["--state", "8"] + size)


def test_compare_table_describes_the_hybrid():
    row = {"quantized_layers": 3, "matmul_layers": 8, "steps": 10, "planned_steps": 10,
           "stopped_early": False, "tokens_seen": 1280, "epochs": 0.01, "final_train_bpb": 2.0,
           "final_val_bpb": 2.0, "step_time_s": 0.1, "final_val_bpb_bf16_forward": None}
    result = {"runs": {"bf16": dict(row, quantized_layers=0), "nvfp4": row},
              "backend": "cpu", "device": "cpu"}
    text = compare.table(result, HybridConfig(layers=2, attn_every=2, **TINY),
                         train_llama.RunConfig())
    assert text.startswith("Hybrid M-*- (1 Mamba-2, 1 attention, 2 MLP blocks)")
    assert "Mamba conv/A/D/dt" in text and "Mamba-2 scan (float32)" in text
    a = compare.parse_args(["--model", "hybrid", "--attn-every", "3", "--layers", "3"])
    assert "Hybrid M-*-M-" in compare.settings_line(a)
