"""Model-level checks: gradients against the unquantized twin, bitwise equality across
jit variants and backends (`fp4jax.testing`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fp4jax.testing.support import (
    bits,
    f64,
    first_difference,
    unravel,
)

# ---------------------------------------------------------------- model-level checks


def _leaf_name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".") or "<root>"


def assert_gradients_close_to_unquantized(
    loss_fn_quantized: Callable[[Any, Any], jax.Array],
    loss_fn_reference: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    *,
    max_relative_error: float,
    min_cosine: float | None = None,
) -> dict[str, tuple[float, float]]:
    """Asserts per parameter that quantized gradients stay close to high-precision ones.

    A sanity check before a long run: for each leaf ``p`` of ``params``, with ``g_q``
    the gradient of ``loss_fn_quantized`` and ``g`` that of ``loss_fn_reference`` on
    the same ``batch``,

    * relative error ``‖g_q − g‖ / ‖g‖ <= max_relative_error`` (Frobenius norms;
      a leaf with ``g = 0`` needs ``g_q = 0``), and
    * if given, cosine similarity ``⟨g_q, g⟩ / (‖g_q‖‖g‖) >= min_cosine``.

    A relative error ``e < 1`` already implies cosine ``>= √(1 − e²)``; ``min_cosine``
    is for checking direction more tightly than size. As a guide, one NVFP4 GEMM
    with two quantized operands has relative errors of about 0.13–0.2 on Gaussian
    data (``tests/test_dot_general.py``); deeper models compound them.

    Args:
      loss_fn_quantized: ``(params, batch) -> scalar loss`` of the quantized model
        (open a `fp4jax.flax.step_scope` inside it for stochastic rounding).
      loss_fn_reference: the same loss without quantization.
      params: the parameter pytree (e.g. an ``nnx.State``).
      batch: one batch.
      max_relative_error: the bound on the relative error, per leaf.
      min_cosine: optional bound on the cosine similarity, per leaf.

    Returns:
      ``{leaf name: (relative error, cosine)}``.

    Raises:
      AssertionError: naming every leaf out of bounds and by how much.

    Example:
      >>> import functools, jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import assert_gradients_close_to_unquantized
      >>> dn = (((1,), (0,)), ((), ()))
      >>> def loss(dot, p, x):
      ...   return jnp.mean(jnp.tanh(dot(x, p["w"], dn)) ** 2)
      >>> q = functools.partial(fp4jax.dot_general, recipe=fp4jax.Recipe.nvfp4_no_sr())
      >>> p = {"w": jax.random.normal(jax.random.key(1), (64, 32)) / 8}
      >>> x = jax.random.normal(jax.random.key(3), (128, 64))
      >>> stats = assert_gradients_close_to_unquantized(
      ...     functools.partial(loss, q), functools.partial(loss, jax.lax.dot_general),
      ...     p, x, max_relative_error=0.5, min_cosine=0.9)
      >>> {name: (round(err, 2), round(cos, 2)) for name, (err, cos) in stats.items()}
      {'w': (0.22, 0.98)}
    """
    if not max_relative_error > 0:
        raise ValueError(f"max_relative_error must be > 0, got {max_relative_error}")
    g_q = jax.jit(jax.grad(loss_fn_quantized))(params, batch)
    g_r = jax.jit(jax.grad(loss_fn_reference))(params, batch)
    leaves_q = jax.tree_util.tree_flatten_with_path(g_q)[0]
    leaves_r = jax.tree_util.tree_flatten_with_path(g_r)[0]
    if [p for p, _ in leaves_q] != [p for p, _ in leaves_r]:
        raise AssertionError("the two losses give gradients of different tree structures")
    stats, failures = {}, []
    for (path, a), (_, b) in zip(leaves_q, leaves_r, strict=True):
        name = _leaf_name(path)
        a, b = f64(a).ravel(), f64(b).ravel()
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            failures.append(f"{name}: non-finite gradient (quantized: "
                            f"{int((~np.isfinite(a)).sum())}, reference: "
                            f"{int((~np.isfinite(b)).sum())} non-finite of {a.size})")
            continue
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        rel = np.linalg.norm(a - b) / nb if nb > 0 else (0.0 if na == 0 else np.inf)
        cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else float(na == nb)
        stats[name] = (float(rel), cos)
        if rel > max_relative_error:
            failures.append(f"{name}: relative error {rel:.4f} > {max_relative_error} "
                            f"(‖g_q‖={na:.4g}, ‖g‖={nb:.4g}, cosine {cos:.4f})")
        elif min_cosine is not None and cos < min_cosine:
            failures.append(f"{name}: cosine similarity {cos:.4f} < {min_cosine} "
                            f"(relative error {rel:.4f})")
    if failures:
        raise AssertionError(
            f"quantized gradients are out of bounds for {len(failures)} of {len(stats)} "
            "parameters:\n  " + "\n  ".join(failures))
    return stats


def _devices(backends: Sequence[str]) -> list[jax.Device]:
    found = []
    for b in backends:
        try:
            found.append(jax.devices(b)[0])
        except RuntimeError:
            warnings.warn(f"assert_bitwise_equal_across: backend {b!r} is not present; "
                          "skipped", stacklevel=3)
    return found


def assert_bitwise_equal_across(
    fn: Callable[..., Any],
    *args: Any,
    backends: Sequence[str] = ("cpu", "gpu"),
    jit_variants: bool = True,
    op_by_op: bool = False,
) -> tuple[str, ...]:
    """Asserts that ``fn(*args)`` gives the same bits in every variant (chex.variants style).

    Variants, for each backend present (a missing one is skipped with a warning):
    ``without_jit`` (``fn`` called as is, arguments placed on the backend's device),
    and with ``jit_variants`` also ``with_jit`` (``jax.jit(fn)``); with ``op_by_op``
    also ``disable_jit`` (every operation dispatched alone, as under
    ``jax.disable_jit()``: the strictest check that no XLA fusion changes a
    rounding). All outputs must equal the first variant's bit for bit, except that
    a NaN equals any NaN. Pass the data as ``args``: a computation over closure constants
    is folded by XLA at compile time, where it may reassociate products of constants.
    Bind static arguments with `functools.partial`.

    Args:
      fn: the function.
      *args: its array (pytree) arguments, e.g. a ``jax.random`` key.
      backends: platform names to compare (``"cpu"``, ``"gpu"``, ``"tpu"``).
      jit_variants: also compare ``jax.jit(fn)``.
      op_by_op: also compare under ``jax.disable_jit()``.

    Returns:
      The names of the variants compared, e.g. ``("without_jit@cpu", "with_jit@cpu")``.

    Raises:
      AssertionError: naming the two variants, the output leaf, the number of
        differing elements and the first one, with both bit patterns.
      ValueError: if no backend is present.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.testing import assert_bitwise_equal_across
      >>> x = jax.random.normal(jax.random.key(0), (4, 32))
      >>> assert_bitwise_equal_across(lambda x: fp4jax.dequantize(fp4jax.quantize(x)), x,
      ...                             backends=("cpu",))
      ('without_jit@cpu', 'with_jit@cpu')
    """
    devices = _devices(backends)
    if not devices:
        raise ValueError(f"none of the backends {tuple(backends)} is present")
    variants: list[tuple[str, Callable[..., Any]]] = [("without_jit", fn)]
    if jit_variants:
        variants.append(("with_jit", jax.jit(fn)))
    if op_by_op:
        def eager(*a):
            with jax.disable_jit():
                return fn(*a)
        variants.append(("disable_jit", eager))

    results = []
    for dev in devices:
        placed = jax.device_put(args, dev)
        for name, f in variants:
            with jax.default_device(dev):
                out = f(*placed)
            out = jax.tree_util.tree_map(
                lambda a: jax.random.key_data(a)
                if jnp.issubdtype(jnp.asarray(a).dtype, jax.dtypes.prng_key) else a, out)
            results.append((f"{name}@{dev.platform}", jax.device_get(out)))
    ref_name, ref = results[0]
    ref_leaves, ref_tree = jax.tree_util.tree_flatten_with_path(ref)
    for name, out in results[1:]:
        leaves, tree = jax.tree_util.tree_flatten_with_path(out)
        if tree != ref_tree:
            raise AssertionError(f"{name} returns a different tree than {ref_name}: "
                                 f"{tree} vs {ref_tree}")
        for (path, a), (_, b) in zip(leaves, ref_leaves, strict=True):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape or a.dtype != b.dtype:
                raise AssertionError(
                    f"{name} vs {ref_name}: output {_leaf_name(path)} is {a.dtype}{a.shape} "
                    f"vs {b.dtype}{b.shape}")
            found = (first_difference(a, b) if jnp.issubdtype(a.dtype, jnp.floating)
                     else (None if np.array_equal(a, b) else
                           (int((a != b).sum()), unravel(int(np.argmax(a != b)), a.shape))))
            if found is None:
                continue
            count, idx = found
            raise AssertionError(
                f"{name} differs from {ref_name} in output {_leaf_name(path)}: {count} of "
                f"{a.size} elements; first at {idx}: {a[idx]!r} (bits {bits(a)[idx]:#x}) "
                f"vs {b[idx]!r} (bits {bits(b)[idx]:#x})"
            )
    return tuple(name for name, _ in results)
