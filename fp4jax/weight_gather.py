"""FP4 all-gather of a sharded weight (FSDP): gather packed codes and scales, not BF16.

Under FSDP a weight is stored sharded along a mesh axis (``"fsdp"``, or the data axis)
and every GEMM that uses it needs the whole of it. Gathering the high-precision values
moves 16 bits per element; `FP4Gather` makes `fp4jax.dot_general` quantize each
device's shard once (the global amax is the whole tensor's: XLA all-reduces the max
of a sharded array) and gather the NVFP4 copy instead: 4 bits of code per element plus
one E4M3 scale per block (per 16×16 tile for the paper's 2D weights), about 3.9× fewer
bytes than BF16. Because quantization is elementwise within blocks and the amax is
global, the gathered codes and scales equal those of the unsharded weight bit for bit
(docs/SHARDING.md).

How the gather is expressed: under a mesh with explicit axes the NVFP4 leaves are
`jax.sharding.reshard`-ed to the weight's spec without the gathered axes; under auto
axes they are pinned to the weight's spec and then constrained to the gathered one with
`jax.lax.with_sharding_constraint`, so that XLA quantizes per shard and all-gathers the
uint8 codes and the scales' bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, PartitionSpec

from fp4jax.numerics.nvfp4_array import NVFP4Array


def mesh_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one `PartitionSpec` entry (None, a name or a tuple of names).

    Example:
      >>> mesh_axes(("data", "model")), mesh_axes("data"), mesh_axes(None)
      (('data', 'model'), ('data',), ())
    """
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def without_axes(spec: PartitionSpec, axes: tuple[str, ...]) -> PartitionSpec:
    """``spec`` with the mesh ``axes`` removed from every entry (those dims are gathered).

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> without_axes(P(("fsdp", "data"), "model"), ("fsdp",))
      P('data', 'model')
    """
    out = []
    for entry in spec:
        kept = tuple(a for a in mesh_axes(entry) if a not in axes)
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FP4Gather:
    """Gather a sharded right operand (a weight) in NVFP4 over some mesh axes (FSDP).

    Pass it as ``rhs_gather=`` to `fp4jax.dot_general` (or `fp4jax.flax.DotGeneral`,
    ``fp4jax.flax.nnx.quantize(..., rhs_gather=...)``). Every GEMM that uses the right
    operand then sees it gathered over ``axes``: the NVFP4 copies (fprop's, and dgrad's,
    which with the paper's 16×16 tiles is the same one, kept as the backward residual)
    are quantized per shard and gathered as packed codes and E4M3 scales; a copy the
    recipe leaves unquantized is gathered in its own dtype. The weight gradient comes
    back sharded like the weight (a reduce-scatter). Results equal those of the
    ungathered call bit for bit.

    Each shard must hold whole 16-blocks along the quantized axes (whole 16×16 tiles
    for 2D weights): a `ValueError` says which dim does not. Under explicit axes an
    operand whose type is not sharded over ``axes`` is used as it is (so one
    `FP4Gather` can serve every layer of a model).

    Attributes:
      axes: the mesh axes to gather over (e.g. ``("fsdp",)``); a single name is
        accepted.
      spec: the right operand's `PartitionSpec`, in its own dims. Needed under auto
        axes (the traced value carries no sharding); under explicit axes it is read
        from the operand's type and, if given, must equal it.

    Example:
      >>> import fp4jax
      >>> from jax.sharding import PartitionSpec as P
      >>> fp4jax.FP4Gather(axes="fsdp", spec=P("fsdp", "model")).axes
      ('fsdp',)
    """

    axes: tuple[str, ...]
    spec: PartitionSpec | None = None

    def __post_init__(self):
        axes = (self.axes,) if isinstance(self.axes, str) else self.axes
        if (not isinstance(axes, (tuple, list)) or not axes
                or not all(isinstance(a, str) and a for a in axes)):
            raise TypeError(f"axes must be a mesh axis name or a non-empty tuple of them, "
                            f"got {self.axes!r}")
        object.__setattr__(self, "axes", tuple(axes))
        if self.spec is not None:
            if not isinstance(self.spec, PartitionSpec):
                raise TypeError(f"spec must be a jax.sharding.PartitionSpec or None, got "
                                f"{type(self.spec).__name__}")
            if not any(a in self.axes for entry in self.spec for a in mesh_axes(entry)):
                raise ValueError(f"FP4Gather(axes={self.axes}): spec {self.spec} is not sharded "
                                 "over any of these axes; nothing to gather")


def holds_whole_blocks(spec: PartitionSpec, shape: tuple[int, ...], contracting: tuple[int, ...],
                       batch: tuple[int, ...], mesh_shape: Any) -> bool:
    """Whether each shard of a right operand of ``shape`` sharded as ``spec`` holds whole
    16-blocks of its contraction (K) and its output features (N), as an `FP4Gather` of
    it needs (its NVFP4 copies are blocked along K or N, or tiled 16x16).

    K is the product of the ``contracting`` dims, N of the remaining non-``batch`` dims
    (the canonical form of `fp4jax.dot_general`); each must be a multiple of 16 times
    the number of devices its dims are split over. ``mesh_shape``: mesh axis -> size.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> holds_whole_blocks(P("fsdp", None), (64, 48), (0,), (), {"fsdp": 4})  # 16 rows each
      True
      >>> holds_whole_blocks(P(None, "fsdp"), (64, 48), (0,), (), {"fsdp": 4})  # 12 columns
      False
    """
    sizes = dict(mesh_shape)
    spec = _padded(spec, len(shape))
    free = tuple(d for d in range(len(shape)) if d not in contracting + batch)
    for dims in (contracting, free):
        size = math.prod(shape[d] for d in dims)
        ways = math.prod(sizes[a] for d in dims for a in mesh_axes(spec[d]))
        if size % (16 * ways):
            return False
    return True


def explicit_axes(x: jax.Array) -> bool:
    """Whether ``x``'s sharding (its type's) lives on a mesh with explicit axes."""
    types = getattr(jax.typeof(x).sharding.mesh, "axis_types", ())
    return any(t == AxisType.Explicit for t in types)


def _padded(spec: PartitionSpec, ndim: int) -> PartitionSpec:
    if len(spec) > ndim:
        raise ValueError(f"spec {spec} has more entries than the operand's rank {ndim}")
    return PartitionSpec(*(tuple(spec) + (None,) * (ndim - len(spec))))


@functools.partial(jax.tree_util.register_static)
@dataclasses.dataclass(frozen=True)
class Gather:
    """One call's gather: the operand's spec before it (``sharded``, in the dims of the
    array it applies to), the mesh axes gathered over, the mesh's axis sizes, and whether
    the axes are explicit (`jax.sharding.reshard`) or auto
    (`jax.lax.with_sharding_constraint`)."""

    sharded: PartitionSpec
    axes: tuple[str, ...]
    explicit: bool
    mesh_shape: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, config: FP4Gather, x: jax.Array) -> Gather:
        """The gather of operand ``x`` (in its own dims) that ``config`` asks for.

        Raises:
          ValueError: under auto axes without ``config.spec`` or without a mesh in
            context (`jax.set_mesh`); under explicit axes with a ``config.spec`` that
            differs from the type's.
        """
        explicit = explicit_axes(x)
        if explicit:
            sharding = jax.typeof(x).sharding
            spec = _padded(sharding.spec, x.ndim)
            if config.spec is not None and _padded(config.spec, x.ndim) != spec:
                raise ValueError(f"FP4Gather(spec={config.spec}) differs from the right "
                                 f"operand's sharding {spec} (explicit mesh axes: leave spec out)")
            mesh = sharding.mesh
        else:
            if config.spec is None:
                raise ValueError(
                    f"FP4Gather(axes={config.axes}) under auto mesh axes needs spec=, the right "
                    f"operand's PartitionSpec (shape {x.shape}): a traced value carries no "
                    "sharding")
            spec = _padded(config.spec, x.ndim)
            mesh = jax.sharding.get_abstract_mesh()
        names = {a for entry in spec for a in mesh_axes(entry)}
        if mesh.empty or not names <= set(mesh.axis_names):
            raise ValueError(
                f"FP4Gather: the spec {spec} names mesh axes {sorted(names)}, but the mesh in "
                f"context is {mesh}; run inside `with jax.set_mesh(mesh):`")
        return cls(spec, config.axes, explicit, tuple(mesh.shape.items()))

    @property
    def gathered(self) -> PartitionSpec:
        """The spec after the gather: `sharded` without the gathered axes."""
        return without_axes(self.sharded, self.axes)

    def with_spec(self, sharded: PartitionSpec) -> Gather:
        """The same gather for another view of the operand (e.g. its canonical reshape),
        sharded as ``sharded`` before the gather."""
        return dataclasses.replace(self, sharded=sharded)

    def constrain(self, x: jax.Array, spec: PartitionSpec) -> jax.Array:
        """``x`` resharded (explicit axes) or constrained (auto axes) to ``spec``."""
        if self.explicit:
            return jax.sharding.reshard(x, spec)
        return lax.with_sharding_constraint(x, spec)

    def last_dim_as(self, x: jax.Array, dim: int) -> jax.Array:
        """Auto axes: ``x`` (a canonical GEMM operand or result, ``(B, M, ·)``) with its
        last dim sharded like dim ``dim`` (1: K, 2: N) of the gathered canonical weight and
        its other dims left to XLA. A GEMM so pinned uses the whole gathered weight
        instead of partitioning on the weight's stored sharding, which would slice the
        decoded weight and gather it again in high precision. Explicit axes: ``x``."""
        if self.explicit:
            return x
        free = PartitionSpec.UNCONSTRAINED
        return lax.with_sharding_constraint(
            x, PartitionSpec(*((free,) * (x.ndim - 1)), self.gathered[dim]))

    def array(self, x: jax.Array) -> jax.Array:
        """A high-precision operand gathered, in its own dtype."""
        if not self.explicit:  # where it is sharded before, so XLA gathers from there
            x = self.constrain(x, self.sharded)
        return self.constrain(x, self.gathered)

    def nvfp4(self, q: NVFP4Array) -> NVFP4Array:
        """An NVFP4 operand, quantized per shard, with its codes and scales gathered.

        ``q``'s leaves have the operand's dims (codes: the quantized axis halved;
        scales: the blocked dims divided by 16), so the operand's spec applies to them.

        Raises:
          ValueError: a shard does not hold whole 16-blocks (16×16 tiles for 2D).
        """
        sizes = dict(self.mesh_shape)
        for name, leaf in (("codes", q.data), ("block scales", q.scales)):
            for d, entry in enumerate(self.sharded):
                n = math.prod(sizes[a] for a in mesh_axes(entry))
                if leaf.shape[d] % n:
                    raise ValueError(
                        f"FP4Gather: dim {d} of the operand (shape {q.shape}) is sharded {n} "
                        f"ways over {entry}, but its {name} {leaf.shape} do not split evenly: "
                        "each shard must hold whole 16-blocks"
                        + (" (16x16 tiles)" if q.block_2d else ""))
        # The E4M3 scales travel as their bytes: a backend without float8 collectives
        # (XLA:CPU) would otherwise widen them to 16 bits for the gather.
        data, scales = q.data, lax.bitcast_convert_type(q.scales, jnp.uint8)
        if not self.explicit:  # quantized where the shards are
            data, scales = self.constrain(data, self.sharded), self.constrain(scales, self.sharded)
        scales = lax.bitcast_convert_type(self.constrain(scales, self.gathered), q.scales.dtype)
        return dataclasses.replace(q, data=self.constrain(data, self.gathered), scales=scales)
