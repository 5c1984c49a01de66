"""Recipe conformance: each GEMM of a dot_general call against the GEMM rebuilt from
public primitives (`fp4jax.testing`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fp4jax import implementation
from fp4jax.numerics import layout
from fp4jax.numerics.nvfp4_array import NVFP4Array
from fp4jax.quantized_dot import ROLE_IDS as _ROLE_IDS
from fp4jax.quantized_dot import dot_general
from fp4jax.recipe import Recipe
from fp4jax.testing.support import (
    first_difference,
)

# ---------------------------------------------------------------- recipe conformance


def _normalize_dn(dn, lhs_ndim: int, rhs_ndim: int):
    (lc, rc), (lb, rb) = dn
    norm = lambda dims, nd: tuple(int(d) % nd for d in dims)  # noqa: E731
    return (norm(lc, lhs_ndim), norm(rc, rhs_ndim)), (norm(lb, lhs_ndim), norm(rb, rhs_ndim))


@dataclasses.dataclass(frozen=True)
class _Canonical:
    """``lhs``/``rhs`` as ``(B, M, K) × (B, K, N)``, as `fp4jax.dot_general` sees them."""

    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    lhs_perm: tuple[int, ...]
    rhs_perm: tuple[int, ...]
    bmkn: tuple[int, int, int, int]
    out_shape: tuple[int, ...]

    @classmethod
    def of(cls, lhs_shape, rhs_shape, dn) -> _Canonical:
        (lc, rc), (lb, rb) = dn
        lf = tuple(d for d in range(len(lhs_shape)) if d not in lb + lc)
        rf = tuple(d for d in range(len(rhs_shape)) if d not in rb + rc)
        size = lambda shape, dims: math.prod(shape[d] for d in dims)  # noqa: E731
        bmkn = (size(lhs_shape, lb), size(lhs_shape, lf), size(lhs_shape, lc),
                size(rhs_shape, rf))
        out = tuple(lhs_shape[d] for d in lb + lf) + tuple(rhs_shape[d] for d in rf)
        return cls(tuple(lhs_shape), tuple(rhs_shape), lb + lf + lc, rb + rc + rf, bmkn, out)

    def lhs(self, x):
        b, m, k, _ = self.bmkn
        return jnp.transpose(x, self.lhs_perm).reshape(b, m, k)

    def rhs(self, w):
        b, _, k, n = self.bmkn
        return jnp.transpose(w, self.rhs_perm).reshape(b, k, n)

    def lhs_back(self, da):
        shape = tuple(self.lhs_shape[d] for d in self.lhs_perm)
        return jnp.transpose(da.reshape(shape), np.argsort(self.lhs_perm))

    def rhs_back(self, db):
        shape = tuple(self.rhs_shape[d] for d in self.rhs_perm)
        return jnp.transpose(db.reshape(shape), np.argsort(self.rhs_perm))


def rebuild_gemms(
    lhs: jax.Array,
    rhs: jax.Array,
    cotangent: jax.Array,
    dimension_numbers: Any,
    recipe: Recipe,
    key: jax.Array | None,
) -> dict[str, jax.Array]:
    """The fprop, dgrad and wgrad results of a quantized ``dot_general``, from public parts.

    Per RECIPE.md §6 and the `fp4jax.Recipe`: operands are brought to ``(B, M, K) ×
    (B, K, N)``; each NVFP4 operand is ``fp4jax.quantize``-d along its GEMM's
    contraction axis with its role's options (Hadamard operands zero-padded to whole
    16-runs; stochastic ones keyed ``fold_in(key, role_id)`` with `fp4jax.dot_general`'s
    role numbers), dgrad reuses fprop's 16×16-tiled weight when the recipe gives both
    the same tiled operand, and each GEMM is ``fp4jax.matmul`` (or a float32-accumulated
    ``lax.dot_general`` for a bf16 GEMM).

    Returns:
      ``{"fprop": y, "dgrad": d_lhs, "wgrad": d_rhs}`` in the shapes and dtypes
      ``jax.vjp(fp4jax.dot_general)`` gives for ``cotangent``.
    """
    lhs, rhs, g = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(cotangent)
    dn = _normalize_dn(dimension_numbers, lhs.ndim, rhs.ndim)
    c = _Canonical.of(lhs.shape, rhs.shape, dn)
    r = recipe
    a, b = c.lhs(lhs), c.rhs(rhs)
    gc = g.reshape(c.bmkn[0], c.bmkn[1], c.bmkn[3])

    def q(t, axis, role):
        op = getattr(r, role)
        if op.hadamard:
            t = layout.pad_to_block(t, axis)
        return implementation.quantize(
            t, axis=axis, block_2d=op.block_2d, rounding=op.rounding,
            key=jax.random.fold_in(key, _ROLE_IDS[role]) if op.stochastic else None,
            hadamard=op.hadamard, hadamard_signs=r.hadamard_signs if op.hadamard else None)

    def gemm(u, v):  # (B, M, K) x (B, K, N) -> float32
        if isinstance(u, NVFP4Array):
            return implementation.matmul(u, v, preferred_element_type=jnp.float32)
        return jax.lax.dot_general(u, v, (((2,), (1,)), ((0,), (0,))),
                                   preferred_element_type=jnp.float32)

    quantized = r.fprop_lhs.quantized
    qa = q(a, 2, "fprop_lhs") if quantized else a
    qb = q(b, 1, "fprop_rhs") if quantized else b
    y = gemm(qa, qb).reshape(c.out_shape).astype(g.dtype)

    if not r.dgrad_grad.quantized:
        dgrad = gemm(gc, jnp.swapaxes(b, 1, 2))
    else:
        # RECIPE.md §6: dgrad uses "the same 2D quantization" of W as fprop.
        shared = r.dgrad_rhs == r.fprop_rhs and r.fprop_rhs.block_2d
        w = qb if shared else q(b, 2, "dgrad_rhs")
        dgrad = gemm(q(gc, 2, "dgrad_grad"), w.mT)
    if not r.wgrad_grad.quantized:
        wgrad = gemm(jnp.swapaxes(a, 1, 2), gc)
    else:
        shared = r.wgrad_lhs == r.fprop_lhs and r.fprop_lhs.block_2d
        xq = qa if shared else q(a, 1, "wgrad_lhs")
        wgrad = gemm(xq.mT, q(gc, 1, "wgrad_grad"))
    return {"fprop": y, "dgrad": c.lhs_back(dgrad).astype(lhs.dtype),
            "wgrad": c.rhs_back(wgrad).astype(rhs.dtype)}


_GEMM_NAMES = {
    "fprop": ("forward Y = X·W", "fprop_lhs", "fprop_rhs"),
    "dgrad": ("data gradient dX = dY·Wᵀ", "dgrad_grad", "dgrad_rhs"),
    "wgrad": ("weight gradient dW = Xᵀ·dY", "wgrad_lhs", "wgrad_grad"),
}


def _call(fn, a, b, dn, recipe, key):
    if fn is None:
        return dot_general(a, b, dn, recipe=recipe, key=key)
    return fn(a, b, dn)


def _conformance(lhs, rhs, cotangent, key, *, fn, dn, recipe):
    """(fn's forward output, its two gradients, the cotangent), rebuild_gemms(...)."""
    y, vjp = jax.vjp(lambda a, b: _call(fn, a, b, dn, recipe, key), lhs, rhs)
    if cotangent is None:
        cotangent = jax.random.normal(jax.random.key(0), y.shape, jnp.float32)
    chex.assert_shape(cotangent, y.shape)
    cotangent = cotangent.astype(y.dtype)
    return (y, *vjp(cotangent), cotangent), rebuild_gemms(
        lhs, rhs, cotangent, dn, recipe, key)


_conformance_jit = jax.jit(_conformance, static_argnames=("fn", "dn", "recipe"))


def assert_conforms_to_recipe(
    lhs: jax.typing.ArrayLike,
    rhs: jax.typing.ArrayLike,
    dimension_numbers: Any,
    recipe: Recipe,
    key: jax.Array | None,
    *,
    fn: Callable[[jax.Array, jax.Array, Any], jax.Array] | None = None,
    cotangent: jax.typing.ArrayLike | None = None,
    jit: bool = True,
) -> None:
    """Asserts that each GEMM of a quantized ``dot_general`` is quantized as ``recipe`` says.

    Runs ``jax.vjp(fn, lhs, rhs)`` and compares the forward output and both
    gradients, bit for bit, with `rebuild_gemms` (each operand quantized with
    `fp4jax.quantize` per its role in ``recipe``, multiplied with `fp4jax.matmul`).

    Args:
      lhs, rhs, dimension_numbers: the ``dot_general`` call.
      recipe: the `fp4jax.Recipe` the call must follow.
      key: the call's stochastic-rounding key (None if the recipe has no SR).
      fn: the function under test, ``fn(lhs, rhs, dimension_numbers)``; default
        ``dot_general(..., recipe=recipe, key=key)``. For a layer's op, e.g.
        `fp4jax.flax.DotGeneral`, call it inside a ``step_scope`` and pass that
        layer's key, ``fp4jax.layer_key(step_key, name)``.
      cotangent: the output cotangent for the backward GEMMs; default a standard
        normal array (fixed seed) of the output's shape and dtype.
      jit: run ``fn``'s forward and backward and the rebuilt GEMMs as one jitted
        program (compiled once per shape, and cached across calls when ``fn`` is the
        same object, e.g. None); False calls them one by one, as written.

    Raises:
      AssertionError: naming the GEMM (and its two operand roles) that differs, the
        number of differing elements and the first of them.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import assert_conforms_to_recipe
      >>> x = jax.random.normal(jax.random.key(0), (32, 48), jnp.bfloat16)
      >>> w = jax.random.normal(jax.random.key(1), (48, 16), jnp.bfloat16)
      >>> assert_conforms_to_recipe(x, w, (((1,), (0,)), ((), ())), fp4jax.Recipe.nvfp4(),
      ...                           jax.random.key(2))
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp4jax.Recipe, got {type(recipe).__name__}")
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    dn = _normalize_dn(dimension_numbers, lhs.ndim, rhs.ndim)
    cotangent = None if cotangent is None else jnp.asarray(cotangent)
    check = _conformance_jit if jit else _conformance
    (y, dlhs, drhs, _), want = check(lhs, rhs, cotangent, key, fn=fn, dn=dn, recipe=recipe)
    for gemm, got in (("fprop", y), ("dgrad", dlhs), ("wgrad", drhs)):
        chex.assert_shape(got, want[gemm].shape)
        chex.assert_type(got, want[gemm].dtype)
        found = first_difference(got, want[gemm])
        if found is None:
            continue
        count, idx = found
        title, ra, rb = _GEMM_NAMES[gemm]
        g, w = np.asarray(got, np.float64)[idx], np.asarray(want[gemm], np.float64)[idx]
        raise AssertionError(
            f"{gemm} ({title}) does not conform to the recipe: {count} of {got.size} "
            f"elements differ from the GEMM rebuilt with {ra}={getattr(recipe, ra)} and "
            f"{rb}={getattr(recipe, rb)}; first at {idx}: got {g!r}, rebuilt {w!r} "
            f"(|diff| {abs(g - w):.6g})"
        )
