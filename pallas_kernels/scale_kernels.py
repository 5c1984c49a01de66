"""Per-tensor scale math as tiny Mosaic GPU kernels: one custom call where XLA saw ~120
operations per correctly rounded division.

Every quantization needs its global scales (``ges``, ``gds``, ``mult``) and the eight
encode-scale reciprocals of `bit_tricks.mantissa_recips`, and every GEMM its output
factor ``fl(gds_lhs · gds_rhs)``: a few correctly rounded divisions
(`fp4jax.numerics.rounding.div_rn`, integer long division) per tensor. Written in XLA
they are most of a quantized step's program — thousands of scalar operations per layer
that XLA's fusion passes work through (docs/BENCHMARKS.md, "Compile time"). Here they
run inside one single-thread-of-work kernel per call site: XLA sees one custom call,
and the kernel (the same for every layer of a shape) is compiled once.

The kernels compute exactly the reference's values (`fp4jax.numerics.scales`), with
only the operations Mosaic GPU lowers on scalars: non-finite tests as comparisons
instead of ``isfinite``/``isnan``, the division without ``floor`` (`rounding.div_rn`).
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
from fp4jax.numerics.constants import FLT_MAX, GLOBAL_SCALE_NUMERATOR, INV_E2M1_MAX
from pallas_kernels import tma_pipeline as tp
from pallas_kernels.quantize_engines import SCALE_PARAMS

_F32 = jnp.float32


def _global_encode_scale(amax):
    """`fp4jax.numerics.scales.global_encode_scale` of one scalar, kernel-safe."""
    mag = jnp.abs(amax)
    finite = mag < np.float32(np.inf)  # False for NaN and inf
    safe = jnp.where(finite, mag, np.float32(1.0))
    ges = jnp.minimum(rnd.div_rn(np.float32(GLOBAL_SCALE_NUMERATOR), safe), np.float32(FLT_MAX))
    ges = jnp.where((safe == 0) | (ges == 0), np.float32(1.0), ges)
    return jnp.where(finite, ges, np.float32(np.nan))


def _global_decode_scale(amax):
    """`fp4jax.numerics.scales.global_decode_scale` of one scalar, kernel-safe."""
    ges = _global_encode_scale(amax)
    nan = ges != ges  # noqa: PLR0124 - a NaN test
    return jnp.where(nan, ges, rnd.div_rn(np.float32(1.0), jnp.where(nan, 1.0, ges)))


def _scale_params_kernel(amax_ref, out_ref, *, n: int):
    for i in range(n):
        ges = _global_encode_scale(amax_ref[i])
        gds = rnd.div_rn(np.float32(1.0), ges)
        base = i * SCALE_PARAMS
        out_ref[base] = gds
        out_ref[base + 1] = ges * INV_E2M1_MAX
        for m in range(8):  # bit_tricks.mantissa_recips: fl(1 / fl((1 + m/8) gds))
            y = np.float32(1.0 + m / 8) * gds
            out_ref[base + 2 + m] = jnp.minimum(rnd.div_rn(np.float32(1.0), y),
                                                np.float32(FLT_MAX))


def _output_scales_kernel(amax_ref, out_ref, *, n: int):
    for i in range(n):
        out_ref[i] = _global_decode_scale(amax_ref[2 * i]) * _global_decode_scale(
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


def scale_params(amaxes: Sequence[jax.typing.ArrayLike], *, interpret: bool = False
                 ) -> jax.Array:
    """The quantize kernel's float32 parameters of outputs with these finite amaxes.

    Equal, bit for bit, to `quantize_engines.scale_params(*amax.global_scales(amaxes))`.

    Args:
      amaxes: one finite float32 amax per output.
      interpret: Mosaic GPU interpret mode (CPU).

    Returns:
      float32[len(amaxes) * SCALE_PARAMS].
    """
    n = len(amaxes)
    a = jnp.stack([jnp.asarray(x, _F32) for x in amaxes])
    return _launch(functools.partial(_scale_params_kernel, n=n), a, n * SCALE_PARAMS,
                   "fp4jax_scale_params", interpret)


def output_scales(pairs: Sequence[tuple[jax.typing.ArrayLike, jax.typing.ArrayLike]], *,
                  interpret: bool = False) -> jax.Array:
    """`fp4jax.numerics.scales.output_scales` of ``(lhs_amax, rhs_amax)`` pairs, in a kernel.

    Returns:
      float32[len(pairs)], bit for bit the XLA computation's (NaN for a NaN amax).
    """
    n = len(pairs)
    a = jnp.stack([jnp.asarray(x, _F32) for pair in pairs for x in pair])
    return _launch(functools.partial(_output_scales_kernel, n=n), a, n, "fp4jax_output_scales",
                   interpret)
