"""Two-operand einsum as one ``dot_general`` that keeps the operand order.

`jax.numpy.einsum` may swap its operands before calling ``_dot_general`` (then the
weight would be quantized as the activation). `einsum` here always passes the input
as ``lhs`` and the kernel as ``rhs`` so that the recipe's roles hold.
"""

from __future__ import annotations

import dataclasses
import functools
import string
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Plan:
    """How to compute ``lhs_spec,rhs_spec->out_spec`` with one dot_general.

    Attributes:
      lhs_sum: lhs axes summed out first (labels in neither rhs nor output).
      rhs_sum: rhs axes summed out first.
      dimension_numbers: for the reduced operands.
      out_perm: transpose of the dot_general result into the output order.
    """

    lhs_sum: tuple[int, ...]
    rhs_sum: tuple[int, ...]
    dimension_numbers: tuple[
        tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]
    ]
    out_perm: tuple[int, ...]


def _expand(spec: str, ndim: int, fill: str, what: str) -> str:
    if "..." not in spec:
        if len(spec) != ndim:
            raise ValueError(f"einsum {what} spec {spec!r} has {len(spec)} labels for rank {ndim}")
        return spec
    n = ndim - (len(spec) - 3)
    if n < 0 or spec.count("...") > 1:
        raise ValueError(f"einsum {what} spec {spec!r} does not fit rank {ndim}")
    return spec.replace("...", fill[len(fill) - n:] if n else "")


@functools.lru_cache(maxsize=256)
def plan(subscripts: str, lhs_ndim: int, rhs_ndim: int) -> Plan:
    """Plans ``jnp.einsum(subscripts, lhs, rhs)`` as one dot_general.

    Raises:
      ValueError: for an equation that is not an explicit two-operand einsum
        (``"ab,bc->ac"``), repeats a label within one operand, or puts an output label
        in no operand.

    Example:
      >>> from fp4jax.flax.einsum import plan
      >>> plan("btd,dnh->btnh", 3, 3).dimension_numbers
      (((2,), (0,)), ((), ()))
    """
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum subscripts must be a str, got {type(subscripts).__name__}")
    eq = subscripts.replace(" ", "")
    if "->" not in eq or eq.count(",") != 1:
        raise ValueError(
            f"einsum {subscripts!r}: fp4jax needs an explicit two-operand equation 'ab,bc->ac'"
        )
    ins, out = eq.split("->")
    ls, rs = ins.split(",")
    used = set((ls + rs + out).replace(".", ""))
    if not used <= set(string.ascii_letters):
        raise ValueError(f"einsum {subscripts!r}: labels must be letters")
    free = "".join(c for c in string.ascii_letters if c not in used)
    nell = max(lhs_ndim - (len(ls) - 3) if "..." in ls else 0,
               rhs_ndim - (len(rs) - 3) if "..." in rs else 0, 0)
    fill = free[:nell]
    ls = _expand(ls, lhs_ndim, fill, "lhs")
    rs = _expand(rs, rhs_ndim, fill, "rhs")
    out = out.replace("...", fill) if "..." in out else out
    for s, what in ((ls, "lhs"), (rs, "rhs"), (out, "output")):
        if len(set(s)) != len(s):
            raise ValueError(
                f"einsum {subscripts!r}: {what} repeats a label (diagonals are not supported)"
            )
    if not set(out) <= set(ls) | set(rs):
        raise ValueError(f"einsum {subscripts!r}: output labels missing from the operands")
    lhs_sum = tuple(i for i, c in enumerate(ls) if c not in rs and c not in out)
    rhs_sum = tuple(i for i, c in enumerate(rs) if c not in ls and c not in out)
    ls2 = "".join(c for i, c in enumerate(ls) if i not in lhs_sum)
    rs2 = "".join(c for i, c in enumerate(rs) if i not in rhs_sum)
    batch = [c for c in ls2 if c in rs2 and c in out]
    contract = [c for c in ls2 if c in rs2 and c not in out]
    lfree = [c for c in ls2 if c not in rs2]
    rfree = [c for c in rs2 if c not in ls2]
    dn = (
        (tuple(ls2.index(c) for c in contract), tuple(rs2.index(c) for c in contract)),
        (tuple(ls2.index(c) for c in batch), tuple(rs2.index(c) for c in batch)),
    )
    result = batch + lfree + rfree
    return Plan(lhs_sum, rhs_sum, dn, tuple(result.index(c) for c in out))


def einsum(
    subscripts: str,
    lhs: jax.typing.ArrayLike,
    rhs: jax.typing.ArrayLike,
    *,
    dot_general: Callable[..., jax.Array],
    precision: Any = None,
    preferred_element_type: Any = None,
    out_sharding: Any = None,
) -> jax.Array:
    """``jnp.einsum(subscripts, lhs, rhs)`` through ``dot_general(lhs, rhs, ...)``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from fp4jax.flax.einsum import einsum
      >>> x, k = jnp.ones((2, 3, 4)), jnp.ones((4, 5))
      >>> einsum("...d,dh->...h", x, k, dot_general=jax.lax.dot_general).shape
      (2, 3, 5)
    """
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    p = plan(subscripts, lhs.ndim, rhs.ndim)
    if p.lhs_sum:
        lhs = jnp.sum(lhs, axis=p.lhs_sum)
    if p.rhs_sum:
        rhs = jnp.sum(rhs, axis=p.rhs_sum)
    kwargs = {}
    if preferred_element_type is not None:
        kwargs["preferred_element_type"] = preferred_element_type
    y = dot_general(lhs, rhs, p.dimension_numbers, precision, **kwargs)
    if p.out_perm != tuple(range(len(p.out_perm))):
        y = jnp.transpose(y, p.out_perm)
    if out_sharding is not None:
        y = jax.lax.with_sharding_constraint(y, out_sharding)
    return y
