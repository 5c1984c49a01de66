"""Policies: regex rules over module paths, first match wins, unused rules reported."""

import warnings

import jax
import jax.numpy as jnp
import pytest
from flax import linen, nnx

import fp4jax
from fp4jax.flax import Policy, Rule, high_precision_rules, keep_blocks, paper_policy

NV, BF = fp4jax.Recipe.nvfp4(), fp4jax.Recipe.bf16()
LAYERS = [("blocks.0.attn.q", "Linear"), ("blocks.0.mlp.up", "Linear"),
          ("blocks.1.attn.q", "Linear"), ("blocks.1.mlp.up", "Linear"), ("lm_head", "Linear")]


def test_first_matching_rule_wins():
    """Order matters: an earlier, more specific rule shadows a later general one."""
    p = Policy(rules=(Rule(pattern=r"blocks\.0\..*", recipe=BF), Rule(pattern=r".*", recipe=None)),
               default=NV)
    r = p.decide(LAYERS)
    assert [d.rule for d in r.decisions] == [0, 0, 1, 1, 1]
    assert [d.recipe for d in r.decisions] == [BF, BF, None, None, None]
    swapped = Policy(rules=p.rules[::-1], default=NV).decide(LAYERS)
    assert all(d.recipe is None for d in swapped.decisions)
    assert swapped.unused_rules == (p.rules[0],)


def test_unmatched_layers_get_the_default_and_patterns_match_whole_paths():
    p = Policy(rules=(Rule(pattern="attn", recipe=None),), default=NV)
    r = p.decide(LAYERS)
    assert all(d.rule is None and d.recipe == NV for d in r.decisions)  # fullmatch, not search
    assert r.unused_rules == p.rules


def test_unused_rules_are_reported_warned_and_strict_raises():
    model = nnx.Sequential(nnx.Linear(16, 16, rngs=nnx.Rngs(0)))
    p = Policy(rules=(Rule(pattern=r"typo\..*", recipe=None),) + high_precision_rules())
    with pytest.warns(UserWarning, match=r"typo"):
        report = fp4jax.flax.nnx.quantize(model, p)
    assert report.unused_rules[0].pattern == r"typo\..*"
    assert len(report.unused_rules) == 1 + len(high_precision_rules())
    assert "unused rule: 'typo" in str(report)
    with pytest.raises(ValueError, match="matched no layer"):
        fp4jax.flax.nnx.quantize(nnx.Sequential(nnx.Linear(16, 16, rngs=nnx.Rngs(0))), p,
                                 strict=True)
    with warnings.catch_warnings():  # optional preset rules alone do not warn
        warnings.simplefilter("error")
        fp4jax.flax.nnx.quantize(nnx.Sequential(nnx.Linear(16, 16, rngs=nnx.Rngs(0))),
                                 Policy(rules=high_precision_rules()))


def test_bad_rules_are_clear_errors():
    with pytest.raises(ValueError, match=r"Rule pattern 'blocks\.\(' is not a valid regular"):
        Rule(pattern=r"blocks.(", recipe=None)
    with pytest.raises(TypeError, match="Rule recipe must be"):
        Rule(pattern=".*", recipe="nvfp4")
    with pytest.raises(TypeError, match="Policy rules must be"):
        Policy(rules=(".*",))
    with pytest.raises(TypeError, match="policy must be"):
        fp4jax.flax.nnx.quantize(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), policy=[".*"])
    with pytest.raises(ValueError, match="exceeds num_blocks"):
        keep_blocks(first=3, last=2, num_blocks=4)


def test_keep_blocks_selects_first_and_last_blocks_in_nnx_and_linen_spellings():
    (rule,) = keep_blocks(first=1, last=2, num_blocks=10)
    kept = [i for i in range(10) if rule.matches(f"blocks.{i}.mlp.up")]
    assert kept == [0, 8, 9]
    assert rule.matches("model.layers_9.attn.q") and not rule.matches("blocks.10.mlp.up")
    assert keep_blocks(first=0, last=0, num_blocks=4) == ()


def test_paper_policy_keeps_head_embeddings_norms_and_kept_blocks_high_precision():
    p = paper_policy(num_blocks=4, first=1, last=1)
    hp = ["lm_head", "head", "tok_embed", "blocks.2.norm.proj", "blocks.1.attn.qk",
          "blocks.0.mlp.up", "blocks.3.attn.query"]
    q = ["blocks.1.attn.query", "blocks.2.mlp.down", "blocks.1.attn.out", "blocks.2.attn.output"]
    assert all(p.match(x)[1] is None for x in hp)
    assert all(p.match(x)[1] == NV for x in q)


def test_paper_policy_recognises_common_head_and_embedding_names():
    """Heads of Flax's examples (lm1b's ``logitdense``, the nnx MiniGPT's ``output_layer``)
    and other common spellings stay high precision; attention/MLP projections do not."""
    p = paper_policy(num_blocks=2)
    hp = ["logitdense", "decoder.logitdense", "output_layer", "lm_head", "model.lm_head",
          "cls_head", "head", "logits", "to_logits", "unembed", "embed", "token_embedding",
          "decoder.embed_tokens", "classifier", "model.classifier"]
    q = ["blocks.0.attn.out", "blocks.1.attn.output", "blocks.0.mlp.dense", "blocks.1.attn.query",
         "layers_0.MultiHeadDotProductAttention_0.query", "decoder.blocks.0.mlp.wo"]
    assert [x for x in hp if p.match(x)[1] is not None] == []
    assert [x for x in q if p.match(x)[1] != NV] == []


class _Readout(nnx.Module):
    """A model whose output layer has a name no rule knows, defined last."""

    def __init__(self, rngs):
        self.blocks = nnx.List([nnx.Linear(16, 16, rngs=rngs) for _ in range(2)])
        self.readout = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return self.readout(x)


def _readout():
    return nnx.eval_shape(lambda: _Readout(nnx.Rngs(0)))  # abstract: policies need no values


def test_paper_policy_keeps_the_last_matmul_layer_whatever_its_name():
    """By default the model's last matmul layer (the one producing the logits) stays in
    high precision and the report says why; keep_last=False or an explicit rule wins."""
    report = fp4jax.flax.nnx.quantize(_readout(), paper_policy(num_blocks=2))
    assert report.quantized == ("blocks.0", "blocks.1") and report.high_precision == ("readout",)
    assert "last matmul layer" in str(report)
    report = fp4jax.flax.nnx.quantize(_readout(),
                                      paper_policy(num_blocks=2, keep_last=False))
    assert "readout" in report.quantized
    explicit = paper_policy(num_blocks=2, extra_rules=[Rule(pattern="readout", recipe=NV)])
    assert "readout" in fp4jax.flax.nnx.quantize(_readout(), explicit).quantized


class _Lm1b(linen.Module):
    """lm1b-like linen names: a Dense head called ``logitdense``, one called last."""

    head_name: str = "logitdense"

    @linen.compact
    def __call__(self, x):
        x = linen.Dense(16, name="mlp")(x)
        return linen.Dense(4, name=self.head_name)(x)


def test_linen_quantize_keeps_named_and_last_heads():
    """linen: a recognised head name is kept; an unknown one is kept when quantize knows
    the call order (``layers=matmul_layers(...)``) and otherwise a warning names it."""
    x = jnp.ones((2, 16))
    variables = _Lm1b().init(jax.random.key(0), x)
    policy = paper_policy(num_blocks=0)
    def run(model, **kw):  # decisions are made while tracing: no need to compute
        def apply():
            with fp4jax.flax.step_scope(jax.random.key(1)), \
                    fp4jax.flax.linen.quantize(policy, **kw) as rec:
                model.apply(variables, x)
            return rec

        recs = []
        jax.eval_shape(lambda: recs.append(apply()))
        return recs[0]

    rec = run(_Lm1b())
    assert rec.report().quantized == ("mlp",) and rec.report().high_precision == ("logitdense",)

    model = _Lm1b(head_name="readout")
    variables = model.init(jax.random.key(0), x)
    layers = fp4jax.flax.linen.matmul_layers(model, x)
    assert layers == (("mlp", "Dense"), ("readout", "Dense"))
    rec = run(model, layers=layers)
    assert rec.report().high_precision == ("readout",)
    assert "last matmul layer" in str(rec.report())
    with pytest.warns(UserWarning, match="readout"):
        run(model)


class _ConvNet(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 8, (3, 3), rngs=rngs)
        self.proj = nnx.Linear(8, 8, rngs=rngs)
        self.head = nnx.Linear(8, 2, rngs=rngs)


class _LinenConvNet(linen.Module):
    @linen.compact
    def __call__(self, x):
        x = linen.Conv(8, (3, 3))(x)
        x = linen.Einsum((8, 8), "bhwc,cd->bhwd")(x)
        return linen.Dense(8)(x)


def test_report_lists_every_matmul_like_layer_and_what_it_skipped():
    """Conv (nnx and linen) and linen Einsum layers are listed as "not supported: left
    as is", so the report never hides a matmul that stays in high precision."""
    report = fp4jax.flax.nnx.quantize(nnx.eval_shape(lambda: _ConvNet(nnx.Rngs(0))), Policy())
    assert [d.path for d in report.decisions] == ["conv", "head", "proj"]
    assert report.quantized == ("head", "proj") and report.unsupported == ("conv",)
    assert "conv" not in report.high_precision
    text = str(report)
    assert "not supported: left as is" in text and "2 of 3 matmul layers quantized" in text

    x = jnp.ones((1, 4, 4, 3))
    variables = jax.eval_shape(_LinenConvNet().init, jax.random.key(0), x)
    recs = []

    def apply(variables):
        with fp4jax.flax.step_scope(jax.random.key(1)), fp4jax.flax.linen.quantize() as rec:
            _LinenConvNet().apply(variables, x)
        recs.append(rec)

    jax.eval_shape(apply, variables)
    r = recs[0].report()
    assert [(d.path, d.kind) for d in r.decisions] == [
        ("Conv_0", "Conv"), ("Einsum_0", "Einsum"), ("Dense_0", "Dense")]
    assert r.quantized == ("Dense_0",) and r.unsupported == ("Conv_0", "Einsum_0")
