"""Policies: regex rules over module paths, first match wins, unused rules reported."""

import warnings

import pytest
from flax import nnx

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
