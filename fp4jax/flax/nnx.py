"""Flax nnx adapter: convert an existing nnx model to NVFP4 by policy.

`quantize` walks the model graph and, for every ``nnx.Linear``, ``nnx.LinearGeneral``
(which includes the query/key/value/out projections of ``nnx.MultiHeadAttention``)
and ``nnx.Einsum``, sets the layer's ``dot_general`` / ``einsum_op`` to an fp4jax op
(`fp4jax.flax.DotGeneral`, `fp4jax.flax.Einsum`) named by the layer's path, as the
`Policy` decides. Nothing else changes: parameters, their dtypes and the model code
stay as they were. Call the model inside `fp4jax.flax.step_scope` (the
`fp4jax.train` step does) so that every quantized layer gets its own SR key.

One layer by hand needs no conversion::

    nnx.Linear(d, f, dot_general=fp4jax.flax.DotGeneral(name="mlp.up"), rngs=rngs)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

from flax import nnx

from fp4jax.flax import ops
from fp4jax.flax.policy import ROOT_NAME, Policy, Report

MATMUL_LAYERS: tuple[type, ...] = (nnx.Linear, nnx.LinearGeneral, nnx.Einsum)
"""The nnx layer types `quantize` converts."""


def path_name(path: tuple) -> str:
    """A graph path as a dotted name: ``('blocks', 0, 'mlp', 'up')`` → ``'blocks.0.mlp.up'``.

    The root (empty path) is named `fp4jax.flax.policy.ROOT_NAME` (``"root"``).
    """
    return ".".join(str(p) for p in path) or ROOT_NAME


def matmul_layers(model: nnx.Module) -> Iterator[tuple[str, nnx.Module]]:
    """(dotted path, layer) for every matmul layer of ``model``, in graph order.

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
    for path, node in nnx.iter_graph(model):
        if isinstance(node, MATMUL_LAYERS):
            yield path_name(path), node


def quantize(
    model: nnx.Module, policy: Policy | None = None, *, strict: bool = False, impl: str = "xla"
) -> Report:
    """Converts ``model``'s matmul layers in place as ``policy`` decides.

    Args:
      model: an nnx model.
      policy: the `Policy`; default: every matmul layer in `fp4jax.Recipe.nvfp4`
        (use `fp4jax.flax.paper_policy` to keep the head and blocks in BF16).
      strict: raise `ValueError` if a non-optional rule matched no layer (otherwise
        a warning). All unused rules are listed in ``Report.unused_rules``.
      impl: GEMM implementation for `fp4jax.dot_general`.

    Returns:
      The `Report` (which layer got which recipe, unused rules).

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
    layers = list(matmul_layers(model))
    report = policy.decide((path, type(layer).__name__) for path, layer in layers)
    for (path, layer), decision in zip(layers, report.decisions, strict=True):
        if decision.recipe is None:
            continue
        if isinstance(layer, nnx.Einsum):
            layer.einsum_op = ops.Einsum(name=path, recipe=decision.recipe, impl=impl)
        else:
            layer.dot_general = ops.DotGeneral(name=path, recipe=decision.recipe, impl=impl)
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
