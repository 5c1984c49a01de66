"""Flax nnx adapter: convert an existing nnx model to NVFP4 by policy.

`quantize` walks the model graph and, for every ``nnx.Linear``, ``nnx.LinearGeneral``
(which includes the query/key/value/out projections of ``nnx.MultiHeadAttention``)
and ``nnx.Einsum``, sets the layer's ``dot_general`` / ``einsum_op`` to an fp4jax op
(`fp4jax.flax.DotGeneral`, `fp4jax.flax.Einsum`) named by the layer's path, as the
`Policy` decides. Nothing else changes: parameters, their dtypes and the model code
stay as they were. Call the model inside `fp4jax.flax.step_scope` (the
`fp4jax.train` step does) so that every quantized layer gets its own SR key.
``nnx.Conv``/``nnx.ConvTranspose`` are listed in the report as "not supported: left
as is" (`fp4jax.flax.policy` says why).

**Stacked layers.** A layer created under ``nnx.vmap`` (Flax's scan-over-layers idiom)
holds several copies of its kernel; ``nnx.scan``/``nnx.vmap`` run them with one trace,
so a name alone would give every copy the same SR key. `quantize` recognises such a
layer by its kernel's extra leading axes and gives it a `StackedDotGeneral` holding
an `SRIndex` variable (``0 .. n-1``, stacked like the kernel): each copy folds its
own index into its key. Quantize *after* building the stacked layers, and let the
transform slice the `SRIndex` along with the parameters (the default ``in_axes=0``
does).

One layer by hand needs no conversion::

    nnx.Linear(d, f, dot_general=fp4jax.flax.DotGeneral(name="mlp.up"), rngs=rngs)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from fp4jax.flax import ops
from fp4jax.flax.policy import ROOT_NAME, Policy, Report
from fp4jax.weight_gather import FP4Gather

MATMUL_LAYERS: tuple[type, ...] = (nnx.Linear, nnx.LinearGeneral, nnx.Einsum)
"""The nnx layer types `quantize` converts."""

UNSUPPORTED_LAYERS: tuple[type, ...] = (nnx.Conv, nnx.ConvTranspose)
"""Matmul-like nnx layers `quantize` reports but leaves as they are."""


class SRIndex(nnx.Variable):
    """Which copy of a stacked layer this is: folded into its stochastic-rounding key.

    Not a parameter (never trained); an ``int32`` array shaped like the layer's stack
    axes, ``0 .. n-1`` in row-major order.
    """


class StackedDotGeneral(nnx.Module):
    """`fp4jax.flax.DotGeneral` for a stacked layer: each copy draws its own SR key.

    Args:
      op: the layer's `fp4jax.flax.DotGeneral` (name, recipe, impl).
      stack_shape: the layer's stack axes (the kernel's extra leading axes).
    """

    def __init__(self, op: ops.DotGeneral, stack_shape: tuple[int, ...]):
        self.op = op
        self.index = SRIndex(
            jnp.arange(math.prod(stack_shape), dtype=jnp.int32).reshape(stack_shape)
        )

    def __call__(self, lhs, rhs, dimension_numbers, precision=None,
                 preferred_element_type=None, *, out_sharding=None) -> jax.Array:
        """`jax.lax.dot_general`-compatible call with this copy's index as SR salt."""
        return self.op.call(lhs, rhs, dimension_numbers, precision, preferred_element_type,
                            out_sharding=out_sharding, salt=_index(self.index, self.op.name))


class StackedEinsum(nnx.Module):
    """`fp4jax.flax.Einsum` for a stacked ``nnx.Einsum`` (see `StackedDotGeneral`)."""

    def __init__(self, op: ops.Einsum, stack_shape: tuple[int, ...]):
        self.op = op
        self.index = SRIndex(
            jnp.arange(math.prod(stack_shape), dtype=jnp.int32).reshape(stack_shape)
        )

    def __call__(self, subscripts, lhs, rhs, *, precision=None, preferred_element_type=None,
                 out_sharding=None) -> jax.Array:
        """``jnp.einsum(subscripts, lhs, rhs)`` with this copy's index as SR salt."""
        return self.op.call(subscripts, lhs, rhs, precision=precision,
                            preferred_element_type=preferred_element_type,
                            out_sharding=out_sharding, salt=_index(self.index, self.op.name))


def _index(index: SRIndex, name: str) -> jax.Array:
    value = index[...]
    if value.ndim:
        raise ValueError(
            f"stacked layer {name!r} got the SRIndex of all {value.size} copies: its "
            "scan/vmap sliced the parameters but not the other state. Slice SRIndex along "
            "with them (e.g. nnx.StateAxes({(nnx.Param, fp4jax.flax.nnx.SRIndex): 0, ...: "
            "None})), so that every copy draws its own stochastic-rounding key"
        )
    return value


def _kernel_ndim(layer: nnx.Module) -> int:
    if isinstance(layer, nnx.Einsum):
        return len(layer.kernel_shape)
    if isinstance(layer, nnx.LinearGeneral):
        return len(layer.batch_axis) + len(layer.in_features) + len(layer.out_features)
    return 2


def stack_shape(path: str, layer: nnx.Module) -> tuple[int, ...]:
    """The stack axes of a matmul layer: its kernel's leading axes beyond the layer's own
    (``()`` for an ordinary layer, ``(n,)`` for ``n`` copies made by ``nnx.vmap``)."""
    shape = tuple(layer.kernel.shape)
    n = len(shape) - _kernel_ndim(layer)
    if n < 0:
        raise ValueError(f"layer {path!r}: kernel of shape {shape} is not a {type(layer).__name__} "
                         "kernel")
    return shape[:n]


def _definition_order(model: nnx.Module) -> dict[int, int]:
    """id(node) -> position in a depth-first walk of the attributes in assignment order
    (`nnx.iter_graph` sorts names, which loses "defined last")."""
    order: dict[int, int] = {}

    def walk(node: Any) -> None:
        if id(node) in order:
            return
        order[id(node)] = len(order)
        if isinstance(node, nnx.Pytree):
            children = [v for k, v in vars(node).items() if not k.startswith("_pytree__")]
        elif isinstance(node, (list, tuple)):
            children = list(node)
        elif isinstance(node, dict):
            children = list(node.values())
        else:
            return
        for c in children:
            if isinstance(c, (nnx.Pytree, list, tuple, dict)):
                walk(c)

    walk(model)
    return order


def path_name(path: tuple) -> str:
    """A graph path as a dotted name: ``('blocks', 0, 'mlp', 'up')`` → ``'blocks.0.mlp.up'``.

    The root (empty path) is named `fp4jax.flax.policy.ROOT_NAME` (``"root"``).
    """
    return ".".join(str(p) for p in path) or ROOT_NAME


def matmul_layers(
    model: nnx.Module, *, unsupported: bool = False
) -> Iterator[tuple[str, nnx.Module]]:
    """(dotted path, layer) for every matmul layer of ``model``, in graph order.

    With ``unsupported=True`` the `UNSUPPORTED_LAYERS` (convolutions) are included.

    Example:
      >>> from flax import nnx
      >>> from fp4jax.flax.nnx import matmul_layers
      >>> m = nnx.Sequential(nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.relu,
      ...                    nnx.Linear(4, 2, rngs=nnx.Rngs(0)))
      >>> [p for p, _ in matmul_layers(m)]
      ['layers.0', 'layers.2']
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(f"model must be an nnx.Module, got {type(model).__name__}")
    kinds = MATMUL_LAYERS + (UNSUPPORTED_LAYERS if unsupported else ())
    for path, node in nnx.iter_graph(model):
        if isinstance(node, kinds):
            yield path_name(path), node


def quantize(
    model: nnx.Module, policy: Policy | None = None, *, strict: bool = False, impl: str = "xla",
    rhs_gather: FP4Gather | None = None,
) -> Report:
    """Converts ``model``'s matmul layers in place as ``policy`` decides.

    Args:
      model: an nnx model (build stacked layers before converting it).
      policy: the `Policy`; default: every matmul layer in `fp4jax.Recipe.nvfp4`
        (use `fp4jax.flax.paper_policy` to keep the head and blocks in BF16). Its
        ``keep_last`` applies to the matmul layer defined last.
      strict: raise `ValueError` if a non-optional rule matched no layer (otherwise
        a warning). All unused rules are listed in ``Report.unused_rules``.
      impl: GEMM implementation for `fp4jax.dot_general`.
      rhs_gather: an `fp4jax.FP4Gather` given to every converted layer: kernels sharded
        FSDP-style are gathered in NVFP4 (docs/SHARDING.md). Under auto mesh axes its
        ``spec`` must then be every kernel's; under explicit axes each kernel's own
        sharding is used.

    Returns:
      The `Report` (which layer got which recipe and why, the layers left as they are,
      unused rules).

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from flax import nnx
      >>> class MLP(nnx.Module):
      ...   def __init__(self, rngs):
      ...     self.up = nnx.Linear(32, 16, rngs=rngs)
      ...     self.head = nnx.Linear(16, 8, rngs=rngs)
      ...   def __call__(self, x):
      ...     return self.head(nnx.relu(self.up(x)))
      >>> model = MLP(nnx.Rngs(0))
      >>> report = fp4jax.flax.nnx.quantize(model, fp4jax.flax.paper_policy(num_blocks=0))
      >>> report.quantized
      ('up',)
      >>> with fp4jax.flax.step_scope(jax.random.key(0)):
      ...   model(jnp.ones((4, 32))).shape
      (4, 8)
    """
    policy = Policy() if policy is None else policy
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be an fp4jax.flax.Policy, got {type(policy).__name__}")
    layers = list(matmul_layers(model, unsupported=True))
    order = _definition_order(model)
    last = max(layers, key=lambda pl: order.get(id(pl[1]), -1))[0] if layers else None
    report = policy.decide(
        ((path, type(layer).__name__) for path, layer in layers),
        last=last,
        unsupported=[p for p, layer in layers if isinstance(layer, UNSUPPORTED_LAYERS)],
    )
    for (path, layer), decision in zip(layers, report.decisions, strict=True):
        if decision.recipe is None:
            continue
        stack = stack_shape(path, layer)
        if isinstance(layer, nnx.Einsum):
            op = ops.Einsum(name=path, recipe=decision.recipe, impl=impl, rhs_gather=rhs_gather)
            layer.einsum_op = nnx.data(StackedEinsum(op, stack)) if stack else op
        else:
            op = ops.DotGeneral(name=path, recipe=decision.recipe, impl=impl,
                                rhs_gather=rhs_gather)
            layer.dot_general = nnx.data(StackedDotGeneral(op, stack)) if stack else op
            if isinstance(layer, nnx.LinearGeneral):
                layer.dot_general_cls = None  # it would take precedence
    if report.unexpected_unused:
        msg = "policy rules matched no layer: " + ", ".join(
            repr(r.pattern) for r in report.unexpected_unused
        )
        if strict:
            raise ValueError(msg)
        warnings.warn(msg, stacklevel=2)
    return report
