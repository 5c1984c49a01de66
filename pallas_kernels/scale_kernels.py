"""Per-tensor scale math as tiny Mosaic GPU kernels: one custom call where XLA saw ~120
operations per correctly rounded division.

Every quantization needs its global scales (``ges``, ``gds``, ``mult``) and the eight
encode-scale reciprocals of `bit_tricks.mantissa_recips`, and every GEMM its output
factor ``fl(gds_lhs · gds_rhs)``: a few correctly rounded divisions
(`fp4jax.numerics.rounding.div_rn`, integer long division) per tensor. Written in XLA
they are most of a quantized step's program — thousands of scalar operations per layer
that XLA's fusion passes work through (docs/BENCHMARKS.md, "Compile time"). Here they
run inside one single-thread-of-work kernel per call site: XLA sees one custom call,
and the kernel (the same for every call of up to `LAUNCH_COUNT` amaxes or pairs) is
compiled once.

The kernels call the reference's own functions (`fp4jax.numerics.scales`), which are
written with only the operations Mosaic GPU lowers on scalars: non-finite tests as
comparisons instead of ``isfinite``/``isnan``, the division without ``floor``
(`rounding.div_rn`).
Each scalar is computed by every thread of the one warpgroup; all store the same value.

Example:
  >>> import jax.numpy as jnp
  >>> from pallas_kernels import scale_kernels
  >>> scale_kernels.output_scales([(2688.0, 5376.0)], interpret=True).tolist()
  [2.0]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4jax.numerics import rounding as rnd
from fp4jax.numerics import scales
from fp4jax.numerics.constants import INV_E2M1_MAX
from pallas_kernels import tma_pipeline as tp
from pallas_kernels.quantize_engines import SCALE_PARAMS

_F32 = jnp.float32

LAUNCH_COUNT = 2
"""Amaxes (`scale_params`) or amax pairs (`output_scales`) each launch takes at least: a
call with fewer is padded with zero amaxes and its results sliced, so the call sites of
one and of two outputs (single- and two-output quantization; the forward's one GEMM and
the backward's two) share one compiled kernel. Each value is computed on its own, so
the padding changes no bit of the others."""


def _scale_params_kernel(amax_ref, out_ref, *, n: int):
    for i in range(n):
        ges = scales.global_encode_scale(amax_ref[i])
        gds = rnd.div_rn(np.float32(1.0), ges)
        base = i * SCALE_PARAMS
        out_ref[base] = gds
        out_ref[base + 1] = ges * INV_E2M1_MAX
        for m in range(8):  # bit_tricks.mantissa_recips: fl(1 / fl((1 + m/8) gds))
            out_ref[base + 2 + m] = scales.block_encode_scale(np.float32(1.0 + m / 8), gds)


def _output_scales_kernel(amax_ref, out_ref, *, n: int):
    for i in range(n):
        out_ref[i] = scales.global_decode_scale(amax_ref[2 * i]) * scales.global_decode_scale(
            amax_ref[2 * i + 1])


def _launch(body, amaxes: jax.Array, n_out: int, name: str, interpret: bool) -> jax.Array:
    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((n_out,), _F32),
        grid=(1,),
        grid_names=("cta",),
        kernel_name=name,
        compiler_params=tp.lane_params(),
        interpret=tp.interpret_params(interpret),
    )
    return kernel(amaxes)


# Jitted per kernel: a step calls these from many traced functions (each layer shape's
# quantizations, forward and backward), and a jitted function is traced and lowered once
# per operand shape, so each distinct kernel is built once (~0.25 s of host time each).
@functools.partial(jax.jit, static_argnames=("interpret",))
def _scale_params_jit(amaxes: jax.Array, *, interpret: bool) -> jax.Array:
    n = amaxes.shape[0]
    return _launch(functools.partial(_scale_params_kernel, n=n), amaxes, n * SCALE_PARAMS,
                   "fp4jax_scale_params", interpret)


@functools.partial(jax.jit, static_argnames=("interpret",))
def _output_scales_jit(amaxes: jax.Array, *, interpret: bool) -> jax.Array:
    n = amaxes.shape[0] // 2
    return _launch(functools.partial(_output_scales_kernel, n=n), amaxes, n,
                   "fp4jax_output_scales", interpret)


def _padded(values: list[jax.Array], length: int) -> jax.Array:
    """``values`` stacked, with zeros appended up to ``length`` entries."""
    return jnp.stack(values + [jnp.zeros((), _F32)] * max(0, length - len(values)))


def _leading(a: jax.Array, n: int) -> jax.Array:
    """The first ``n`` entries of ``a`` (no slice operation when that is all of it)."""
    return a if a.shape[0] == n else a[:n]


def scale_params(amaxes: Sequence[jax.typing.ArrayLike], *, interpret: bool = False
                 ) -> jax.Array:
    """The quantize kernel's float32 parameters of outputs with these finite amaxes.

    Equal, bit for bit, to the same formulas in XLA,
    `quantize_engines.scale_params(*amax.global_scales(amaxes))` (the tests' reference).

    Args:
      amaxes: one finite float32 amax per output.
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      float32[len(amaxes) * SCALE_PARAMS].

    Example:
      >>> from pallas_kernels import amax, quantize_engines
      >>> a = scale_params([2688.0], interpret=True)
      >>> xla = quantize_engines.scale_params(*amax.global_scales([2688.0]))
      >>> bool((a == xla).all())
      True
    """
    a = _padded([jnp.asarray(x, _F32) for x in amaxes], LAUNCH_COUNT)
    return _leading(_scale_params_jit(a, interpret=bool(interpret)), len(amaxes) * SCALE_PARAMS)


def output_scales(pairs: Sequence[tuple[jax.typing.ArrayLike, jax.typing.ArrayLike]], *,
                  interpret: bool = False) -> jax.Array:
    """`fp4jax.numerics.scales.output_scales` of ``(lhs_amax, rhs_amax)`` pairs, in a kernel.

    Returns:
      float32[len(pairs)], bit for bit the XLA computation's (NaN for a NaN amax).
    """
    a = _padded([jnp.asarray(x, _F32) for pair in pairs for x in pair], 2 * LAUNCH_COUNT)
    return _leading(_output_scales_jit(a, interpret=bool(interpret)), len(pairs))
