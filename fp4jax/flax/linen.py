"""Flax linen adapter: ``dot_general_cls`` for one layer, or a whole model by policy.

One layer::

    nn.Dense(features, dot_general_cls=fp4jax.flax.linen.dot_general_cls())

The `DotGeneral` module names itself after the layer that owns it (its scope path,
e.g. ``"Block_0.Dense_1"``), so SR keys differ per layer without configuration.

A whole model, without editing it: `quantize` is a context manager that intercepts
``nn.Dense`` / ``nn.DenseGeneral`` calls (so also the projections of
``nn.MultiHeadDotProductAttention``) and gives each matching layer an fp4jax
``dot_general`` for the duration of the call::

    with fp4jax.flax.step_scope(step_key), fp4jax.flax.linen.quantize(policy):
        logits = model.apply(variables, tokens)

Open both inside the jitted function. ``nn.Einsum`` has no injection point in linen
and is not converted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax

from fp4jax.flax import ops
from fp4jax.flax.policy import ROOT_NAME, Policy, Report
from fp4jax.recipe import Recipe

MATMUL_LAYERS: tuple[type, ...] = (nn.Dense, nn.DenseGeneral)
"""The linen layer types `quantize` converts."""


def module_name(module: nn.Module) -> str:
    """A bound module's scope path as a dotted name (``"Block_0.Dense_1"``).

    The root module (empty path) is named `ROOT_NAME`.
    """
    if module.scope is None:
        raise ValueError(
            f"{type(module).__name__} is not bound: use it inside Module.init/apply"
        )
    return ".".join(str(p) for p in module.scope.path) or ROOT_NAME


class DotGeneral(nn.Module):
    """An fp4jax ``dot_general`` for ``dot_general_cls`` of linen layers.

    Attributes:
      recipe: the layer's `Recipe`; None means `Recipe.nvfp4`.
      impl: GEMM implementation for `fp4jax.dot_general`.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, fp4jax
      >>> layer = nn.Dense(16, dot_general_cls=fp4jax.flax.linen.dot_general_cls())
      >>> x = jnp.ones((4, 32))
      >>> with fp4jax.flax.step_scope(jax.random.key(0)):
      ...   params = layer.init(jax.random.key(1), x)
      ...   layer.apply(params, x).shape
      (4, 16)
    """

    recipe: Recipe | None = None
    impl: str = "xla"

    def __call__(
        self,
        lhs: jax.Array,
        rhs: jax.Array,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        *,
        out_sharding: Any = None,
    ) -> jax.Array:
        """`jax.lax.dot_general`-compatible call."""
        if self.scope is None or not isinstance(self.parent, nn.Module):
            raise ValueError(
                "fp4jax.flax.linen.DotGeneral must be created inside a layer: pass it as "
                "dot_general_cls (use fp4jax.flax.linen.dot_general_cls())"
            )
        op = ops.DotGeneral(
            name=module_name(self.parent),
            recipe=Recipe.nvfp4() if self.recipe is None else self.recipe,
            impl=self.impl,
        )
        return op(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                  out_sharding=out_sharding)


def dot_general_cls(recipe: Recipe | None = None, *, impl: str = "xla") -> Callable[[], DotGeneral]:
    """A zero-argument factory for ``nn.Dense(dot_general_cls=...)``."""
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp4jax.Recipe, got {type(recipe).__name__}")
    return functools.partial(DotGeneral, recipe=recipe, impl=impl)


@dataclasses.dataclass(kw_only=True, eq=False)
class Recorder:
    """Collects the decisions of `quantize` while it is open (trace time).

    Attributes:
      policy: the policy being applied.
      seen: ``(path, kind)`` of every matmul layer called so far, in first-call order.
    """

    policy: Policy
    seen: dict[str, str] = dataclasses.field(default_factory=dict)

    def report(self) -> Report:
        """The `Report` for the layers called so far."""
        return self.policy.decide(self.seen.items())


@contextlib.contextmanager
def quantize(policy: Policy | None = None, *, impl: str = "xla") -> Iterator[Recorder]:
    """Applies ``policy`` to the ``nn.Dense``/``nn.DenseGeneral`` calls inside the block.

    Each matching layer's ``dot_general`` is replaced, for the duration of its call,
    by `fp4jax.flax.DotGeneral` named after its scope path (``"Block_0.Dense_1"``).
    Rules are matched against these paths. Unused rules are known only after the
    model ran: see ``Recorder.report()``.

    Args:
      policy: the `Policy` (default: every Dense in `Recipe.nvfp4`).
      impl: GEMM implementation.

    Yields:
      A `Recorder`.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, fp4jax
      >>> model = nn.Sequential([nn.Dense(16), nn.relu, nn.Dense(8)])
      >>> x = jnp.ones((4, 32))
      >>> params = model.init(jax.random.key(0), x)
      >>> policy = fp4jax.flax.Policy(rules=(fp4jax.flax.Rule(pattern="layers_2", recipe=None),))
      >>> with fp4jax.flax.step_scope(jax.random.key(1)), fp4jax.flax.linen.quantize(policy) as rec:
      ...   y = model.apply(params, x)
      >>> rec.report().quantized
      ('layers_0',)
    """
    policy = Policy() if policy is None else policy
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be an fp4jax.flax.Policy, got {type(policy).__name__}")
    recorder = Recorder(policy=policy)

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, MATMUL_LAYERS):
            return next_fun(*args, **kwargs)
        path = module_name(module)
        recorder.seen.setdefault(path, type(module).__name__)
        _, recipe = policy.match(path)
        if recipe is None:
            return next_fun(*args, **kwargs)
        op = ops.DotGeneral(name=path, recipe=recipe, impl=impl)
        saved = (module.dot_general, module.dot_general_cls)
        # Linen modules are frozen dataclasses; this bound copy lives for one apply,
        # and the fields are restored right after the call.
        object.__setattr__(module, "dot_general", op)
        object.__setattr__(module, "dot_general_cls", None)
        try:
            return next_fun(*args, **kwargs)
        finally:
            object.__setattr__(module, "dot_general", saved[0])
            object.__setattr__(module, "dot_general_cls", saved[1])

    with nn.intercept_methods(interceptor):
        yield recorder
