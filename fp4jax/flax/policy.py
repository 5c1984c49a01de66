"""Which layers of a model run in NVFP4: ordered regex rules over module paths.

A `Policy` maps each matmul layer's path (``"blocks.3.mlp.up"``: the attribute and
index names from the model root, joined by dots) to a `Recipe`, or to None (leave
the layer as it is, in high precision). Rules are tried in order; the first whose
``pattern`` `re.fullmatch`-es the path wins; paths no rule matches get
``Policy.default``. Rules that matched no layer are listed in the `Report`.

Presets (RECIPE.md §7): `keep_blocks` (first N / last M blocks in BF16) and
`high_precision_rules` (embeddings, output heads, norms, attention score/value
products); `paper_policy` combines them and, with ``keep_last``, also keeps the
model's last matmul layer (the one producing the logits) whatever its name.

Layers fp4jax finds but does not quantize (convolutions, linen ``nn.Einsum``) are
listed in the `Report` as "not supported: left as is": a report never hides a matmul
that stays in high precision. Convolutions are not converted because the paper's
recipe is defined for the GEMMs of linear layers (blocks along the contraction, the
Hadamard transform along tokens for wgrad); a convolution is a GEMM only after an
im2col that multiplies its memory traffic, and no result says how its SR/RHT
choices should be made. linen ``nn.Einsum`` calls ``jnp.einsum`` directly and has no
``dot_general`` to replace.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Sequence

from fp4jax.recipe import Recipe

ROOT_NAME = "root"
"""The path name of a layer that is itself the model root (its path is empty)."""

NOT_SUPPORTED = "not supported: left as is"
"""The `Decision.note` of a matmul-like layer fp4jax does not convert."""

KEPT_LAST = "last matmul layer: kept in high precision (keep_last)"
"""The `Decision.note` of the layer ``Policy.keep_last`` kept out of NVFP4."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    """One policy rule.

    Attributes:
      pattern: a regular expression that must match the whole module path.
      recipe: the `Recipe` for matching layers, or None to leave them unquantized
        (their ``dot_general`` is not touched).
      optional: a rule that may legitimately match nothing (the presets of
        `high_precision_rules`); still listed in `Report.unused_rules`, but
        `fp4jax.flax.nnx.quantize` does not warn about it.

    Example:
      >>> from fp4jax.flax import Rule
      >>> Rule(pattern=r".*\\.mlp\\..*", recipe=None).matches("blocks.0.mlp.up")
      True
      >>> Rule(pattern="(", recipe=None)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: Rule pattern '(' is not a valid regular expression: missing ), ...
    """

    pattern: str
    recipe: Recipe | None
    optional: bool = False
    _regex: re.Pattern = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.pattern, str):
            raise TypeError(f"Rule pattern must be a str, got {type(self.pattern).__name__}")
        if self.recipe is not None and not isinstance(self.recipe, Recipe):
            raise TypeError(
                f"Rule recipe must be an fp4jax.Recipe or None, got {type(self.recipe).__name__}"
            )
        try:
            regex = re.compile(self.pattern)
        except re.error as e:
            raise ValueError(
                f"Rule pattern {self.pattern!r} is not a valid regular expression: {e}"
            ) from None
        object.__setattr__(self, "_regex", regex)

    def matches(self, path: str) -> bool:
        """Whether the pattern matches the whole ``path``."""
        return self._regex.fullmatch(path) is not None


def recipe_name(recipe: Recipe | None) -> str:
    """A short name: ``"nvfp4"``, ``"bf16"``, ``"nvfp4+bf16_forward"``, ``"custom"``, ...

    None (the layer is left as it is) is ``"unchanged"``.
    """
    if recipe is None:
        return "unchanged"
    for name, r in (
        ("nvfp4", Recipe.nvfp4()),
        ("bf16", Recipe.bf16()),
        ("nvfp4+bf16_forward", Recipe.nvfp4().with_bf16_forward()),
        ("nvfp4_no_rht", Recipe.nvfp4_no_rht()),
        ("nvfp4_no_sr", Recipe.nvfp4_no_sr()),
        ("nvfp4_no_2d", Recipe.nvfp4_no_2d()),
        ("nvfp4_four_over_six", Recipe.nvfp4_four_over_six()),
    ):
        if recipe == r:
            return name
    return "custom"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """What a policy chose for one layer.

    Attributes:
      path: the module path.
      kind: the layer type (``"Linear"``, ``"LinearGeneral"``, ``"Einsum"``, ``"Conv"``, ...).
      rule: index of the matching rule, or None when the default applied (or the
        layer is not supported, or ``keep_last`` kept it).
      recipe: the chosen recipe; None leaves the layer unchanged.
      supported: whether fp4jax can convert this kind of layer at all.
      note: why, when neither a rule nor the default decided (`NOT_SUPPORTED`,
        `KEPT_LAST`); empty otherwise.
    """

    path: str
    kind: str
    rule: int | None
    recipe: Recipe | None
    supported: bool = True
    note: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Report:
    """The outcome of applying a `Policy` to a model.

    Attributes:
      decisions: one `Decision` per matmul layer, in traversal order.
      unused_rules: the rules that matched no layer (likely typos).
    """

    decisions: tuple[Decision, ...]
    unused_rules: tuple[Rule, ...]

    @property
    def unexpected_unused(self) -> tuple[Rule, ...]:
        """The unused rules that are not ``optional`` (worth a warning)."""
        return tuple(r for r in self.unused_rules if not r.optional)

    @property
    def quantized(self) -> tuple[str, ...]:
        """Paths of the layers that got a recipe with some NVFP4 GEMM."""
        return tuple(
            d.path for d in self.decisions if d.recipe is not None and not d.recipe.is_bf16
        )

    @property
    def high_precision(self) -> tuple[str, ...]:
        """Paths of the supported layers left unchanged or set to BF16."""
        return tuple(
            d.path for d in self.decisions
            if d.supported and (d.recipe is None or d.recipe.is_bf16)
        )

    @property
    def unsupported(self) -> tuple[str, ...]:
        """Paths of the matmul-like layers fp4jax cannot convert (left as they are)."""
        return tuple(d.path for d in self.decisions if not d.supported)

    def __str__(self) -> str:
        width = max([4] + [len(d.path) for d in self.decisions])
        lines = [f"{'path':<{width}}  {'kind':<13}  {'rule':>4}  recipe"]
        for d in self.decisions:
            rule = "-" if d.rule is None else str(d.rule)
            recipe = "-" if not d.supported else recipe_name(d.recipe)
            note = f"  ({d.note})" if d.note else ""
            lines.append(f"{d.path:<{width}}  {d.kind:<13}  {rule:>4}  {recipe}{note}")
        skipped = f", {len(self.unsupported)} {NOT_SUPPORTED}" if self.unsupported else ""
        lines.append(
            f"{len(self.quantized)} of {len(self.decisions)} matmul layers quantized{skipped}"
        )
        for r in self.unexpected_unused:
            lines.append(f"unused rule: {r.pattern!r} -> {recipe_name(r.recipe)}")
        if n := len(self.unused_rules) - len(self.unexpected_unused):
            lines.append(f"{n} optional preset rule(s) matched no layer (see unused_rules)")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    """Ordered rules (first match wins) plus a default for unmatched layers.

    Attributes:
      rules: the `Rule`\\ s, tried in order.
      default: the recipe for layers no rule matches (None: leave them unchanged).
      keep_last: leave the model's last matmul layer (the one producing the logits)
        unchanged when no rule matches it, whatever its name. "Last" is the last in
        definition order for nnx models (`fp4jax.flax.nnx.quantize`) and the last
        called for linen (`fp4jax.flax.linen.quantize` with ``layers=``).

    Example:
      >>> import fp4jax
      >>> from fp4jax.flax import Policy, Rule
      >>> p = Policy(rules=(Rule(pattern=r"head", recipe=None),
      ...                   Rule(pattern=r"unused\\..*", recipe=None)))
      >>> r = p.decide([("blocks.0.up", "Linear"), ("head", "Linear")])
      >>> r.quantized, [u.pattern for u in r.unused_rules]
      (('blocks.0.up',), ['unused\\\\..*'])
    """

    rules: tuple[Rule, ...] = ()
    default: Recipe | None = dataclasses.field(default_factory=Recipe.nvfp4)
    keep_last: bool = False

    def __post_init__(self):
        rules = tuple(self.rules)
        for r in rules:
            if not isinstance(r, Rule):
                raise TypeError(f"Policy rules must be fp4jax.flax.Rule, got {type(r).__name__}")
        object.__setattr__(self, "rules", rules)
        if self.default is not None and not isinstance(self.default, Recipe):
            raise TypeError(
                "Policy default must be an fp4jax.Recipe or None, got "
                f"{type(self.default).__name__}"
            )
        if not isinstance(self.keep_last, bool):
            raise TypeError(f"Policy keep_last must be a bool, got {self.keep_last!r}")

    def match(self, path: str) -> tuple[int | None, Recipe | None]:
        """(index of the first matching rule or None, the recipe for ``path``)."""
        for i, r in enumerate(self.rules):
            if r.matches(path):
                return i, r.recipe
        return None, self.default

    def decide_one(self, path: str, kind: str, *, supported: bool = True,
                   last: bool = False) -> Decision:
        """The `Decision` for one layer; ``last``: it is the model's last matmul layer."""
        if not supported:
            return Decision(path=path, kind=kind, rule=None, recipe=None, supported=False,
                            note=NOT_SUPPORTED)
        i, recipe = self.match(path)
        if last and self.keep_last and i is None and recipe is not None:
            return Decision(path=path, kind=kind, rule=None, recipe=None, note=KEPT_LAST)
        return Decision(path=path, kind=kind, rule=i, recipe=recipe)

    def report(self, decisions: Iterable[Decision]) -> Report:
        """The `Report` of ``decisions`` (the rules none of them used are unused)."""
        decisions = tuple(decisions)
        used = {d.rule for d in decisions}
        unused = tuple(r for i, r in enumerate(self.rules) if i not in used)
        return Report(decisions=decisions, unused_rules=unused)

    def decide(
        self,
        layers: Iterable[tuple[str, str]],
        *,
        last: str | None = None,
        unsupported: Collection[str] = (),
    ) -> Report:
        """Decides every ``(path, kind)`` layer; see `Report`.

        Args:
          layers: the matmul-like layers, in the order the report lists them.
          last: the path of the model's last matmul layer (for ``keep_last``).
          unsupported: paths of layers fp4jax cannot convert (reported, not matched).
        """
        unsupported = set(unsupported)
        return self.report(
            self.decide_one(path, kind, supported=path not in unsupported, last=path == last)
            for path, kind in layers
        )


def keep_blocks(
    *,
    first: int,
    last: int,
    num_blocks: int,
    block_pattern: str = r"(?:.*\.)?(?:blocks|layers|h)[._]",
    recipe: Recipe | None = None,
) -> tuple[Rule, ...]:
    """Rules keeping the first ``first`` and last ``last`` transformer blocks out of NVFP4.

    A block's layers have paths ``<block_pattern><index>.<rest>`` — by default
    ``blocks.3.mlp.up`` (nnx lists), ``blocks_3.mlp.up`` (linen) and the ``layers``/``h``
    spellings.

    Args:
      first: number of leading blocks to keep.
      last: number of trailing blocks to keep.
      num_blocks: the model's number of blocks.
      block_pattern: regex for the path up to the block index.
      recipe: recipe for the kept blocks (None: unchanged; or `Recipe.bf16`).

    Example:
      >>> from fp4jax.flax import keep_blocks
      >>> [r.pattern for r in keep_blocks(first=1, last=2, num_blocks=8)]
      ['(?:.*\\\\.)?(?:blocks|layers|h)[._](?:0|6|7)\\\\..*']
    """
    for name, v in (("first", first), ("last", last), ("num_blocks", num_blocks)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    if first + last > num_blocks:
        raise ValueError(f"first={first} + last={last} exceeds num_blocks={num_blocks}")
    idx = sorted(set(range(first)) | set(range(num_blocks - last, num_blocks)))
    if not idx:
        return ()
    return (Rule(pattern=f"{block_pattern}(?:{'|'.join(map(str, idx))})\\..*", recipe=recipe),)


HEAD_NAMES: tuple[str, ...] = (
    r"lm_head", r"\w+_head", r"\w*logits?\w*", r"unembed\w*", r"output_layer", r"classifier",
)
"""Regexes for an output-head layer's own name, anywhere in the model (Flax's lm1b
``logitdense``, the nnx MiniGPT's ``output_layer``, ``lm_head``, ``cls_head``, ...)."""

TOP_LEVEL_HEAD_NAMES: tuple[str, ...] = (r"head", r"output", r"out", r"fc")
"""Names that mean "output head" only at the top level (``blocks.0.attn.output`` is not)."""


def high_precision_rules(*, recipe: Recipe | None = None) -> tuple[Rule, ...]:
    """Rules keeping embeddings, output heads, norms and attention score/value
    products out of NVFP4 (RECIPE.md §7).

    Embedding lookups and norms are not matmul layers, so these rules only act on
    matmul layers named like them: an output head anywhere (`HEAD_NAMES`: ``lm_head``,
    ``*_head``, ``*logit*``, ``unembed*``, ``output_layer``, ``classifier``), a
    top-level ``head``/``output``/``out``/``fc``, a ``*embed*`` projection, anything
    under a ``*norm*`` module, and einsum layers named for attention scores or values
    (``qk``, ``scores``, ``attn_weights``, ``pv``, ``av``). The score/value products of
    ``nnx.MultiHeadAttention`` are not layers and stay in high precision anyway. A head
    with another name is caught by ``Policy.keep_last`` (on in `paper_policy`).

    Example:
      >>> from fp4jax.flax import Policy, high_precision_rules
      >>> p = Policy(rules=high_precision_rules())
      >>> [p.match(x)[1] is None for x in ("logitdense", "blocks.0.attn.query", "tok_embed")]
      [True, False, True]
    """
    patterns = (
        rf"(?:.*\.)?(?:{'|'.join(HEAD_NAMES)})|{'|'.join(TOP_LEVEL_HEAD_NAMES)}",
        r"(?:.*\.)?\w*embed\w*(?:\..*)?",
        r"(?:.*\.)?\w*norm\w*(?:\..*)?",
        r"(?:.*\.)?(?:qk|scores?|attn_weights|pv|av|attn_values?)",
    )
    return tuple(Rule(pattern=p, recipe=recipe, optional=True) for p in patterns)


def paper_policy(
    *,
    num_blocks: int,
    first: int = 0,
    last: int = 0,
    recipe: Recipe | None = None,
    extra_rules: Sequence[Rule] = (),
    keep_last: bool = True,
) -> Policy:
    """NVFP4 everywhere except the high-precision parts and the kept blocks.

    ``extra_rules`` come first (they win). The paper kept the first 2 and last 8 of
    62 blocks at 12B and the last 4 at 1.2B–8B (RECIPE.md §7). With ``keep_last``
    (the default) the model's last matmul layer stays in high precision even when its
    name is not a known head name (unless a rule names it); the report says so.

    Example:
      >>> from fp4jax.flax import paper_policy
      >>> p = paper_policy(num_blocks=4, last=1)
      >>> [p.match(x)[1] is not None for x in ("blocks.0.mlp.up", "blocks.3.mlp.up", "head")]
      [True, False, False]
    """
    recipe = Recipe.nvfp4() if recipe is None else recipe
    rules = tuple(extra_rules) + high_precision_rules() + keep_blocks(
        first=first, last=last, num_blocks=num_blocks
    )
    return Policy(rules=rules, default=recipe, keep_last=keep_last)
