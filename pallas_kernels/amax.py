"""The global-amax pass of the quantize kernels, and the scales derived from an amax.

The quantize kernel needs the global encode scale before its first block, so when the
caller gives no amax, one extra read of ``x`` computes it: `run_amax` returns
``max|x|`` over finite values and whether any value was non-finite (the stored amax is
then NaN), and, for the columnwise RHT output, the same for ``RHT_col(x)`` from the
same read (`plain_amax` leaves a small unrotated input to XLA). `scales_from` turns a
given or computed amax into the global scales exactly as
`fp4jax.reference.quantization.quantize` derives them.

Example:
  >>> import jax.numpy as jnp
  >>> from pallas_kernels import amax, quantize_single
  >>> x = jnp.ones((64, 128), jnp.bfloat16).at[5, 7].set(-20.0)
  >>> (m, poisoned), _ = amax.run_amax(x, False, None, quantize_single.DEFAULT_CONFIG, True)
  >>> float(m), bool(poisoned)
  (20.0, False)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4jax.numerics import hadamard as hadamard_lib
from fp4jax.numerics import rounding as rnd
from fp4jax.numerics import scales
from fp4jax.numerics.constants import FLT_MAX, INV_E2M1_MAX
from pallas_kernels import bit_tricks as bits
from pallas_kernels import tma_pipeline as tp

_U32 = jnp.uint32
_F32 = jnp.float32


def _amax_kernel(x_gmem, out_ref, x_smem, bar, *, spec: tp.KernelSpec, overflow: float):
    """Per-CTA partial maxima of the amax pass (each (bg, bnb) per CTA).

    out[:, 0]: max|x| over finite x; out[:, 1]: max|x| (NaN/inf propagate: poison);
    out[:, 2]: max|y| over butterfly sums y whose rotated value 0.25*y rounds to a finite
    value; out[:, 3]: max|y| over all y.
    """
    bg, bnb = spec.bm // 16, spec.bk // 16
    want_rht = spec.col is not None and spec.col.hadamard
    limit = np.float32(np.inf) if 4.0 * overflow > FLT_MAX else np.float32(4.0 * overflow)
    cta = lax.axis_index("cta")

    if not want_rht:  # rowwise layout: any M % 16 == 0
        zero = plgpu.layout_cast(jnp.zeros((bg, 16, bnb, 8), _F32), tp.ROW_LAYOUT)

        def row_body(tile, g0, b0, carry):
            fin, raw = carry
            for v in bits.unpack_words(plgpu.load(tile, layout=tp.ROW_LAYOUT), spec.dtype):
                a = jnp.abs(v)
                raw = jnp.maximum(raw, a)
                fin = jnp.maximum(fin, jnp.where(a < np.float32(np.inf), a, 0.0))
            return fin, raw

        step, n_local = tp.pipelined_loop(spec, x_gmem, x_smem, bar, row_body)
        final = lax.fori_loop(0, n_local, step, (zero, zero))
        for n, acc in enumerate(final + final):
            # NaN-safe reduction.
            acc = jnp.where(acc != acc, np.float32(np.inf), acc)  # noqa: PLR0124 - a NaN test
            out_ref.at[cta, n][...] = jnp.max(jnp.max(acc, axis=3), axis=1)
        return

    zero = plgpu.layout_cast(jnp.zeros((bg, bnb, 8), _F32), tp.COL_LAYOUT)

    def body(tile, g0, b0, carry):
        fin, raw, fin_h, raw_h = carry
        words = [plgpu.load(tile.at[:, j], layout=tp.COL_LAYOUT) for j in range(16)]
        halves = [bits.unpack_words(w, spec.dtype) for w in words]
        for c in range(2):
            vals = [h[c] for h in halves]
            for v in vals:
                a = jnp.abs(v)
                raw = jnp.maximum(raw, a)
                fin = jnp.maximum(fin, jnp.where(a < np.float32(np.inf), a, 0.0))
            if want_rht:
                for v in bits.rht16_butterfly(vals, spec.col.signs):
                    a = jnp.abs(v)
                    raw_h = jnp.maximum(raw_h, a)
                    fin_h = jnp.maximum(fin_h, jnp.where(a < limit, a, 0.0))
        return fin, raw, fin_h, raw_h

    step, n_local = tp.pipelined_loop(spec, x_gmem, x_smem, bar, body)
    final = lax.fori_loop(0, n_local, step, (zero, zero, zero, zero))
    for n, acc in enumerate(final):
        # NaN-safe reduction.
        acc = jnp.where(acc != acc, np.float32(np.inf), acc)  # noqa: PLR0124 - a NaN test
        out_ref.at[cta, n][...] = jnp.max(acc, axis=2)


def run_amax(x2: jax.Array, want_rht: bool, signs, config: Any, interpret: bool):
    """Amax pass: ((amax, poisoned) of x, (amax, poisoned) of RHT_col(x) or None).

    Args:
      x2: bfloat16/float16 ``(M, K)``, ``K % 128 == 0``, ``M % 16 == 0`` (``% 64`` with
        ``want_rht``).
      want_rht: also reduce the columnwise (along M) random Hadamard transform of ``x2``.
      signs: the RHT sign vector (a tuple; used with ``want_rht``).
      config: a `pallas_kernels.quantize_single.QuantizeConfig` (its ``amax_*`` tiling
        and grid fields are read).
      interpret: Mosaic GPU interpret mode (CPU).
    """
    # Jitted: the amax pass of a tensor shape is the same kernel in every quantize launch
    # that needs it (e.g. the round-to-nearest and the stochastic two-output launches), so
    # it is traced and lowered once per step.
    signs = tuple(signs) if want_rht and signs is not None else None
    return _run_amax_jit(x2, bool(want_rht), signs, config, bool(interpret))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _run_amax_jit(x2: jax.Array, want_rht: bool, signs, config: Any, interpret: bool):
    m, k = x2.shape
    bm = tp.pick_block(m, config.amax_block_rows, 64 if want_rht else 16)
    bk = tp.pick_block(k, config.amax_block_cols, 128)
    col = tp.OutputSpec(stochastic=False, hadamard=True, signs=signs) if want_rht else None
    spec = tp.launch_spec(
        tp.KernelSpec(m, k, x2.dtype, bm, bk, config.amax_stages, 0, None, col),
        num_ctas=config.num_ctas, ctas_per_sm=config.ctas_per_sm, interpret=interpret)
    stages = spec.stages
    overflow = float(bits.OVERFLOW[jnp.dtype(x2.dtype)])
    kern = plgpu.kernel(
        functools.partial(_amax_kernel, spec=spec, overflow=overflow),
        out_type=jax.ShapeDtypeStruct((spec.grid, 4, bm // 16, bk // 16), _F32),
        grid=(spec.grid,),
        grid_names=("cta",),
        kernel_name="fp4jax_amax_rht" if want_rht else "fp4jax_amax",
        scratch_types=[
            plgpu.SMEM((stages, bm // 16, 16, bk // 16, 8), _U32),
            plgpu.Barrier(num_barriers=stages),
        ],
        compiler_params=tp.lane_params(),
        interpret=tp.interpret_params(interpret),
    )
    part = jnp.max(kern(tp.as_words(x2)), axis=(0, 2, 3))
    plain = (part[0], ~(part[1] < np.float32(np.inf)))
    if not want_rht:
        return plain, None
    # max |round(0.25 y)| = round(0.25 max |y|): rounding is monotone.
    rot = (bits.round_block_max(part[2] * np.float32(0.25), x2.dtype),
           ~(part[3] * np.float32(0.25) < np.float32(overflow)))
    return plain, rot


def plain_amax(x2: jax.Array, config: Any, interpret: bool):
    """(max|x| over finite values, whether any value is non-finite) of ``x2``, unrotated.

    The rule: an input of at most ``config.xla_amax_elements`` elements
    (`pallas_kernels.quantize_single.QuantizeConfig`; default 2**22, 8 MiB of bfloat16:
    every weight of the examples' dim-768 model and the dim-2048 model's square ones) is
    reduced by XLA (`xla_plain_amax`), a larger one by the amax kernel (`run_amax`). The
    rule is for compile time: each input shape the kernel reduces is one more distinct
    Mosaic GPU kernel to lower on the host and compile (docs/BENCHMARKS.md, "Lowering
    time of the NVFP4 step"), while a max-abs reduce is exact in any order, so both give
    the same bits. No measured comparison of XLA's reduce with the kernel exists yet (to be
    timed on the H200); the bound is kept conservative: at the H200's copy rate (~2.6 TB/s,
    docs/BENCHMARKS.md) 8 MiB is a ~3 µs read, and the kernel's path ends in an XLA
    reduce of its per-CTA partial maxima anyway. The rotated amax stays a kernel.

    Args:
      x2: bfloat16/float16 ``(M, K)`` (the shapes `run_amax` takes).
      config: a `pallas_kernels.quantize_single.QuantizeConfig`.
      interpret: Mosaic GPU interpret mode (CPU) for the kernel.

    Example:
      >>> import jax.numpy as jnp
      >>> from pallas_kernels import quantize_single
      >>> x = jnp.ones((64, 128), jnp.bfloat16).at[5, 7].set(-20.0)
      >>> m, poisoned = plain_amax(x, quantize_single.DEFAULT_CONFIG, True)
      >>> float(m), bool(poisoned)
      (20.0, False)
    """
    if x2.size <= config.xla_amax_elements:
        return xla_plain_amax(x2)
    return run_amax(x2, False, None, config, interpret)[0]


def xla_plain_amax(x2: jax.Array):
    """`run_amax`'s plain result in XLA: (max|x| over finite x, whether any x is not finite).

    Example:
      >>> import jax.numpy as jnp
      >>> m, poisoned = xla_plain_amax(jnp.array([[1.0, -jnp.inf, -3.0]], jnp.bfloat16))
      >>> float(m), bool(poisoned)
      (3.0, True)
    """
    a = jnp.abs(x2.astype(_F32))
    finite = a < np.float32(np.inf)  # false for NaN too
    return jnp.max(jnp.where(finite, a, np.float32(0.0))), ~jnp.all(finite)


def finite_amax_xla(x2: jax.Array, hadamard: bool, signs, axis: int) -> jax.Array:
    """max|x| over finite (rotated) values in plain XLA: the rare non-finite-amax branch."""
    xf = x2.astype(_F32)
    if hadamard:
        xf = hadamard_lib.rht(xf, axis, signs, round_to=x2.dtype)
    return jnp.max(jnp.where(jnp.isfinite(xf), jnp.abs(xf), np.float32(0.0)))


def scales_from(given, computed, fallback):
    """(stored-amax function, finite amax) exactly as the reference quantize derives them.

    ``given``: the caller's amax or None; ``computed``: a thunk giving (finite amax,
    poisoned) from the amax pass; ``fallback``: a thunk giving the finite amax in XLA,
    evaluated only (``lax.cond``) when ``given`` is not finite. The returned function
    maps the quantize kernel's poison flag (used when ``given`` is not None) to the
    stored amax (NaN when poisoned). `pallas_kernels.scale_kernels.scale_params` turns the
    finite amaxes of a launch's outputs into their scales.
    """
    if given is None:
        amax_x, poisoned = computed()
        ok = None
    else:
        ok = jnp.isfinite(given)
        amax_x = lax.cond(ok, lambda: given, fallback)
        poisoned = None

    def stored(kernel_poisoned):
        p = poisoned if poisoned is not None else kernel_poisoned | ~ok
        return jnp.where(p, np.float32(np.nan), amax_x).astype(_F32)

    return stored, amax_x


def global_scales(amaxes):
    """``(gds, mult)`` of each finite amax in ``amaxes`` (float32[n]), as the reference.

    The XLA form of the math the quantize kernels run in `pallas_kernels.scale_kernels`;
    the tests check that kernel against it (with `quantize_engines.scale_params`) bit for
    bit. One vectorized pass: one correctly rounded division
    (`fp4jax.numerics.rounding.div_rn`) for all outputs.
    """
    ges = scales.global_encode_scale(jnp.stack(amaxes).astype(_F32))
    return rnd.div_rn(np.float32(1.0), ges), ges * INV_E2M1_MAX
