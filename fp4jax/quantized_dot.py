"""`dot_general` with NVFP4 forward, data-gradient and weight-gradient GEMMs.

A drop-in for `jax.lax.dot_general` whose three GEMMs are each quantized as a
`Recipe` says (docs/RECIPE.md §6). Any dimension numbers work: operands are brought to a
canonical ``(B, M, K) × (B, K, N)`` form (batch dims flattened to B, free dims to M
and N, contracting dims to K), so 16-blocks run along the flattened contraction.

Stochastic-rounding keys: pass one ``jax.random`` key per call (``key=``); the six
GEMM operands draw from ``jax.random.fold_in(key, role)`` with a fixed role number
each, so the two gradient tensors of one call never share bits. To give every layer
and every step different bits deterministically, derive the key per step
(``fold_in(run_key, step)``) and per layer (`fp4jax.layer_key`); `fp4jax.flax` does
this for you. Each ``fold_in`` is a threefry hash that the compiler handles as a unit of
its own, so a caller that knows many calls' keys ahead of time may derive all their
operand keys at once (``jax.vmap(role_key_table)(keys)``) and pass each call its row
(``role_table=``) instead of its key: the same bits.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax import implementation, weight_gather
from fp4jax.implementation import Impl
from fp4jax.numerics import checks, layout, random_bits
from fp4jax.numerics.nvfp4_array import DecodedNVFP4, NVFP4Array
from fp4jax.recipe import Operand, Recipe
from fp4jax.weight_gather import FP4Gather

_Dims = tuple[int, ...]
DimensionNumbers = tuple[tuple[_Dims, _Dims], tuple[_Dims, _Dims]]

ROLE_IDS = {
    "fprop_lhs": 0,
    "fprop_rhs": 1,
    "dgrad_grad": 2,
    "dgrad_rhs": 3,
    "wgrad_lhs": 4,
    "wgrad_grad": 5,
}


def _mesh_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _spec_of(dims_axes: list[tuple[str, ...]]) -> jax.sharding.PartitionSpec:
    """A PartitionSpec from each output dim's mesh axes; an axis already used is dropped."""
    used: set[str] = set()
    out = []
    for axes in dims_axes:
        axes = tuple(a for a in axes if a not in used)
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return jax.sharding.PartitionSpec(*out)


@functools.partial(jax.tree_util.register_static)
class Canonical:
    """Static description of the canonical (B, M, K) x (B, K, N) form of one call.

    Under an explicit mesh it also holds the operands' `PartitionSpec`s, so that every
    reshape that merges or splits dims states its output sharding (JAX requires it when
    a sharded dim is not the major one of a merge).
    """

    def __init__(self, lhs_shape, rhs_shape, dn: DimensionNumbers, lhs_dtype, rhs_dtype,
                 lhs_spec=None, rhs_spec=None):
        (lc, rc), (lb, rb) = dn
        self.lhs_shape, self.rhs_shape = tuple(lhs_shape), tuple(rhs_shape)
        self.lhs_dtype, self.rhs_dtype = jnp.dtype(lhs_dtype), jnp.dtype(rhs_dtype)
        explicit = lhs_spec is not None or rhs_spec is not None
        self.lhs_spec = tuple(lhs_spec or (None,) * len(lhs_shape)) if explicit else None
        self.rhs_spec = tuple(rhs_spec or (None,) * len(rhs_shape)) if explicit else None
        lf = tuple(d for d in range(len(lhs_shape)) if d not in lb + lc)
        rf = tuple(d for d in range(len(rhs_shape)) if d not in rb + rc)
        self.lhs_perm = lb + lf + lc
        self.rhs_perm = rb + rc + rf
        self._lhs_groups, self._rhs_groups = (lb, lf, lc), (rb, rc, rf)
        size = lambda shape, dims: math.prod(shape[d] for d in dims)  # noqa: E731
        self.B = size(lhs_shape, lb)
        self.M = size(lhs_shape, lf)
        self.K = size(lhs_shape, lc)
        self.N = size(rhs_shape, rf)
        self.batch_shape = tuple(lhs_shape[d] for d in lb)
        self.out_shape = self.batch_shape + tuple(lhs_shape[d] for d in lf) + tuple(
            rhs_shape[d] for d in rf
        )

    def _key(self):
        return (self.lhs_shape, self.rhs_shape, self.lhs_perm, self.rhs_perm,
                self.lhs_dtype, self.rhs_dtype, self.lhs_spec, self.rhs_spec)

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, Canonical) and self._key() == other._key()

    def _merged(self, spec, groups):
        if self.lhs_spec is None:
            return None
        return _spec_of([sum((_mesh_axes(spec[d]) for d in g), ()) for g in groups])

    def rhs_spec_of(self, spec: jax.sharding.PartitionSpec) -> jax.sharding.PartitionSpec:
        """The canonical (B, K, N) spec of a right operand sharded as ``spec``."""
        return _spec_of([sum((_mesh_axes(spec[d]) for d in g), ()) for g in self._rhs_groups])

    def _out_spec(self):
        if self.lhs_spec is None:
            return None
        dims = [(self.lhs_spec, d) for d in self._lhs_groups[0] + self._lhs_groups[1]]
        dims += [(self.rhs_spec, d) for d in self._rhs_groups[2]]
        return _spec_of([_mesh_axes(spec[d]) for spec, d in dims])

    def _grad_spec(self):
        if self.lhs_spec is None:
            return None
        lhs_axes = [sum((_mesh_axes(self.lhs_spec[d]) for d in g), ())
                    for g in self._lhs_groups[:2]]
        rhs_axes = sum((_mesh_axes(self.rhs_spec[d]) for d in self._rhs_groups[2]), ())
        return _spec_of(lhs_axes + [rhs_axes])

    @staticmethod
    def _reshape(x: jax.Array, shape, spec) -> jax.Array:
        return x.reshape(shape) if spec is None else lax.reshape(x, shape, out_sharding=spec)

    def lhs(self, x: jax.Array) -> jax.Array:
        return self._reshape(jnp.transpose(x, self.lhs_perm), (self.B, self.M, self.K),
                             self._merged(self.lhs_spec, self._lhs_groups))

    def rhs(self, w: jax.Array) -> jax.Array:
        return self._reshape(jnp.transpose(w, self.rhs_perm), (self.B, self.K, self.N),
                             self._merged(self.rhs_spec, self._rhs_groups))

    def out(self, y: jax.Array) -> jax.Array:
        return self._reshape(y, self.out_shape, self._out_spec())

    def grad(self, g: jax.Array) -> jax.Array:
        return self._reshape(g, (self.B, self.M, self.N), self._grad_spec())

    def lhs_back(self, da: jax.Array) -> jax.Array:
        shape = tuple(self.lhs_shape[d] for d in self.lhs_perm)
        spec = None if self.lhs_spec is None else jax.sharding.PartitionSpec(
            *(self.lhs_spec[d] for d in self.lhs_perm))
        da = self._reshape(da, shape, spec)
        return jnp.transpose(da, np.argsort(self.lhs_perm)).astype(self.lhs_dtype)

    def rhs_back(self, db: jax.Array) -> jax.Array:
        shape = tuple(self.rhs_shape[d] for d in self.rhs_perm)
        spec = None if self.rhs_spec is None else jax.sharding.PartitionSpec(
            *(self.rhs_spec[d] for d in self.rhs_perm))
        db = self._reshape(db, shape, spec)
        return jnp.transpose(db, np.argsort(self.rhs_perm)).astype(self.rhs_dtype)


def explicit_spec(x: Any) -> jax.sharding.PartitionSpec | None:
    """The `PartitionSpec` of ``x`` (an array or an NVFP4Array's codes) under a mesh with
    explicit axes, else None (auto or no sharding: XLA decides)."""
    s = jax.typeof(x.data if isinstance(x, NVFP4Array) else x).sharding
    types = getattr(s.mesh, "axis_types", ())
    if not any(t == jax.sharding.AxisType.Explicit for t in types):
        return None
    spec = tuple(s.spec) + (None,) * (len(jax.typeof(x.data if isinstance(x, NVFP4Array)
                                                      else x).shape) - len(s.spec))
    return jax.sharding.PartitionSpec(*spec)


@functools.partial(jax.tree_util.register_static)
@dataclasses.dataclass(frozen=True)
class GemmShardings:
    """Output shardings of the three canonical GEMMs under an explicit mesh (None: XLA
    decides). dgrad's output is sharded like X, wgrad's like W, fprop's takes X's batch
    and token axes and W's output-feature axis."""

    fprop: jax.sharding.PartitionSpec | None = None
    dgrad: jax.sharding.PartitionSpec | None = None
    wgrad: jax.sharding.PartitionSpec | None = None

    @classmethod
    def of(cls, a: jax.Array, b: jax.Array,
           gemm_rhs: jax.sharding.PartitionSpec | None = None) -> GemmShardings:
        """The shardings for canonical operands ``a`` and ``b``; ``gemm_rhs``: the spec
        of the right operand the GEMMs see, when it differs from ``b``'s (gathered)."""
        sa, sb = explicit_spec(a), explicit_spec(b)
        if sa is None and sb is None:
            return cls()
        sa = sa or jax.sharding.PartitionSpec(None, None, None)
        sb = sb or jax.sharding.PartitionSpec(None, None, None)
        used = {n for d in (sa[0], sa[1]) for n in ((d,) if isinstance(d, str) else d or ())}
        n_axis = (sb if gemm_rhs is None else gemm_rhs)[2]
        names = (n_axis,) if isinstance(n_axis, str) else (n_axis or ())
        if used & set(names):
            n_axis = None  # a mesh axis cannot shard two output dims
        return cls(fprop=jax.sharding.PartitionSpec(sa[0], sa[1], n_axis), dgrad=sa, wgrad=sb)


def normalize_dimension_numbers(dn: Any, lhs_ndim: int, rhs_ndim: int) -> DimensionNumbers:
    """Validated dimension numbers with non-negative dims, or a `ValueError` naming them."""
    try:
        (lc, rc), (lb, rb) = dn
        norm = lambda dims, nd, what: tuple(  # noqa: E731
            layout.normalize_axis(int(d), nd, what) for d in dims
        )
        out = (
            (norm(lc, lhs_ndim, "lhs contracting dim"), norm(rc, rhs_ndim, "rhs contracting dim")),
            (norm(lb, lhs_ndim, "lhs batch dim"), norm(rb, rhs_ndim, "rhs batch dim")),
        )
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"invalid dimension_numbers {dn!r} for ranks {lhs_ndim} and {rhs_ndim}: {e}"
        ) from e
    (lc, rc), (lb, rb) = out
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ValueError(f"dimension_numbers {dn!r} pair unequal numbers of dims")
    if len(set(lc + lb)) != len(lc + lb) or len(set(rc + rb)) != len(rc + rb):
        raise ValueError(f"dimension_numbers {dn!r} repeat a dimension")
    return out


class _RoleTable(NamedTuple):
    """A call's operand keys derived ahead of time (`role_key_table`), carried where the
    call's key goes: `role_key` looks them up instead of deriving them."""

    keys: jax.Array


def role_key_table(key: jax.Array) -> jax.Array:
    """The SR keys of all operands of a call with ``key``, from one batched ``fold_in``.

    ``role_key_table(key)[ROLE_IDS[role]]`` is ``fold_in(key, ROLE_IDS[role])``, bit for
    bit the key `role_key` derives. Under ``jax.vmap`` over several calls' keys it stays
    one hash for all of them; pass a call its row as ``dot_general(..., role_table=)``.

    Args:
      key: the call's key (typed or raw).

    Returns:
      ``len(ROLE_IDS)`` keys, in ``ROLE_IDS`` order (typed: shape ``(6,)``; raw: ``(6, 2)``).

    Example:
      >>> import jax
      >>> from fp4jax.quantized_dot import ROLE_IDS, role_key_table
      >>> k = jax.random.key(0)
      >>> t = role_key_table(k)
      >>> bool((jax.random.key_data(t[ROLE_IDS["wgrad_grad"]]) == jax.random.key_data(
      ...     jax.random.fold_in(k, ROLE_IDS["wgrad_grad"]))).all())
      True
    """
    key = random_bits.check_key(key)
    ids = jnp.arange(len(ROLE_IDS), dtype=jnp.uint32)  # ROLE_IDS numbers roles 0 .. 5
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)


def check_role_table(table: Any) -> jax.Array:
    """Returns ``table`` if it is a `role_key_table` (one key per role); raises otherwise.

    Raises:
      TypeError: if ``table`` is not an array of ``jax.random`` keys (typed or raw uint32).
      ValueError: if it does not hold exactly one key per role (``len(ROLE_IDS)``).

    Example:
      >>> import jax
      >>> from fp4jax.quantized_dot import check_role_table
      >>> check_role_table(jax.random.split(jax.random.key(0), 3))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: role_table must hold one key per role (6, role_key_table(key)), got ...
    """
    if isinstance(table, (bool, int, float)) or not hasattr(table, "dtype"):
        raise TypeError(f"role_table must be an array of jax.random keys "
                        f"(role_key_table(key)), got {type(table).__name__}")
    table = jnp.asarray(table)
    n = len(ROLE_IDS)
    if jnp.issubdtype(table.dtype, jax.dtypes.prng_key):
        ok = table.shape == (n,)
    elif table.dtype == jnp.uint32:
        ok = table.ndim == 2 and table.shape[0] == n and table.shape[1] >= 2
    else:
        raise TypeError(f"role_table must be an array of jax.random keys "
                        f"(role_key_table(key)), got an array of dtype {table.dtype}")
    if not ok:
        raise ValueError(f"role_table must hold one key per role ({n}, role_key_table(key)), "
                         f"got {'keys' if table.dtype != jnp.uint32 else 'key data'} of "
                         f"shape {table.shape}")
    return table


def role_key(key: jax.Array | None, op: Operand, role: str) -> jax.Array | None:
    """The SR key of one GEMM operand: ``fold_in(key, ROLE_IDS[role])`` (looked up when
    ``key`` carries a call's `role_key_table`), or None for RNE."""
    if not op.stochastic:
        return None
    if isinstance(key, _RoleTable):
        return key.keys[ROLE_IDS[role]]
    return jax.random.fold_in(key, ROLE_IDS[role])


def role_keys(key: jax.Array | None, *requests: tuple[Operand, str]
              ) -> tuple[jax.Array | None, ...]:
    """`role_key` of several ``(op, role)`` pairs of one call, bit for bit, from one
    batched ``fold_in``: each ``fold_in`` is a threefry hash that the compiler handles
    as a unit of its own (a loop on CPU), so a layer's two gradient keys cost one."""
    need = [i for i, (op, _) in enumerate(requests) if op.stochastic]
    if len(need) < 2 or isinstance(key, _RoleTable):
        return tuple(role_key(key, op, role) for op, role in requests)
    ids = jnp.asarray([ROLE_IDS[requests[i][1]] for i in need], jnp.uint32)
    derived = jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)
    out: list[jax.Array | None] = [None] * len(requests)
    for j, i in enumerate(need):
        out[i] = derived[j]
    return tuple(out)


def quantize_operand(x: jax.Array, axis: int, op: Operand, key: jax.Array | None, role: str,
                     recipe: Recipe, impl: Impl = "xla", *,
                     derived_key: jax.Array | None = None) -> NVFP4Array:
    """Quantizes one canonical GEMM operand as ``op`` says (padding the axis for the RHT).

    ``derived_key``: the operand's own key, already derived (`role_keys`); else it is
    ``role_key(key, op, role)``.
    """
    if op.hadamard:  # the rotation needs whole 16-runs
        x = layout.pad_to_block(x, axis)
    if derived_key is None:
        derived_key = role_key(key, op, role)
    return implementation.quantize(
        x, axis=axis, block_2d=op.block_2d, rounding=op.rounding, key=derived_key,
        hadamard=op.hadamard, hadamard_signs=recipe.hadamard_signs if op.hadamard else None,
        scale_rule=op.scale_rule, impl=impl)


def _rowwise_and_columnwise(x, row_op: Operand, col_op: Operand, key, row_role: str,
                            col_role: str, recipe: Recipe, impl: Impl,
                            decoded: tuple[bool, bool] = (False, False)):
    """The rowwise (along the last axis) and columnwise (along tokens) copies of a
    canonical (B, M, X) tensor; one call of `implementation.quantize_rowwise_columnwise`
    (one read with the kernel) when the recipe asks for a 1D rowwise and a Hadamard
    columnwise copy with the same rounding. ``decoded``: the copies that one XLA GEMM
    multiplies right away, which the kernel may then return decoded."""
    row_key, col_key = role_keys(key, (row_op, row_role), (col_op, col_role))
    if (x.shape[0] == 1 and not row_op.block_2d and not row_op.hadamard and col_op.hadamard
            and row_op.rounding == col_op.rounding and row_op.scale_rule == "six"):
        row, col = implementation.quantize_rowwise_columnwise(
            x[0], rounding=row_op.rounding, row_key=row_key, col_key=col_key,
            hadamard_signs=recipe.hadamard_signs, impl=impl,
            decoded=decoded if impl == "auto" else (False, False))
        return row.expand_leading(), col.expand_leading()
    return (quantize_operand(x, 2, row_op, key, row_role, recipe, impl, derived_key=row_key),
            quantize_operand(x, 1, col_op, key, col_role, recipe, impl, derived_key=col_key))


def _bmm(a, b, precision, impl: Impl, out_sharding, *, lhs_from_mT: bool = False,  # noqa: N803
         output_scale=None) -> jax.Array:
    """(B, M, K) x (B, K, N) -> float32 (B, M, N), NVFP4 or high precision."""
    if isinstance(a, (NVFP4Array, DecodedNVFP4)):
        return implementation.matmul(a, b, preferred_element_type=jnp.float32, impl=impl,
                                     lhs_from_mT=lhs_from_mT, out_sharding=out_sharding,
                                     output_scale=output_scale)
    return lax.dot_general(
        a, b, (((2,), (1,)), ((0,), (0,))), precision=precision,
        preferred_element_type=jnp.float32, out_sharding=out_sharding,
    )


FORWARD_ROLES = ("fprop_lhs", "fprop_rhs", "dgrad_rhs", "wgrad_lhs")
"""Operands quantized in the forward pass (the GEMM's and the residuals kept for backward)."""

BACKWARD_ROLES = ("dgrad_grad", "wgrad_grad")
"""Operands quantized in the backward pass (the incoming gradient's two copies)."""


def missing_key_error(recipe: Recipe, roles: tuple[str, ...]) -> ValueError | None:
    """The error to raise when ``roles`` of ``recipe`` round stochastically without a key."""
    stochastic = [name for name, op in recipe.operands() if name in roles and op.stochastic]
    if not stochastic:
        return None
    return ValueError(
        f"the recipe rounds {', '.join(stochastic)} stochastically: pass "
        "key=jax.random.key(...) (one per call; see fp4jax.layer_key; fp4jax.flax layers: "
        "call them inside fp4jax.flax.step_scope, which fp4jax.train opens)"
    )


def _fwd(lhs, rhs, key, dn, precision, out_dtype, recipe: Recipe, impl: Impl,
         rhs_gather: FP4Gather | None):
    c = Canonical(lhs.shape, rhs.shape, dn, lhs.dtype, rhs.dtype,
                  explicit_spec(lhs), explicit_spec(rhs))
    a, b = c.lhs(lhs), c.rhs(rhs)
    gather = own_gather = None
    if rhs_gather is not None:  # every copy of W a GEMM uses is gathered (FSDP)
        own_gather = weight_gather.Gather.of(rhs_gather, rhs)
        gather = own_gather.with_spec(c.rhs_spec_of(own_gather.sharded))
    shardings = GemmShardings.of(a, b, None if gather is None else gather.gathered)
    if gather is not None:  # contract K where the gathered weight has it
        a = gather.last_dim_as(a, 1)
    r = recipe
    x_col = None
    if r.fprop_lhs.quantized and r.wgrad_lhs.quantized:
        # X rowwise (fprop) and X columnwise (wgrad), from one read where a kernel can.
        # X rowwise feeds only fprop: decoded by the kernel where XLA multiplies it.
        fprop_xla = implementation.auto_gemm_runs_xla(a.shape[1], b.shape[2], a.shape[2])
        qa, x_col = _rowwise_and_columnwise(a, r.fprop_lhs, r.wgrad_lhs, key, "fprop_lhs",
                                            "wgrad_lhs", r, impl, decoded=(fprop_xla, False))
    elif r.fprop_lhs.quantized:
        qa = quantize_operand(a, 2, r.fprop_lhs, key, "fprop_lhs", r, impl)
    else:
        qa = a
    qb = quantize_operand(b, 1, r.fprop_rhs, key, "fprop_rhs", r, impl) \
        if r.fprop_rhs.quantized else b
    if gather is not None and r.fprop_rhs.quantized:  # quantized per shard, then gathered
        qb = gather.nvfp4(qb)
    if r.fprop_lhs.quantized:
        scale = None
        if isinstance(qb, NVFP4Array):  # through implementation: a kernel may compute it
            scale = implementation.output_scales([(qa.amax, qb.amax)], impl=impl)[0]
        y = _bmm(qa, qb, precision, impl, shardings.fprop, output_scale=scale)
        y = c.out(y if gather is None else gather.last_dim_as(y, 2)).astype(out_dtype)
    else:  # the caller's own GEMM, exactly as lax.dot_general computes it
        w = rhs if own_gather is None else own_gather.array(rhs)
        y = lax.dot_general(lhs, w, dn, precision=precision, preferred_element_type=out_dtype)

    # What backward needs, kept in NVFP4 where the recipe quantizes it.
    if not r.dgrad_rhs.quantized:
        w_res = b if gather is None else gather.array(b)
    elif r.dgrad_rhs == r.fprop_rhs and r.fprop_rhs.block_2d:
        w_res = qb  # 16x16 tiles: the same values serve W and W^T (already gathered)
    else:
        w_res = quantize_operand(b, 2, r.dgrad_rhs, key, "dgrad_rhs", r, impl)  # along N
        if gather is not None:
            w_res = gather.nvfp4(w_res)
    if not r.wgrad_lhs.quantized:
        x_res = a
    elif x_col is not None:
        x_res = x_col
    else:
        x_res = quantize_operand(a, 1, r.wgrad_lhs, key, "wgrad_lhs", r, impl)  # along tokens
    return y, (x_res, w_res, key, c, shardings, gather)


def _bwd(dn, precision, out_dtype, recipe: Recipe, impl: Impl, rhs_gather, res, g):
    del dn, out_dtype, rhs_gather
    x_res, w_res, key, c, shardings, gather = res
    r = recipe
    if key is None and (err := missing_key_error(r, BACKWARD_ROLES)) is not None:
        raise err
    gc = c.grad(g) if gather is None else gather.last_dim_as(c.grad(g), 2)
    if r.dgrad_grad.quantized and r.wgrad_grad.quantized:
        # dY rowwise (dgrad) and dY columnwise (wgrad), from one read where a kernel can.
        # Each copy of dY feeds one GEMM: decoded by the kernel where XLA multiplies it.
        m, n = gc.shape[1], gc.shape[2]
        decoded = (implementation.auto_gemm_runs_xla(m, w_res.shape[1], n, "dgrad"),
                   implementation.auto_gemm_runs_xla(x_res.shape[2], n, m, "wgrad"))
        qg_row, qg_col = _rowwise_and_columnwise(gc, r.dgrad_grad, r.wgrad_grad, key,
                                                 "dgrad_grad", "wgrad_grad", r, impl,
                                                 decoded=decoded)
    else:
        qg_row = quantize_operand(gc, 2, r.dgrad_grad, key, "dgrad_grad", r, impl) \
            if r.dgrad_grad.quantized else None
        qg_col = quantize_operand(gc, 1, r.wgrad_grad, key, "wgrad_grad", r, impl) \
            if r.wgrad_grad.quantized else None
    out_scales = [None, None]
    if (r.dgrad_grad.quantized and r.wgrad_grad.quantized and isinstance(w_res, NVFP4Array)
            and isinstance(x_res, NVFP4Array)):
        # Both GEMMs' output scales in one pass of the divisions (program size).
        out_scales = implementation.output_scales(
            [(qg_row.amax, w_res.amax), (x_res.amax, qg_col.amax)], impl=impl)
    # dgrad: dX = dY W^T, contracting N.
    if r.dgrad_grad.quantized:
        da = _bmm(qg_row, w_res.mT, precision, impl, shardings.dgrad,
                  output_scale=out_scales[0])
    else:
        da = _bmm(gc, jnp.swapaxes(w_res, 1, 2), precision, impl, shardings.dgrad)
    if gather is not None:
        da = gather.last_dim_as(da, 1)
    # wgrad: dW = X^T dY, contracting tokens.
    if r.wgrad_grad.quantized:
        db = _bmm(x_res.mT, qg_col, precision, impl, shardings.wgrad, lhs_from_mT=True,
                  output_scale=out_scales[1])
    else:
        db = _bmm(jnp.swapaxes(x_res, 1, 2), gc, precision, impl, shardings.wgrad)
    if gather is not None and not gather.explicit:  # dW sharded like W: a reduce-scatter
        db = gather.constrain(db, gather.sharded)
    return c.lhs_back(da), c.rhs_back(db), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8))
def _dot_general(lhs, rhs, key, dn, precision, out_dtype, recipe, impl, rhs_gather):
    return _fwd(lhs, rhs, key, dn, precision, out_dtype, recipe, impl, rhs_gather)[0]


_dot_general.defvjp(_fwd, _bwd)
# Jitted so that eager calls run one compiled program instead of op-by-op dispatch.
_dot_general_jit = jax.jit(_dot_general, static_argnums=(3, 4, 5, 6, 7, 8))


def dot_general(
    lhs: jax.typing.ArrayLike,
    rhs: jax.typing.ArrayLike,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    *,
    out_sharding: Any = None,
    recipe: Recipe | None = None,
    key: jax.Array | None = None,
    impl: Impl = "xla",
    rhs_gather: FP4Gather | None = None,
    role_table: jax.Array | None = None,
) -> jax.Array:
    """NVFP4 `jax.lax.dot_general` with quantized forward and backward GEMMs.

    Call-compatible with `jax.lax.dot_general` (``precision``,
    ``preferred_element_type``, ``out_sharding``); bind ``recipe``/``key`` with
    `functools.partial` (or use `fp4jax.flax`) to pass it where a layer takes a
    ``dot_general``.

    Per docs/RECIPE.md §6 (with the default `Recipe.nvfp4`): the forward GEMM uses the
    left operand in 1D blocks along K (RNE) and the right operand in 16×16 tiles
    (RNE); dgrad uses dY in 1D blocks along N (stochastic rounding) and the same
    tiled right operand; wgrad uses X and dY Hadamard-rotated along the token axis
    (dY stochastically rounded). Each emulated GEMM decodes to BF16, accumulates in
    FP32 and applies the two global decode scales. Backward residuals are kept in
    NVFP4 (the tiled weight and the rotated column-wise copy of X), not as inputs.

    Args:
      lhs: left operand (activations), float32/bfloat16/float16.
      rhs: right operand (weights).
      dimension_numbers: ``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``.
      precision: passed to the unquantized GEMMs; NVFP4 GEMMs are exact BF16
        products with FP32 accumulation regardless.
      preferred_element_type: output dtype (default: the promoted input dtype).
      out_sharding: output sharding, as in `jax.lax.dot_general` (under a mesh with
        explicit axes the output is resharded to it).
      recipe: a `Recipe`; default `Recipe.nvfp4()`.
      key: a ``jax.random`` key (typed or raw). Needed only by operands the recipe
        rounds stochastically: with `Recipe.nvfp4` the forward pass needs none, and
        the backward pass raises a `ValueError` without one.
      impl: ``"xla"`` (pure JAX), ``"pallas"`` (Hopper kernels), ``"native"``
        (Blackwell block-scaled GEMM) or ``"auto"``; see `fp4jax.implementation`.
      rhs_gather: an `fp4jax.FP4Gather` naming mesh axes over which ``rhs`` (a weight
        sharded FSDP-style) is gathered for the GEMMs: its NVFP4 copies are quantized
        per shard and gathered as packed codes and E4M3 scales instead of
        high-precision values (docs/SHARDING.md). Same results as without it.
      role_table: instead of ``key``, its operand keys derived ahead of time:
        ``role_key_table(key)`` (one row of ``jax.vmap(role_key_table)(keys)``). Same
        results as with ``key``; `fp4jax.flax` passes it to derive a step's keys in
        O(1) hashes. Passing both is a `ValueError`.

    Returns:
      The product, shaped as `jax.lax.dot_general`'s.

    Example:
      >>> import functools, jax, jax.numpy as jnp, fp4jax
      >>> x = jax.random.normal(jax.random.key(0), (32, 64), jnp.bfloat16)
      >>> w = jax.random.normal(jax.random.key(1), (64, 16), jnp.bfloat16)
      >>> dg = functools.partial(fp4jax.dot_general, key=jax.random.key(2))
      >>> y = dg(x, w, (((1,), (0,)), ((), ())))
      >>> y.shape, y.dtype
      ((32, 16), dtype(bfloat16))
      >>> gx, gw = jax.grad(lambda x, w: dg(x, w, (((1,), (0,)), ((), ()))).sum(), (0, 1))(x, w)
    """
    recipe = Recipe.nvfp4() if recipe is None else recipe
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp4jax.Recipe, got {type(recipe).__name__}")
    implementation.check_impl(impl)
    if rhs_gather is not None and not isinstance(rhs_gather, FP4Gather):
        raise TypeError(f"rhs_gather must be an fp4jax.FP4Gather or None, got "
                        f"{type(rhs_gather).__name__}")
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    if recipe.is_unquantized:
        if rhs_gather is not None:
            rhs = weight_gather.Gather.of(rhs_gather, rhs).array(rhs)
        return lax.dot_general(
            lhs, rhs, dimension_numbers, precision=precision,
            preferred_element_type=preferred_element_type, out_sharding=out_sharding,
        )
    checks.check_input_dtype(lhs.dtype, "lhs")
    checks.check_input_dtype(rhs.dtype, "rhs")
    dn = normalize_dimension_numbers(dimension_numbers, lhs.ndim, rhs.ndim)
    (lc, rc), (lb, rb) = dn
    for ld, rd, what in ((lc, rc, "contracting"), (lb, rb, "batch")):
        ls, rs = tuple(lhs.shape[d] for d in ld), tuple(rhs.shape[d] for d in rd)
        if ls != rs:
            raise ValueError(
                f"{what} dims have different sizes: lhs {lhs.shape} dims {ld} -> {ls}, "
                f"rhs {rhs.shape} dims {rd} -> {rs}"
            )
    if role_table is not None:
        if key is not None:
            raise ValueError("pass key or role_table (role_key_table(key)), not both")
        key = _RoleTable(check_role_table(role_table))
    elif key is not None:
        key = random_bits.check_key(key)
    elif (err := missing_key_error(recipe, FORWARD_ROLES)) is not None:
        raise err
    out_dtype = jnp.dtype(
        preferred_element_type
        if preferred_element_type is not None
        else jnp.promote_types(lhs.dtype, rhs.dtype)
    )
    if 0 in lhs.shape or 0 in rhs.shape:
        return lax.dot_general(lhs, rhs, dn, preferred_element_type=out_dtype)
    y = _dot_general_jit(lhs, rhs, key, dn, precision, out_dtype, recipe, impl, rhs_gather)
    if out_sharding is not None:
        # Explicit axes: the sharding is the type, changed by resharding (with_sharding_
        # constraint would only assert it); auto axes: a constraint for XLA.
        y = (jax.sharding.reshard(y, out_sharding) if explicit_spec(y) is not None
             else jax.lax.with_sharding_constraint(y, out_sharding))
    return y
