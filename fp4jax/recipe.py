"""`Recipe`: how each operand of each GEMM of a linear layer is represented.

A linear layer ``Y = X W`` runs three GEMMs (docs/RECIPE.md §6):

* **fprop** ``Y = X W``: operands ``fprop_lhs`` (X) and ``fprop_rhs`` (W);
* **dgrad** ``dX = dY Wᵀ``: operands ``dgrad_grad`` (dY) and ``dgrad_rhs`` (W);
* **wgrad** ``dW = Xᵀ dY``: operands ``wgrad_lhs`` (X) and ``wgrad_grad`` (dY).

For a general ``dot_general`` "X" is the left operand, "W" the right one, and the
blocks of every NVFP4 operand run along that GEMM's contraction axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Literal

from fp4jax.numerics import hadamard
from fp4jax.numerics.rounding import ROUNDINGS, Rounding
from fp4jax.numerics.scales import SCALE_RULES, ScaleRule

Format = Literal["nvfp4", "unquantized", "bf16"]
"""``"nvfp4"``: quantized. ``"unquantized"``: used as given, in the operand's own dtype.
``"bf16"`` is a deprecated alias of ``"unquantized"`` (it is BF16 only in a BF16 model)."""

FORMATS: tuple[str, ...] = ("nvfp4", "unquantized")
_FORMAT_ALIASES = {"bf16": "unquantized"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operand:
    """How one GEMM operand is represented.

    Attributes:
      format: ``"nvfp4"`` (quantized) or ``"unquantized"`` (used as given: the GEMM
        runs in the operand's own dtype, BF16 in a BF16 model, float32 in a float32
        one). ``"bf16"`` is accepted as an alias of ``"unquantized"``.
      rounding: E2M1 rounding, ``"nearest"`` (even) or ``"stochastic"``.
      hadamard: apply the 16×16 random Hadamard transform along the contraction
        axis first. Must be set on both operands of a GEMM or on neither.
      block_2d: one scale per 16×16 tile (weights), so the same quantized values
        serve the GEMMs that contract either axis.
      scale_rule: ``"six"`` (block amax mapped to 6, the paper's rule) or
        ``"four_over_six"`` (4/6: per block or tile, the scale mapping the amax to 4 when
        its squared error is lower; docs/RECIPE.md §2.8). 4/6 needs round-to-nearest and
        no Hadamard transform, as in Transformer Engine.
    """

    format: Format = "nvfp4"
    rounding: Rounding = "nearest"
    hadamard: bool = False
    block_2d: bool = False
    scale_rule: ScaleRule = "six"

    def __post_init__(self):
        object.__setattr__(self, "format", _FORMAT_ALIASES.get(self.format, self.format))
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS} (or 'bf16'), got {self.format!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        for name in ("hadamard", "block_2d"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {self.scale_rule!r}")
        if self.format == "unquantized" and (
            self.rounding != "nearest" or self.hadamard or self.block_2d
            or self.scale_rule != "six"
        ):
            raise ValueError(
                "rounding, hadamard, block_2d and scale_rule only apply to format='nvfp4'; "
                f"got {self}"
            )
        if self.hadamard and self.block_2d:
            raise ValueError("an operand cannot use both hadamard=True and block_2d=True")
        if self.scale_rule == "four_over_six" and (self.hadamard or self.stochastic):
            raise ValueError(
                "scale_rule='four_over_six' cannot be combined with hadamard=True or "
                f"rounding='stochastic' (as in Transformer Engine); got {self}"
            )

    @property
    def quantized(self) -> bool:
        """Whether the operand is quantized to NVFP4."""
        return self.format == "nvfp4"

    @property
    def stochastic(self) -> bool:
        """Whether the operand uses stochastic rounding (needs a key)."""
        return self.quantized and self.rounding == "stochastic"


UNQUANTIZED = Operand(format="unquantized")
"""An unquantized operand (the GEMM runs in the operand's own dtype)."""

BF16 = UNQUANTIZED
"""Alias of `UNQUANTIZED` (the name the paper uses for a BF16 model)."""

_GEMMS = (
    ("fprop", "fprop_lhs", "fprop_rhs"),
    ("dgrad", "dgrad_grad", "dgrad_rhs"),
    ("wgrad", "wgrad_lhs", "wgrad_grad"),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    """Per-GEMM-role quantization settings of a linear layer (or any dot_general).

    Use the presets: `Recipe.nvfp4` (the paper's recipe), `Recipe.unquantized` (exact
    passthrough; alias `Recipe.bf16`), the ablations `Recipe.nvfp4_no_rht`, `Recipe.nvfp4_no_sr`,
    `Recipe.nvfp4_no_2d`, the 4/6 variant `Recipe.nvfp4_four_over_six`, and
    `with_unquantized_forward` (alias `with_bf16_forward`)
    for the end-of-training switch.

    Example:
      >>> import fp4jax
      >>> r = fp4jax.Recipe.nvfp4()
      >>> r.dgrad_grad.rounding, r.fprop_rhs.block_2d, r.wgrad_lhs.hadamard
      ('stochastic', True, True)
      >>> r.with_unquantized_forward().fprop_lhs.format
      'unquantized'
    """

    fprop_lhs: Operand
    fprop_rhs: Operand
    dgrad_grad: Operand
    dgrad_rhs: Operand
    wgrad_lhs: Operand
    wgrad_grad: Operand
    hadamard_signs: tuple[int, ...] = hadamard.DEFAULT_SIGNS

    def __post_init__(self):
        for gemm, a, b in _GEMMS:
            oa, ob = getattr(self, a), getattr(self, b)
            for name, o in ((a, oa), (b, ob)):
                if not isinstance(o, Operand):
                    raise TypeError(f"{name} must be an fp4jax.Operand, got {type(o).__name__}")
            if oa.quantized != ob.quantized:
                raise ValueError(
                    f"{gemm}: {a} is {oa.format} but {b} is {ob.format}; both operands of a "
                    "GEMM must be nvfp4 or both unquantized"
                )
            if oa.hadamard != ob.hadamard:
                raise ValueError(
                    f"{gemm}: the Hadamard transform must be applied to both operands "
                    f"({a}.hadamard={oa.hadamard}, {b}.hadamard={ob.hadamard}); on one alone "
                    "it changes the product"
                )
        object.__setattr__(self, "hadamard_signs", hadamard.check_signs(self.hadamard_signs))

    def operands(self) -> Iterator[tuple[str, Operand]]:
        """(role name, `Operand`) for the six GEMM operands."""
        for _, a, b in _GEMMS:
            yield a, getattr(self, a)
            yield b, getattr(self, b)

    @property
    def is_unquantized(self) -> bool:
        """True when no operand is quantized (the recipe is an exact passthrough)."""
        return not any(o.quantized for _, o in self.operands())

    @property
    def is_bf16(self) -> bool:
        """Alias of `is_unquantized`."""
        return self.is_unquantized

    @property
    def needs_key(self) -> bool:
        """True when some operand uses stochastic rounding."""
        return any(o.stochastic for _, o in self.operands())

    def replace(self, **changes) -> Recipe:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def with_unquantized_forward(self) -> Recipe:
        """The same recipe with the fprop GEMM unquantized (docs/RECIPE.md §8)."""
        return self.replace(fprop_lhs=UNQUANTIZED, fprop_rhs=UNQUANTIZED)

    def with_unquantized_backward(self) -> Recipe:
        """The same recipe with the dgrad and wgrad GEMMs unquantized."""
        return self.replace(dgrad_grad=UNQUANTIZED, dgrad_rhs=UNQUANTIZED,
                            wgrad_lhs=UNQUANTIZED, wgrad_grad=UNQUANTIZED)

    def with_bf16_forward(self) -> Recipe:
        """Alias of `with_unquantized_forward` (the paper's "switch to BF16")."""
        return self.with_unquantized_forward()

    def with_bf16_backward(self) -> Recipe:
        """Alias of `with_unquantized_backward`."""
        return self.with_unquantized_backward()

    @classmethod
    def nvfp4(cls) -> Recipe:
        """The paper's recipe (docs/RECIPE.md §6).

        fprop: X 1D RNE, W 2D RNE; dgrad: dY 1D SR, W the same 2D quantization;
        wgrad: X and dY with RHT along tokens, X RNE, dY SR.
        """
        w = Operand(block_2d=True)
        return cls(
            fprop_lhs=Operand(),
            fprop_rhs=w,
            dgrad_grad=Operand(rounding="stochastic"),
            dgrad_rhs=w,
            wgrad_lhs=Operand(hadamard=True),
            wgrad_grad=Operand(rounding="stochastic", hadamard=True),
        )

    @classmethod
    def unquantized(cls) -> Recipe:
        """No quantization: `fp4jax.dot_general` equals `jax.lax.dot_general` exactly."""
        u = UNQUANTIZED
        return cls(fprop_lhs=u, fprop_rhs=u, dgrad_grad=u, dgrad_rhs=u, wgrad_lhs=u, wgrad_grad=u)

    @classmethod
    def bf16(cls) -> Recipe:
        """Alias of `unquantized` (exact passthrough in the operands' own dtype)."""
        return cls.unquantized()

    @classmethod
    def nvfp4_no_rht(cls) -> Recipe:
        """Ablation: the paper's recipe without the wgrad Hadamard transform."""
        r = cls.nvfp4()
        return r.replace(
            wgrad_lhs=Operand(), wgrad_grad=Operand(rounding="stochastic")
        )

    @classmethod
    def nvfp4_no_sr(cls) -> Recipe:
        """Ablation: the paper's recipe with round-to-nearest gradients."""
        r = cls.nvfp4()
        return r.replace(dgrad_grad=Operand(), wgrad_grad=Operand(hadamard=True))

    @classmethod
    def nvfp4_no_2d(cls) -> Recipe:
        """Ablation: weights in 1D blocks (quantized separately along K and along N)."""
        return cls.nvfp4().replace(fprop_rhs=Operand(), dgrad_rhs=Operand())

    @classmethod
    def nvfp4_four_over_six(cls) -> Recipe:
        """The paper's recipe with 4/6 adaptive block scaling (docs/RECIPE.md §2.8, §6).

        4/6 applies where Transformer Engine allows it, to the round-to-nearest operands
        without the RHT: X in fprop and W (the 2D tiles shared by fprop and dgrad). The
        stochastically rounded dY and the Hadamard-rotated wgrad operands keep the 6 rule.

        Example:
          >>> r = Recipe.nvfp4_four_over_six()
          >>> [name for name, o in r.operands() if o.scale_rule == "four_over_six"]
          ['fprop_lhs', 'fprop_rhs', 'dgrad_rhs']
        """
        w = Operand(block_2d=True, scale_rule="four_over_six")
        return cls.nvfp4().replace(
            fprop_lhs=Operand(scale_rule="four_over_six"), fprop_rhs=w, dgrad_rhs=w)
