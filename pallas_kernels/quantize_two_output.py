"""Rowwise and columnwise-RHT NVFP4 copies of one tensor from one read (Hopper, Mosaic GPU).

The recipe keeps two quantized copies of each activation (round-to-nearest) and each
gradient (stochastic rounding): the rowwise copy (16-blocks along K, for the forward
and data-gradient GEMMs) and the columnwise copy with the 16×16 random Hadamard
transform (16-blocks along tokens, for the weight-gradient GEMM).
`quantize_rowwise_columnwise` produces both from one read of ``x``: one launch of the
quantize kernel (`pallas_kernels.quantize_engines`) with both engines on each tile.
Its amax pass (`pallas_kernels.amax`, skipped when both amaxes are given) computes
``max|x|`` and ``max|RHT_col(x)|`` in one more read.

Shape support (`supports`): 2D ``(M, K)`` bfloat16/float16 with ``M % 64 == 0`` and
``K % 128 == 0``. Measured speeds: docs/BENCHMARKS.md
(``python -m pallas_kernels.quantize_two_output``).

Example:
  >>> import jax, jax.numpy as jnp
  >>> from pallas_kernels import quantize_two_output
  >>> x = jax.random.normal(jax.random.key(2), (64, 128), jnp.bfloat16)
  >>> r, c = quantize_two_output.quantize_rowwise_columnwise(x, interpret=True)
  >>> bool((c.data == quantize_two_output.reference(x)[1].data).all())
  True
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fp4jax.numerics import checks, random_bits
from fp4jax.numerics import hadamard as hadamard_lib
from fp4jax.numerics.nvfp4_array import DecodedNVFP4, NVFP4Array
from fp4jax.numerics.rounding import ROUNDINGS, Rounding
from pallas_kernels import amax as amax_pass
from pallas_kernels import bit_tricks as bits
from pallas_kernels import quantize_engines as engines
from pallas_kernels import scale_kernels, timing
from pallas_kernels import tma_pipeline as tp
from pallas_kernels.quantize_single import TWO_OUTPUT_CONFIG, QuantizeConfig


def supports(shape: Sequence[int], dtype: Any) -> str | None:
    """Whether `quantize_rowwise_columnwise` takes this input: None, or why not.

    Example:
      >>> import jax.numpy as jnp
      >>> supports((64, 128), jnp.bfloat16) is None
      True
      >>> supports((2, 64, 128), jnp.bfloat16)
      'quantize_rowwise_columnwise takes a 2D (M, K) array, got shape (2, 64, 128)'
    """
    shape = tuple(shape)
    if len(shape) != 2:
        return f"quantize_rowwise_columnwise takes a 2D (M, K) array, got shape {shape}"
    return engines.input_reason(shape, dtype, "quantize_rowwise_columnwise", 64)


@functools.partial(jax.jit, static_argnames=("rounding", "hadamard_signs", "config", "interpret",
                                             "decoded"))
def _rowcol_jit(x, row_key, col_key, row_amax, col_amax, *, rounding, hadamard_signs, config,
                interpret, decoded=(False, False)):
    m, k = x.shape
    stochastic = rounding == "stochastic"
    res = []
    if row_amax is None or col_amax is None:  # one pass for both
        res = [amax_pass.run_amax(x, True, hadamard_signs, config, interpret)]

    stored_r, amax_r = amax_pass.scales_from(
        row_amax, lambda: res[0][0],
        lambda: amax_pass.finite_amax_xla(x, False, hadamard_signs, 0))
    stored_c, amax_c = amax_pass.scales_from(
        col_amax, lambda: res[0][1],
        lambda: amax_pass.finite_amax_xla(x, True, hadamard_signs, 0))
    fp = scale_kernels.scale_params([amax_r, amax_c], interpret=interpret)
    up = jnp.concatenate([bits.sr_key_words(row_key), bits.sr_key_words(col_key)])
    # SR block numbers as the reference's: rowwise r * K/16 + j, columnwise g * K + c.
    row = tp.OutputSpec(stochastic=stochastic, block_strides=(k // 16, 1),
                        poison=row_amax is not None, values=decoded[0])
    col = tp.OutputSpec(stochastic=stochastic, hadamard=True, signs=hadamard_signs,
                        block_strides=(k, 1), poison=col_amax is not None, values=decoded[1])
    outs, flags = engines.run_quantize(x, row, col, fp, up, config, interpret)
    outs = list(outs)
    if decoded[0]:
        r = (tp.from_words(outs.pop(0), m, k, jnp.bfloat16),)
    else:
        r = (outs.pop(0).reshape(m, k // 2), outs.pop(0).reshape(m, k // 16))
    if decoded[1]:
        c = (tp.from_words(outs.pop(0), m, k, jnp.bfloat16),)
    else:
        c = (tp.as_bytes(outs.pop(0), m // 2, k), tp.as_bytes(outs.pop(0), m // 16, k))
    return r, stored_r(flags[0]), c, stored_c(flags[1])


def quantize_rowwise_columnwise(
    x: jax.typing.ArrayLike,
    *,
    rounding: Rounding = "nearest",
    row_key: jax.Array | None = None,
    col_key: jax.Array | None = None,
    hadamard_signs: Sequence[int] | None = None,
    row_amax: jax.typing.ArrayLike | None = None,
    col_amax: jax.typing.ArrayLike | None = None,
    config: QuantizeConfig | None = None,
    interpret: bool = False,
    decoded: tuple[bool, bool] = (False, False),
) -> tuple[NVFP4Array | DecodedNVFP4, NVFP4Array | DecodedNVFP4]:
    """Rowwise and columnwise-RHT NVFP4 copies of ``x`` from one read of ``x``.

    The amax pass (skipped when both amaxes are given) reads ``x`` once for
    ``max|x|`` and ``max|RHT_col(x)|`` together.

    Args:
      x: bfloat16/float16 ``(M, K)``, ``M % 64 == 0``, ``K % 128 == 0``.
      rounding: ``"nearest"`` (activations) or ``"stochastic"`` (gradients; needs
        ``row_key`` and ``col_key``).
      row_key, col_key: keys of the two copies' stochastic rounding.
      hadamard_signs: RHT sign vector of the columnwise copy.
      row_amax, col_amax: precomputed global amaxes (``col_amax`` after the RHT).
      config: tuning (`QuantizeConfig`); None uses `TWO_OUTPUT_CONFIG`.
      interpret: Mosaic GPU interpret mode (CPU).
      decoded: for the rowwise and the columnwise copy, whether the kernel writes it
        dequantized (`DecodedNVFP4`: ``code · s`` in BF16, what an XLA GEMM multiplies)
        instead of codes and scales; for a copy one GEMM consumes right away.

    Returns:
      ``(rowwise, columnwise)`` NVFP4Arrays (or `DecodedNVFP4` where ``decoded`` asks),
      bit-identical to `reference` (the decoded ones to its `scaled_codes_bf16`).

    Mathematically equivalent to::

      (quantize(x, axis=1, rounding=rounding, key=row_key, amax=row_amax),
       quantize(x, axis=0, hadamard=True, rounding=rounding, key=col_key,
                hadamard_signs=hadamard_signs, amax=col_amax))
    """
    x = jnp.asarray(x)
    checks.check_input_dtype(x.dtype, "x")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if rounding == "stochastic" and (row_key is None or col_key is None):
        raise ValueError("rounding='stochastic' needs row_key and col_key")
    for name, key in (("row_key", row_key), ("col_key", col_key)):
        if key is not None:
            random_bits.check_key(key, name)
    signs = hadamard_lib.check_signs(hadamard_signs)
    reason = supports(x.shape, x.dtype)
    if reason is None and rounding == "stochastic":
        reason = engines.sr_reason(x.shape)
    if reason is not None:
        raise ValueError(reason)
    config = TWO_OUTPUT_CONFIG if config is None else config
    decoded = (bool(decoded[0]), bool(decoded[1]))
    r, ra, c, ca = _rowcol_jit(
        x, row_key, col_key, checks.check_amax(row_amax), checks.check_amax(col_amax),
        rounding=rounding, hadamard_signs=signs, config=config, interpret=bool(interpret),
        decoded=decoded)

    def e4m3(s):
        return lax.bitcast_convert_type(s, jnp.float8_e4m3fn)

    def copy(parts, amax, axis, hadamard, as_values):
        if as_values:
            return DecodedNVFP4(values=parts[0], amax=amax, axis=axis, hadamard=hadamard)
        return NVFP4Array(data=parts[0], scales=e4m3(parts[1]), amax=amax,
                          shape=tuple(x.shape), dtype=x.dtype, axis=axis, hadamard=hadamard)

    return copy(r, ra, 1, False, decoded[0]), copy(c, ca, 0, True, decoded[1])


def reference(x, *, rounding="nearest", row_key=None, col_key=None, hadamard_signs=None,
              row_amax=None, col_amax=None) -> tuple[NVFP4Array, NVFP4Array]:
    """The pure-JAX reference of `quantize_rowwise_columnwise`: two reference quantizes."""
    from fp4jax.reference import quantization  # the spec, imported lazily

    return (
        quantization.quantize(x, axis=1, rounding=rounding, key=row_key, amax=row_amax),
        quantization.quantize(x, axis=0, hadamard=True, rounding=rounding, key=col_key,
                              hadamard_signs=hadamard_signs, amax=col_amax),
    )


def main(m: int = 8192, k: int = 8192, configs: Sequence[QuantizeConfig] | None = None, *,
         reps: int = 15, interpret: bool = False) -> list[dict]:
    """Benchmarks `quantize_rowwise_columnwise` (BF16 ``(m, k)``); prints a table.

    The RHT+SR variant with and without the amax pass and the RNE variant, against the
    XLA reference (two jitted reference quantizes), the amax pass alone and the HBM copy
    bandwidth measured in the same run. Bytes counted: input read + both copies' codes
    and scales written. SR rows are checked bit for bit against the XLA reference.
    """
    sweep = timing.Sweep(timing.sweep_input(m, k), reps=reps, interpret=interpret)
    x, add = sweep.x, sweep.add
    rk, ck = jax.random.key(2), jax.random.key(3)

    ref = jax.jit(lambda a: reference(a, rounding="stochastic", row_key=rk, col_key=ck))
    r2 = ref(x)
    out2 = timing.nbytes([(q.data, q.scales) for q in r2])
    add("XLA two-output (rowwise + columnwise RHT), SR", ref, out2)

    def same(got):
        return all(timing.bits_equal(a, b) for a, b in zip(got, r2))

    for cfg in configs or (TWO_OUTPUT_CONFIG,):
        f = jax.jit(lambda a, cfg=cfg: quantize_rowwise_columnwise(
            a, rounding="stochastic", row_key=rk, col_key=ck, config=cfg, interpret=interpret))
        add(f"kernel two-output RHT+SR (amax pass) {cfg.label}", f, out2, lambda f=f: same(f(x)))
        g = jax.jit(lambda a, s1, s2, cfg=cfg: quantize_rowwise_columnwise(
            a, rounding="stochastic", row_key=rk, col_key=ck, row_amax=s1, col_amax=s2,
            config=cfg, interpret=interpret))
        add(f"kernel two-output RHT+SR (amax given) {cfg.label}", g, out2,
            lambda g=g: same(g(x, r2[0].amax, r2[1].amax)), x, r2[0].amax, r2[1].amax)
        h = jax.jit(lambda a, cfg=cfg: quantize_rowwise_columnwise(
            a, row_amax=r2[0].amax, col_amax=r2[1].amax, config=cfg, interpret=interpret))
        add(f"kernel two-output RHT, RNE (amax given) {cfg.label}", h, out2)
    cfg = (configs or (TWO_OUTPUT_CONFIG,))[0]
    amax_only = jax.jit(lambda a: amax_pass.run_amax(a, True, hadamard_lib.DEFAULT_SIGNS, cfg,
                                                     interpret))
    add("amax pass alone (max|x| and max|RHT_col x|)", amax_only, 0)
    return sweep.finish()


if __name__ == "__main__":
    main()
