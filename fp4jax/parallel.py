"""Data, FSDP and tensor parallelism for `fp4jax.train`: a mesh and logical-axis rules.

The model names the axes of its parameters — ``nnx.with_partitioning(init, ("embed",
"mlp"))``, linen's ``nn.with_logical_partitioning``, or `MeshRules.param_rules` by
parameter path — and `MeshRules.rules` map those logical names to mesh axes, Flax
style: each dimension takes the first rule for its name whose mesh axes the array does
not use yet (`flax.linen.logical_to_mesh_axes`). Rules naming mesh axes the mesh does
not have are skipped, so one rule set serves every mesh; a name that is itself a mesh
axis shards over it; any other name (and an unannotated parameter) is replicated.

`DEFAULT_RULES` give the usual layouts from the mesh's axis names alone:

* ``data`` — data parallel: the batch is split, parameters are replicated;
* ``fsdp`` — fully sharded data parallel: the batch is split too, and every parameter
  (and with it the optimizer state) is sharded along its ``embed`` dimension;
* ``model`` — tensor parallel, Megatron style: the q/k/v and MLP gate/up projections
  are split by columns (``heads``/``mlp`` outputs), attention output and MLP down
  projections by rows, embedding and output head along ``vocab``;

and any product of them, e.g. a ``("data", "model")`` mesh for data × tensor parallel.

`fp4jax.train` partitions its step with these shardings: the state's shardings come
from the parameters' (`MeshRules.param_shardings`; the optimizer state's follow the
parameters they belong to, `MeshRules.optimizer_shardings`), the batch is split over
the mesh axes of ``batch`` along its leading dimension (`MeshRules.batch_sharding`),
and XLA inserts the collectives: the gradient all-reduce of data parallelism, the
per-layer weight all-gathers and gradient reduce-scatters of FSDP, the activation
all-reduces of tensor parallelism. The step computes what the unsharded step computes
(same SR keys and bits, global amaxes); only floating-point summation orders differ.

**FP4 weight gathers** (`MeshRules.fp4_gather`, on by default): a parameter sharded over
a mesh axis that also splits the batch (``fsdp`` in `DEFAULT_RULES`) must be gathered
for every GEMM that uses it. When an fp4jax layer quantizes that weight, the step has it
quantized once per shard (global amax) and all-gathers the packed NVFP4 codes and E4M3
scales instead of the high-precision values (`fp4jax.FP4Gather`, docs/SHARDING.md):
about 3.9x fewer bytes than BF16, the same results bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from fp4jax.weight_gather import FP4Gather

MeshAxes = str | tuple[str, ...] | None
"""One or more mesh axes (None: none)."""

Rules = tuple[tuple[str, MeshAxes], ...]
"""``((logical axis name, mesh axes), ...)``, in order of precedence."""

DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("vocab", "model"),
    ("embed", "fsdp"),
    ("mlp", "model"),
    ("heads", "model"),
)
"""Data parallel over ``data``, FSDP over ``fsdp``, Megatron tensor parallel over ``model``.

Logical names: ``batch`` (a batch's leading dimension), ``embed`` (the model width),
``mlp`` (the MLP hidden width), ``heads`` (attention heads × head dimension),
``vocab``. Names without a rule (e.g. ``norm``) are replicated."""


def _mesh_axes_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _check_rules(rules: Any, what: str) -> Rules:
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
        raise TypeError(f"{what} must be a sequence of (logical name, mesh axes) pairs, "
                        f"got {rules!r}")
    out = []
    for rule in rules:
        if not (isinstance(rule, Sequence) and len(rule) == 2 and isinstance(rule[0], str)):
            raise TypeError(f"each rule of {what} must be a (logical name, mesh axes) pair, "
                            f"got {rule!r}")
        name, axes = rule
        if not (axes is None or isinstance(axes, str)
                or (isinstance(axes, Sequence) and all(isinstance(a, str) for a in axes))):
            raise TypeError(f"rule {rule!r}: mesh axes must be None, a name or a tuple of names")
        out.append((name, axes if axes is None or isinstance(axes, str) else tuple(axes)))
    return tuple(out)


def path_name(path: tuple) -> str:
    """A pytree path as a dotted name: ``blocks.0.mlp.up.kernel`` (what `param_rules` match)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)


def _is_annotated(x: Any) -> bool:
    from flax import nnx
    from flax.core import meta

    return isinstance(x, (nnx.Variable, meta.AxisMetadata))


def _leaf_value(x: Any) -> Any:
    from flax import nnx
    from flax.core import meta

    if isinstance(x, nnx.Variable):
        return x.get_value()
    if isinstance(x, meta.AxisMetadata):
        return x.unbox()
    return x


def _annotation(x: Any) -> tuple | None:
    """The logical (or mesh) axis names a parameter carries, or None."""
    from flax import nnx
    from flax.core import meta

    if isinstance(x, nnx.Variable):
        names = x.get_metadata().get("out_sharding")
        if isinstance(names, NamedSharding):
            names = names.spec
        return tuple(names) if names else None
    if isinstance(x, meta.Partitioned):  # linen; LogicallyPartitioned is a subclass
        return tuple(x.names)
    return None


def _rewrap(x: Any, value: Any) -> Any:
    """``value`` in the place of ``x``'s array (same Variable or box, same metadata)."""
    from flax import nnx
    from flax.core import meta

    if isinstance(x, nnx.Variable):
        return x.replace(value)
    if isinstance(x, meta.AxisMetadata):
        return x.replace_boxed(value)
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshRules:
    """A device mesh and the rules that lay a training step out on it.

    Attributes:
      mesh: the device mesh (``jax.make_mesh``). Its axes are used as
        ``AxisType.Auto`` whatever their declared type: XLA partitions the step, so
        model code needs no sharding annotations beyond its parameters' axis names.
      rules: logical-axis rules (`DEFAULT_RULES`); mesh axes the mesh does not have
        are dropped from them.
      param_rules: ``((regex, logical axis names), ...)``: a parameter whose dotted
        path (`path_name`, e.g. ``blocks.0.mlp.up.kernel``) the regex fullmatches
        (first match wins) gets these names, before and instead of the model's own
        annotation. For models without annotations (e.g. plain linen ``params``).
      batch_axis: the logical name of a batch's leading dimension.
      fp4_gather: gather FSDP-sharded weights of NVFP4 layers as NVFP4 codes and
        scales (`fp4_gathers`); False: XLA gathers them in their compute dtype (the
        plain FSDP baseline). Results are the same either way.

    Example:
      >>> import jax
      >>> from jax.sharding import PartitionSpec as P
      >>> from fp4jax.parallel import MeshRules
      >>> rules = MeshRules(mesh=jax.make_mesh((1, 1), ("data", "model")))
      >>> rules.spec(("embed", "mlp")), rules.spec(("mlp", "embed")), rules.batch_spec
      (P(None, 'model'), P('model', None), P('data',))
    """

    mesh: Mesh
    rules: Rules = DEFAULT_RULES
    param_rules: tuple[tuple[str, tuple[str | None, ...]], ...] = ()
    batch_axis: str = "batch"
    fp4_gather: bool = True

    def __post_init__(self):
        if not isinstance(self.mesh, Mesh):
            raise TypeError(f"mesh must be a jax.sharding.Mesh (jax.make_mesh), got "
                            f"{type(self.mesh).__name__}")
        object.__setattr__(self, "rules", _check_rules(self.rules, "rules"))
        param_rules = []
        for rule in self.param_rules:
            if not (isinstance(rule, Sequence) and len(rule) == 2 and isinstance(rule[0], str)
                    and isinstance(rule[1], Sequence) and not isinstance(rule[1], str)):
                raise TypeError("each param_rules entry must be (regex, logical axis names "
                                f"tuple), got {rule!r}")
            try:
                re.compile(rule[0])
            except re.error as e:
                raise ValueError(f"param_rules: bad regex {rule[0]!r}: {e}") from None
            param_rules.append((rule[0], tuple(rule[1])))
        object.__setattr__(self, "param_rules", tuple(param_rules))
        if not isinstance(self.batch_axis, str):
            raise TypeError(f"batch_axis must be a logical axis name, got {self.batch_axis!r}")
        if not isinstance(self.fp4_gather, bool):
            raise TypeError(f"fp4_gather must be a bool, got {self.fp4_gather!r}")

    @functools.cached_property
    def auto_mesh(self) -> Mesh:
        """The mesh with every axis ``AxisType.Auto`` (what the shardings use)."""
        return self._typed_mesh(AxisType.Auto)

    def _typed_mesh(self, axis_type: AxisType) -> Mesh:
        m = self.mesh
        if all(t == axis_type for t in m.axis_types):
            return m
        return Mesh(m.devices, m.axis_names, axis_types=(axis_type,) * len(m.axis_names))

    @functools.cached_property
    def _mesh_rules(self) -> Rules:
        """The rules on this mesh: absent mesh axes dropped, each mesh axis as its own name."""
        present = set(self.mesh.axis_names)
        out = []
        for name, axes in self.rules:
            kept = tuple(a for a in _mesh_axes_tuple(axes) if a in present)
            if axes is None:
                out.append((name, None))
            elif kept:
                out.append((name, kept[0] if len(kept) == 1 else kept))
        return tuple(out) + tuple((a, a) for a in self.mesh.axis_names)

    def spec(self, names: Sequence[str | None]) -> PartitionSpec:
        """The mesh axes of an array whose dimensions have these logical names."""
        from flax import linen

        return linen.logical_to_mesh_axes(tuple(names), self._mesh_rules)

    @property
    def batch_spec(self) -> PartitionSpec:
        """The mesh axes of a batch's leading dimension."""
        return self.spec((self.batch_axis,))

    @property
    def batch_shards(self) -> int:
        """Into how many parts the batch is split."""
        return math.prod(self.mesh.shape[a] for a in _mesh_axes_tuple(self.batch_spec[0]))

    def batch_sharding(self) -> NamedSharding:
        """Every batch leaf split along its leading dimension (a prefix for the whole batch)."""
        return NamedSharding(self.auto_mesh, self.batch_spec)

    def replicated(self) -> NamedSharding:
        """A copy on every device."""
        return NamedSharding(self.auto_mesh, PartitionSpec())

    def check_batch(self, batch: Any) -> None:
        """Raises a `ValueError` unless every batch leaf splits evenly over the batch axes."""
        n = self.batch_shards
        for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]:
            shape = np.shape(x)
            if not shape or shape[0] % n:
                raise ValueError(
                    f"batch leaf {path_name(path) or '<root>'} of shape {shape}: its leading "
                    f"dimension must split evenly over the batch's mesh axes "
                    f"{self.batch_spec[0]!r} ({n} parts)"
                )

    def logical_axes(self, params: Any) -> dict[str, tuple | None]:
        """``{path: logical axis names or None}`` of every parameter (what the rules see)."""
        flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_annotated)[0]
        return {path_name(p): self._names(path_name(p), x) for p, x in flat}

    def _names(self, path: str, x: Any) -> tuple | None:
        for pattern, names in self.param_rules:
            if re.fullmatch(pattern, path):
                return names
        return _annotation(x)

    def _leaf_sharding(self, path: str, x: Any) -> NamedSharding:
        names = self._names(path, x)
        shape = np.shape(_leaf_value(x))
        if names is None:
            return self.replicated()
        if len(names) != len(shape):
            raise ValueError(
                f"parameter {path} of shape {shape} has {len(shape)} dimensions but its "
                f"logical axes {names} name {len(names)}"
            )
        spec = self.spec(names)
        for dim, (size, axes) in enumerate(zip(shape, spec)):
            n = math.prod(self.mesh.shape[a] for a in _mesh_axes_tuple(axes))
            if size % n:
                raise ValueError(
                    f"parameter {path} of shape {shape}: dimension {dim} ({names[dim]!r}, "
                    f"size {size}) does not split evenly over mesh axes {axes!r} ({n} devices)"
                )
        return NamedSharding(self.auto_mesh, spec)

    def param_shardings(self, params: Any) -> Any:
        """A `NamedSharding` for every parameter, in the structure of ``params``.

        Raises:
          ValueError: if a parameter's logical axes do not match its rank, or a
            dimension does not split evenly over its mesh axes.
        """

        def shard(path, x):
            return _rewrap(x, self._leaf_sharding(path_name(path), x))

        return jax.tree_util.tree_map_with_path(shard, params, is_leaf=_is_annotated)

    def fsdp_axes(self, spec: PartitionSpec) -> tuple[str, ...]:
        """The mesh axes (of more than one device) over which a parameter sharded as
        ``spec`` is gathered for its GEMMs: those that also split the batch (FSDP).
        Other axes (tensor parallelism) stay sharded.

        Example:
          >>> import jax
          >>> from jax.sharding import PartitionSpec as P
          >>> from fp4jax.parallel import MeshRules
          >>> MeshRules(mesh=jax.make_mesh((1, 1), ("fsdp", "model"))).fsdp_axes(P("fsdp"))
          ()
        """
        batch = set(_mesh_axes_tuple(self.batch_spec[0]))
        return tuple(a for entry in spec for a in _mesh_axes_tuple(entry)
                     if a in batch and self.mesh.shape[a] > 1)

    def fp4_gathers(self, params: Any) -> dict[str, tuple[tuple[int, ...], FP4Gather]]:
        """``{path: (shape, FP4Gather)}`` for every parameter FSDP shards (`fsdp_axes`);
        empty when ``fp4_gather`` is False.

        `fp4jax.train` hands these to its step scope: an fp4jax layer named ``N`` whose
        right operand is parameter ``N.kernel`` (Flax's name for a matmul layer's
        weight) or ``N`` gathers it in NVFP4 where the shards hold whole 16-blocks
        (`fp4jax.flax.Scope.rhs_gather`). Works on traced parameters (shapes and
        annotations only).
        """
        if not self.fp4_gather:
            return {}
        out = {}
        flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_annotated)[0]
        for p, x in flat:
            path = path_name(p)
            spec = self._leaf_sharding(path, x).spec
            axes = self.fsdp_axes(spec)
            if axes:
                shape = tuple(np.shape(_leaf_value(x)))
                spec = PartitionSpec(*(tuple(spec) + (None,) * (len(shape) - len(spec))))
                out[path] = (shape, FP4Gather(axes=axes, spec=spec))
        return out

    def annotated_shardings(self, tree: Any) -> Any:
        """Shardings of non-parameter state: annotated leaves as annotated, the rest replicated."""

        def shard(path, x):
            if _annotation(x) is None:
                return _rewrap(x, self.replicated())
            return _rewrap(x, self._leaf_sharding(path_name(path), x))

        return jax.tree_util.tree_map_with_path(shard, tree, is_leaf=_is_annotated)

    def optimizer_shardings(self, optimizer: Any, params: Any, param_shardings: Any) -> Any:
        """Shardings of ``optimizer.init(params)``: each leaf sharded like the parameter it
        was computed from (Adam moments like their parameter), scalars replicated.

        ``optimizer.init`` is traced under an ``AxisType.Explicit`` copy of the mesh, where
        every array's sharding is part of its type and follows it through ``zeros_like``
        and friends; nothing is computed.
        """
        explicit = self._typed_mesh(AxisType.Explicit)
        abstract = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype,
                                              sharding=NamedSharding(explicit, s.spec)),
            params, param_shardings,
        )
        try:
            with jax.set_mesh(explicit):
                out = jax.eval_shape(optimizer.init, abstract)
        except Exception as e:  # noqa: BLE001 - re-raised with what failed
            raise ValueError(
                "could not derive the optimizer state's shardings: optimizer.init failed when "
                f"traced with sharded parameters ({type(e).__name__}: {e})"
            ) from e

        def to_auto(x):
            spec = getattr(getattr(x, "sharding", None), "spec", None)
            return NamedSharding(self.auto_mesh, PartitionSpec() if spec is None else spec)

        return jax.tree.map(to_auto, out)
