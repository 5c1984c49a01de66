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

Open both inside the jitted function. ``nn.Einsum`` (it calls ``jnp.einsum``
directly) and the convolutions have no injection point in linen: they are listed in
the report as "not supported: left as is". A policy's ``keep_last`` needs the call
order before the model runs: pass ``layers=matmul_layers(model, x)``.

**Stacked layers** (``nn.scan``/``nn.vmap``, e.g. scan over blocks): the copies share
one module path, so each layer draws a per-copy salt from the ``params`` RNG at init
into the ``"fp4jax"`` collection (`COLLECTION`) and folds it into its SR key. List the
collection where the parameters are listed and pass it to ``apply``::

    nn.scan(Block, variable_axes={"params": 0, "fp4jax": 0}, split_rngs={"params": True},
            length=n)
    model.apply({"params": params, "fp4jax": variables["fp4jax"]}, x)

A stacked layer without its salt is an error (never one shared key). Layers outside
``nn.scan``/``nn.vmap`` create no variables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp

from fp4jax.flax import ops
from fp4jax.flax import scope as scope_lib
from fp4jax.flax.policy import ROOT_NAME, Decision, Policy, Report
from fp4jax.recipe import Recipe
from fp4jax.weight_gather import FP4Gather

MATMUL_LAYERS: tuple[type, ...] = (nn.Dense, nn.DenseGeneral)
"""The linen layer types `quantize` converts."""

UNSUPPORTED_LAYERS: tuple[type, ...] = (nn.Conv, nn.ConvTranspose, nn.ConvLocal, nn.Einsum)
"""Matmul-like linen layers `quantize` reports but leaves as they are."""

COLLECTION = "fp4jax"
"""The variable collection holding the SR salts of stacked layers."""

_STACKING = re.compile(r"(?:^|/)(?:scan|vmap)\(")
"""A lifted ``nn.scan``/``nn.vmap`` in a scope's ``path_text`` (``/scan(blocks)/...``)."""


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
      rhs_gather: an `fp4jax.FP4Gather` for a kernel sharded FSDP-style.

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
    rhs_gather: FP4Gather | None = None

    @nn.compact
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
            rhs_gather=self.rhs_gather,
        )
        salt = self._salt(op.name) if _STACKING.search(self.scope.path_text) else None
        return op.call(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                       out_sharding=out_sharding, salt=salt)

    def _salt(self, name: str) -> jax.Array:
        """This stacked copy's salt: created at init from the ``params`` RNG (split per
        copy by ``split_rngs={"params": True}``), read afterwards."""
        hint = (
            f"layer {name!r} runs inside nn.scan/nn.vmap, where its copies share one path; "
            f"each needs its own stochastic-rounding salt from the {COLLECTION!r} collection: "
            f"list it in variable_axes next to 'params' (variable_axes={{'params': 0, "
            f"{COLLECTION!r}: 0}}) and pass it to apply ({{'params': ..., {COLLECTION!r}: "
            f"variables[{COLLECTION!r}]}})"
        )
        if self.has_variable(COLLECTION, "sr_salt"):
            return self.get_variable(COLLECTION, "sr_salt")
        if not self.is_initializing():
            raise ValueError(hint)
        try:
            return self.variable(
                COLLECTION, "sr_salt",
                lambda: jax.random.bits(self.make_rng("params"), (), jnp.uint32),
            ).value
        except (flax.errors.ScopeCollectionNotFound, flax.errors.ModifyScopeVariableError) as e:
            raise ValueError(hint) from e


def dot_general_cls(recipe: Recipe | None = None, *, impl: str = "xla",
                    rhs_gather: FP4Gather | None = None) -> Callable[[], DotGeneral]:
    """A zero-argument factory for ``nn.Dense(dot_general_cls=...)``."""
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp4jax.Recipe, got {type(recipe).__name__}")
    return functools.partial(DotGeneral, recipe=recipe, impl=impl, rhs_gather=rhs_gather)


@dataclasses.dataclass(kw_only=True, eq=False)
class Recorder:
    """Collects the decisions of `quantize` while it is open (trace time).

    Attributes:
      policy: the policy being applied.
      decisions: the `Decision` of every matmul-like layer called so far, by path, in
        first-call order.
    """

    policy: Policy
    decisions: dict[str, Decision] = dataclasses.field(default_factory=dict)

    @property
    def seen(self) -> dict[str, str]:
        """``path -> kind`` of the layers called so far."""
        return {p: d.kind for p, d in self.decisions.items()}

    def report(self) -> Report:
        """The `Report` for the layers called so far (what they actually ran)."""
        return self.policy.report(self.decisions.values())


def _record_calls(kinds: tuple[type, ...], seen: dict[str, str]) -> Callable:
    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name == "__call__" and isinstance(module, kinds):
            seen.setdefault(module_name(module), type(module).__name__)
        return next_fun(*args, **kwargs)

    return interceptor


def matmul_layers(model: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[str, str], ...]:
    """``(path, kind)`` of every matmul-like layer of ``model``, in call order.

    Traces ``model.init`` on ``args`` abstractly (`jax.eval_shape`: no computation).
    Pass the result as ``quantize(policy, layers=...)`` so that ``Policy.keep_last``
    knows the last layer before the model runs.

    Example:
      >>> import jax.numpy as jnp, flax.linen as nn
      >>> from fp4jax.flax.linen import matmul_layers
      >>> matmul_layers(nn.Sequential([nn.Dense(4), nn.Dense(2)]), jnp.ones((1, 3)))
      (('layers_0', 'Dense'), ('layers_1', 'Dense'))
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a flax.linen.Module, got {type(model).__name__}")
    seen: dict[str, str] = {}

    def init():
        key = jax.random.key(0)
        with scope_lib.step_scope(key):
            return model.init({"params": key, "dropout": key}, *args, **kwargs)

    with nn.intercept_methods(_record_calls(MATMUL_LAYERS + UNSUPPORTED_LAYERS, seen)):
        jax.eval_shape(init)
    return tuple(seen.items())


@contextlib.contextmanager
def quantize(
    policy: Policy | None = None,
    *,
    layers: Sequence[tuple[str, str]] | None = None,
    impl: str = "xla",
    rhs_gather: FP4Gather | None = None,
) -> Iterator[Recorder]:
    """Applies ``policy`` to the ``nn.Dense``/``nn.DenseGeneral`` calls inside the block.

    Each matching layer's ``dot_general_cls`` is replaced, for the duration of its
    call, by `DotGeneral` (named after the layer's scope path, ``"Block_0.Dense_1"``).
    Rules are matched against these paths. Convolutions and ``nn.Einsum`` are recorded
    as not supported. Unused rules are known only after the model ran: see
    ``Recorder.report()``.

    Args:
      policy: the `Policy` (default: every Dense in `Recipe.nvfp4`).
      layers: the model's matmul-like layers in call order (`matmul_layers`); needed
        for ``policy.keep_last``. Without it, a warning names the last layer called if
        it ran in NVFP4 while ``keep_last`` would have kept it.
      impl: GEMM implementation.
      rhs_gather: an `fp4jax.FP4Gather` for every converted layer (see
        `fp4jax.flax.nnx.quantize`).

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
    planned: dict[str, Decision] = {}
    if layers is not None:
        layers = tuple((str(p), str(k)) for p, k in layers)
        unsupported = {k.__name__ for k in UNSUPPORTED_LAYERS}
        report = policy.decide(layers, last=layers[-1][0] if layers else None,
                               unsupported=[p for p, k in layers if k in unsupported])
        planned = {d.path: d for d in report.decisions}
    recorder = Recorder(policy=policy)

    def decide(path: str, kind: str, supported: bool) -> Decision:
        if path not in recorder.decisions:
            d = planned.get(path) or policy.decide_one(path, kind, supported=supported)
            recorder.decisions[path] = d
        return recorder.decisions[path]

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if isinstance(module, UNSUPPORTED_LAYERS):
            decide(module_name(module), type(module).__name__, False)
            return next_fun(*args, **kwargs)
        if not isinstance(module, MATMUL_LAYERS):
            return next_fun(*args, **kwargs)
        recipe = decide(module_name(module), type(module).__name__, True).recipe
        if recipe is None:
            return next_fun(*args, **kwargs)
        saved = (module.dot_general, module.dot_general_cls)
        # Linen modules are frozen dataclasses; this bound copy lives for one apply,
        # and the fields are restored right after the call. The layer builds the
        # DotGeneral submodule itself (it is stateless unless stacked).
        object.__setattr__(module, "dot_general_cls", dot_general_cls(recipe, impl=impl,
                                                                   rhs_gather=rhs_gather))
        try:
            return next_fun(*args, **kwargs)
        finally:
            object.__setattr__(module, "dot_general", saved[0])
            object.__setattr__(module, "dot_general_cls", saved[1])

    with nn.intercept_methods(interceptor):
        yield recorder
    if policy.keep_last and layers is None and recorder.decisions:
        last = list(recorder.decisions.values())[-1]
        if last.supported and last.rule is None and last.recipe is not None \
                and not last.recipe.is_bf16:
            warnings.warn(
                f"the last matmul layer called, {last.path!r} (likely the logits), ran in "
                "NVFP4: policy.keep_last needs the call order before the model runs; pass "
                "layers=fp4jax.flax.linen.matmul_layers(model, x) or a rule for it",
                stacklevel=3,
            )
