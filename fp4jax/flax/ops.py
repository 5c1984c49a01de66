"""Layer-level fp4jax ops: a named ``dot_general`` and ``einsum`` for Flax layers.

Each op is a small frozen (hashable, hence static under ``jit``) dataclass that a
layer stores as its ``dot_general`` / ``einsum_op``. It knows the layer's name and
recipe; at call time it reads the open `fp4jax.flax.step_scope` for the step key
(→ ``fp4jax.layer_key(step_key, name)``), the precision mode of the schedule and the
diagnostics flag, then calls `fp4jax.dot_general`.

Outside a step scope there is no key: the forward GEMM rounds to nearest and needs
none, and `fp4jax.dot_general` raises only if a backward pass that rounds
stochastically runs.

An op without its own ``rhs_gather`` takes the scope's (`fp4jax.flax.Scope.rhs_gather`):
under FSDP, `fp4jax.train` has every layer gather its sharded weight in NVFP4.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from fp4jax import diagnostics
from fp4jax.flax import einsum as einsum_lib
from fp4jax.flax import scope as scope_lib
from fp4jax.quantized_dot import dot_general as fp4_dot_general
from fp4jax.recipe import Recipe
from fp4jax.weight_gather import FP4Gather


def _check(name: Any, recipe: Any, impl: Any, rhs_gather: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"name must be a non-empty str (the layer's path, e.g. 'blocks.0.mlp.up'), got {name!r}"
        )
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp4jax.Recipe, got {type(recipe).__name__}")
    if not isinstance(impl, str):
        raise TypeError(f"impl must be a str, got {type(impl).__name__}")
    if rhs_gather is not None and not isinstance(rhs_gather, FP4Gather):
        raise TypeError(f"rhs_gather must be an fp4jax.FP4Gather or None, got "
                        f"{type(rhs_gather).__name__}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DotGeneral:
    """A layer's `fp4jax.dot_general`, keyed and scheduled by the step scope.

    Pass it where a layer takes a ``dot_general`` (``nnx.Linear``,
    ``nnx.LinearGeneral``, ``linen.Dense(dot_general=...)``). Train the layer inside
    `fp4jax.flax.step_scope` (the `fp4jax.train` step opens it); inference works
    outside one.

    Attributes:
      name: the layer's unique name; its SR key is ``fp4jax.layer_key(step_key, name)``.
      recipe: the layer's `Recipe` (the schedule's mode is applied on top).
      impl: GEMM implementation passed to `fp4jax.dot_general`.
      rhs_gather: an `fp4jax.FP4Gather` for a kernel sharded FSDP-style: gather it in
        NVFP4 over those mesh axes (docs/SHARDING.md). None: the step scope's, if any.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from flax import nnx
      >>> from fp4jax.flax import DotGeneral, step_scope
      >>> layer = nnx.Linear(32, 16, dot_general=DotGeneral(name="fc"), rngs=nnx.Rngs(0))
      >>> with step_scope(jax.random.key(0)):
      ...   y = layer(jnp.ones((4, 32)))
      >>> y.shape
      (4, 16)
    """

    name: str
    recipe: Recipe = dataclasses.field(default_factory=Recipe.nvfp4)
    impl: str = "xla"
    rhs_gather: FP4Gather | None = None

    def __post_init__(self):
        _check(self.name, self.recipe, self.impl, self.rhs_gather)

    def __call__(
        self,
        lhs: jax.typing.ArrayLike,
        rhs: jax.typing.ArrayLike,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        *,
        out_sharding: Any = None,
    ) -> jax.Array:
        """`jax.lax.dot_general`-compatible call (see `fp4jax.dot_general`)."""
        return self.call(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                         out_sharding=out_sharding)

    def call(
        self,
        lhs: jax.typing.ArrayLike,
        rhs: jax.typing.ArrayLike,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        *,
        out_sharding: Any = None,
        salt: jax.Array | None = None,
    ) -> jax.Array:
        """The call, with an optional ``salt`` folded into the SR key (a stacked layer's
        index, traced: `fp4jax.flax.nnx.StackedDotGeneral`, `fp4jax.flax.linen`)."""
        scope = scope_lib.current_scope()
        recipe = scope_lib.apply_mode(self.recipe, scope.mode) if scope else self.recipe
        rhs_gather = self.rhs_gather
        if (rhs_gather is None and scope is not None and scope.weight_gathers
                and (recipe.fprop_rhs.quantized or recipe.dgrad_rhs.quantized)):
            # A weight the recipe leaves in high precision is left to XLA to gather.
            rhs_gather = scope.rhs_gather(self.name, jax.numpy.shape(rhs), dimension_numbers)
            if rhs_gather is not None:
                scope.fp4_gathered[self.name] = rhs_gather
        key = role_table = None
        if scope is not None and not recipe.is_bf16:
            call_id = scope.next_call(self.name)
            # The operand keys the scope derived on entry, else the layer key to derive
            # them from (the same bits either way).
            role_table = scope.role_table(call_id, salt)
            if role_table is None:
                key = scope.layer_key(call_id, salt)
            # A stacked layer runs inside scan/vmap: its statistics would be values of
            # that inner trace, unusable outside it, so it is not recorded.
            if scope.diagnostics and recipe.fprop_lhs.quantized and salt is None:
                scope.stats[call_id] = diagnostics.fprop_stats(
                    lhs, rhs, dimension_numbers, recipe, scope.layer_key(call_id)
                )
        try:
            return fp4_dot_general(
                lhs, rhs, dimension_numbers, precision, preferred_element_type,
                out_sharding=out_sharding, recipe=recipe, key=key, impl=self.impl,
                rhs_gather=rhs_gather, role_table=role_table,
            )
        except ValueError as e:
            if key is None and role_table is None and recipe.needs_key:
                raise ValueError(
                    f"layer {self.name!r}: {e}. To train it, call it inside `with "
                    "fp4jax.flax.step_scope(step_key):` (opened inside your jitted step; "
                    "fp4jax.train does this)"
                ) from e
            raise


@dataclasses.dataclass(frozen=True, kw_only=True)
class Einsum:
    """A layer's two-operand einsum through `DotGeneral` (for ``nnx.Einsum(einsum_op=...)``).

    The first operand is the input (``lhs``), the second the kernel (``rhs``); the
    operands are never swapped (`fp4jax.flax.einsum`).

    Attributes:
      name: the layer's unique name.
      recipe: the layer's `Recipe`.
      impl: GEMM implementation.
      rhs_gather: an `fp4jax.FP4Gather` for a kernel sharded FSDP-style.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> from fp4jax.flax import Einsum, step_scope
      >>> layer = nnx.Einsum("btd,dnh->btnh", (32, 2, 8), einsum_op=Einsum(name="q"),
      ...                    rngs=nnx.Rngs(0))
      >>> with step_scope(jax.random.key(0)):
      ...   layer(jnp.ones((2, 2, 32))).shape
      (2, 2, 2, 8)
    """

    name: str
    recipe: Recipe = dataclasses.field(default_factory=Recipe.nvfp4)
    impl: str = "xla"
    rhs_gather: FP4Gather | None = None

    def __post_init__(self):
        _check(self.name, self.recipe, self.impl, self.rhs_gather)

    def __call__(
        self,
        subscripts: str,
        lhs: jax.typing.ArrayLike,
        rhs: jax.typing.ArrayLike,
        *,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> jax.Array:
        """``jnp.einsum(subscripts, lhs, rhs)`` with the layer's NVFP4 dot_general."""
        return self.call(subscripts, lhs, rhs, precision=precision,
                         preferred_element_type=preferred_element_type,
                         out_sharding=out_sharding)

    def call(
        self,
        subscripts: str,
        lhs: jax.typing.ArrayLike,
        rhs: jax.typing.ArrayLike,
        *,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
        salt: jax.Array | None = None,
    ) -> jax.Array:
        """The call, with an optional SR ``salt`` (see `DotGeneral.call`)."""
        op = DotGeneral(name=self.name, recipe=self.recipe, impl=self.impl,
                        rhs_gather=self.rhs_gather)

        def dot_general(lhs, rhs, dimension_numbers, precision=None, **kwargs):
            return op.call(lhs, rhs, dimension_numbers, precision, salt=salt, **kwargs)

        return einsum_lib.einsum(
            subscripts, lhs, rhs, dot_general=dot_general, precision=precision,
            preferred_element_type=preferred_element_type, out_sharding=out_sharding,
        )
