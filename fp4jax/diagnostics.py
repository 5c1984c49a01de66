"""Quantization diagnostics: where does 4-bit hurt?

Pure functions that compare a tensor with its NVFP4 quantization (`fp4jax.quantize`
output: E2M1 codes, E4M3 block scales, global amax) and return a few scalars:

* ``amax``: the global amax (float32);
* ``flush_to_zero``: fraction of the nonzero values that quantize to 0 (values below
  a quarter of their block's step, or blocks whose E4M3 scale underflowed);
* ``saturated_blocks``: fraction of 16-blocks (16×16 tiles for weights) in which
  clamping to ±6 changed a value by more than E2M1 rounding would
  (``|x · enc| ≥ 7``, the midpoint to a hypothetical next value 8). A block scale
  that merely rounded down (``6 < |x · enc| < 7``, about half of all blocks) is not
  counted: its maximum rounds to 6 either way. Saturation needs a subnormal or zero
  E4M3 scale, i.e. a block far below the tensor's amax (dynamic range beyond what
  the two-level scale covers);
* ``underflow_blocks``: fraction of blocks holding nonzeros whose E4M3 scale is 0
  (the whole block is flushed);
* ``rel_error``: ``‖x − x̂‖₂ / ‖x‖₂``.

`fprop_stats` computes them for both forward-GEMM operands of a ``dot_general``
exactly as `fp4jax.dot_general` quantizes them. The fp4jax layers call it when a
`fp4jax.flax.step_scope` is opened with ``diagnostics=True``; `fp4jax.train` does that
in a separate jitted forward pass (``make_diagnostics_step``), so the training step
itself pays nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4jax import implementation
from fp4jax.numerics import layout
from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.nvfp4_array import NVFP4Array
from fp4jax.numerics.scales import (
    block_encode_scale_table,
    global_decode_scale,
    lookup_encode_scales,
)
from fp4jax.quantized_dot import Canonical, normalize_dimension_numbers, quantize_operand
from fp4jax.recipe import Recipe

STAT_NAMES = ("amax", "flush_to_zero", "saturated_blocks", "underflow_blocks", "rel_error")
"""The statistics `tensor_stats` returns, in order."""

_F32 = jnp.float32


def _per_block(x: jax.Array, q: NVFP4Array, reduce: Any) -> jax.Array:
    """``reduce`` over each block (or 16×16 tile) of ``x``, which has the padded layout
    along ``q.axis``; the result has the layout of ``q.scales``."""
    axes = [q.axis] + ([q.tile_axis] if q.block_2d else [])
    for ax in axes:
        x = layout.pad_to_block(x, ax)
    shape: list[int] = []
    red: list[int] = []
    for ax, n in enumerate(x.shape):
        if ax in axes:
            shape += [n // BLOCK, BLOCK]
            red.append(len(shape) - 1)
        else:
            shape.append(n)
    return reduce(x.reshape(shape), axis=tuple(red))


def tensor_stats(x: jax.typing.ArrayLike, q: NVFP4Array) -> dict[str, jax.Array]:
    """Statistics of the quantization ``q`` of ``x`` (see the module docstring).

    Args:
      x: the high-precision tensor that was quantized.
      q: ``fp4jax.quantize(x, ...)`` without the Hadamard transform.

    Returns:
      A dict of float32 scalars named as in `STAT_NAMES`.

    Example:
      >>> import jax.numpy as jnp, fp4jax
      >>> from fp4jax.diagnostics import tensor_stats
      >>> x = jnp.array([[1.0, 2.0, 3.0, 1e-4] + [0.0] * 12])
      >>> s = tensor_stats(x, fp4jax.quantize(x))
      >>> float(s["amax"]), float(s["flush_to_zero"]), float(s["saturated_blocks"])
      (3.0, 0.25, 0.0)
    """
    if not isinstance(q, NVFP4Array):
        raise TypeError(f"q must be an NVFP4Array, got {type(q).__name__}")
    x = jnp.asarray(x)
    if tuple(x.shape) != tuple(q.shape):
        raise ValueError(f"x has shape {x.shape} but q has shape {q.shape}")
    if q.hadamard:
        raise ValueError("tensor_stats compares with x directly: q must not be Hadamard-rotated")
    x = lax.stop_gradient(x).astype(_F32)
    xq = implementation.dequantize(q, _F32)
    nonzero = x != 0
    n_nonzero = jnp.maximum(jnp.sum(nonzero), 1).astype(_F32)
    flushed = nonzero & (xq == 0)

    # The block tests run on one value per block: the E4M3 scale's encode scale is looked
    # up once per block (a 128-entry table: one division per code), and since
    # fl(|x|·enc) is monotone in |x|, a block holds an |x·enc| ≥ 7 exactly when its
    # largest |x| does (NaN, which compares false, counts as 0). Per element, the
    # gather fused into the block reduction took XLA's CPU compiler minutes for a
    # length that is not a multiple of 16.
    xp = layout.pad_axis(x, q.axis, q.padded_length)
    s = q.scales.astype(_F32)
    enc = lookup_encode_scales(block_encode_scale_table(global_decode_scale(q.amax)), s)
    abs_max = _per_block(jnp.where(jnp.isnan(xp), 0.0, jnp.abs(xp)), q, jnp.max)
    blocks_clipped = abs_max * enc >= np.float32(7.0)  # rounds past 6 on an unbounded grid
    blocks_nonzero = _per_block(xp != 0, q, jnp.any)
    blocks_under = (s == 0) & blocks_nonzero
    n_blocks = np.float32(blocks_clipped.size)
    norm = jnp.sqrt(jnp.sum(x * x))
    err = jnp.sqrt(jnp.sum((x - xq) ** 2))
    return {
        "amax": q.amax.astype(_F32),
        "flush_to_zero": jnp.sum(flushed).astype(_F32) / n_nonzero,
        "saturated_blocks": jnp.sum(blocks_clipped).astype(_F32) / n_blocks,
        "underflow_blocks": jnp.sum(blocks_under).astype(_F32)
        / jnp.maximum(jnp.sum(blocks_nonzero), 1).astype(_F32),
        "rel_error": jnp.where(norm > 0, err / jnp.where(norm > 0, norm, 1.0), 0.0),
    }


def fprop_stats(
    lhs: jax.typing.ArrayLike,
    rhs: jax.typing.ArrayLike,
    dimension_numbers: Any,
    recipe: Recipe,
    key: jax.Array | None = None,
) -> dict[str, dict[str, jax.Array]]:
    """`tensor_stats` of the forward GEMM's operands, quantized as `fp4jax.dot_general` does.

    The operands are brought to the canonical ``(B, M, K) × (B, K, N)`` form and
    quantized with ``recipe.fprop_lhs`` (input, blocks along K) and
    ``recipe.fprop_rhs`` (weight, 16×16 tiles in `Recipe.nvfp4`).

    Args:
      lhs: the layer input.
      rhs: the weight.
      dimension_numbers: as for `jax.lax.dot_general`.
      recipe: the layer's recipe; its fprop GEMM must be quantized.
      key: needed only if the recipe rounds a forward operand stochastically.

    Returns:
      ``{"x": stats, "w": stats}``.

    Example:
      >>> import jax, numpy as np, fp4jax
      >>> from fp4jax.diagnostics import fprop_stats
      >>> x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
      >>> w = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
      >>> stats_fn = jax.jit(fprop_stats, static_argnums=(2, 3))  # dn and recipe are static
      >>> s = stats_fn(x, w, (((1,), (0,)), ((), ())), fp4jax.Recipe.nvfp4())
      >>> sorted(s), 0.05 < float(s["w"]["rel_error"]) < 0.2
      (['w', 'x'], True)
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp4jax.Recipe, got {type(recipe).__name__}")
    if not recipe.fprop_lhs.quantized:
        raise ValueError("fprop_stats needs a recipe whose forward GEMM is quantized")
    lhs = lax.stop_gradient(jnp.asarray(lhs))
    rhs = lax.stop_gradient(jnp.asarray(rhs))
    # The same canonical form and quantizer as fp4jax.dot_general's forward GEMM.
    dn = normalize_dimension_numbers(dimension_numbers, lhs.ndim, rhs.ndim)
    c = Canonical(lhs.shape, rhs.shape, dn, lhs.dtype, rhs.dtype)
    a, b = c.lhs(lhs), c.rhs(rhs)
    qa = quantize_operand(a, 2, recipe.fprop_lhs, key, "fprop_lhs", recipe)
    qb = quantize_operand(b, 1, recipe.fprop_rhs, key, "fprop_rhs", recipe)
    return {"x": tensor_stats(a, qa), "w": tensor_stats(b, qb)}


def flatten(stats: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flattens nested stats to ``{"layer/x/amax": value, ...}``.

    Example:
      >>> from fp4jax.diagnostics import flatten
      >>> flatten({"mlp.up": {"x": {"amax": 1.0}}}, prefix="diag/")
      {'diag/mlp.up/x/amax': 1.0}
    """
    out: dict[str, Any] = {}
    for k, v in stats.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def format_table(stats: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """A text table, one row per layer and operand (host values).

    Example:
      >>> from fp4jax.diagnostics import format_table
      >>> print(format_table({"up": {"x": dict(amax=2.0, flush_to_zero=0.1,
      ...     saturated_blocks=0.0, underflow_blocks=0.0, rel_error=0.09)}}))
      layer  op          amax  flush_to_zero  saturated_blocks  underflow_blocks  rel_error
      up     x              2         0.1000            0.0000            0.0000     0.0900
    """
    rows = [(layer, op, st) for layer, ops in stats.items() for op, st in ops.items()]
    width = max([len("layer")] + [len(r[0]) for r in rows])
    head = f"{'layer':<{width}}  op  {'amax':>12}"
    head += "".join(f"  {n:>{len(n)}}" for n in STAT_NAMES[1:])
    lines = [head]
    for layer, op, st in rows:
        line = f"{layer:<{width}}  {op:<2}  {float(st['amax']):>12.4g}"
        line += "".join(f"  {float(st[n]):>{len(n)}.4f}" for n in STAT_NAMES[1:])
        lines.append(line)
    return "\n".join(lines)
