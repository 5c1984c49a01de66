"""The implementation choice: the one place that knows ``impl=``.

Every quantization and NVFP4 GEMM in fp4jax goes through this module, which picks one
of three backends and calls it:

* ``"xla"``: the pure-JAX reference (`fp4jax.reference`), on every platform;
* ``"pallas"``: the Hopper kernels (`pallas_kernels`, sm_90);
* ``"native"``: the GEMM through `jax.nn.scaled_matmul` (cuDNN's block-scaled FP4 GEMM
  on Blackwell, sm_100+; **untested there**, see `fp4jax.native_gemm`); quantization
  then uses the reference.

``impl="auto"`` picks per call: ``"native"`` GEMMs on sm_100+, on sm_90 the kernels
where they take the problem and the measured policy prefers them (`auto_prefers_gemm_kernel`
reads the per-shape, per-layout H200 timings of `fp4jax.gemm_table`;
`auto_prefers_quantize_kernel`), the reference otherwise. An explicit ``impl="pallas"``
never falls back: a problem the kernel does not take raises `ValueError` with the
kernel's own reason (its ``supports()`` predicate).

**Meshes.** The kernels are custom calls on one device's operands, which XLA cannot
partition. Traced under a mesh of more than one device (``jax.set_mesh``,
``jax.sharding.use_abstract_mesh``; `fp4jax.train` traces its steps under its mesh),
or given an operand placed on several devices, ``"auto"`` takes the XLA path and
``"pallas"`` raises (`mesh_reason`). Inside ``shard_map`` the mesh's manual axes do not
count: there the operands are one device's shards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp

from fp4jax import gemm_table, native_gemm
from fp4jax.numerics import checks, layout, scales
from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.nvfp4_array import DecodedNVFP4, NVFP4Array
from fp4jax.numerics.rounding import Rounding
from fp4jax.numerics.scales import ScaleRule
from fp4jax.reference import gemm as reference_gemm
from fp4jax.reference import quantization as reference_quantization

Impl = Literal["xla", "pallas", "native", "auto"]
"""What a caller asks for."""

Backend = Literal["xla", "pallas", "native"]
"""What actually runs."""

IMPLS: tuple[str, ...] = ("xla", "pallas", "native", "auto")

GEMM_KERNEL_OUTPUT_DTYPES = tuple(jnp.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16))


def mesh_reason(*operands: Any) -> str | None:
    """Why the single-device kernels cannot run here, or None: the mesh in context at
    trace time (its axes that are not manual, as inside ``shard_map``) spans more than
    one device, or a concrete operand (an array or an `NVFP4Array`) is placed on several.

    Example:
      >>> import jax
      >>> mesh = jax.sharding.AbstractMesh((4,), ("fsdp",))
      >>> with jax.sharding.use_abstract_mesh(mesh):
      ...   mesh_reason()
      "operands may be sharded over a 4-device mesh; the kernels run on one device's operands"
      >>> mesh_reason() is None
      True
    """
    mesh = jax.sharding.get_abstract_mesh()
    devices = 1
    if not mesh.empty:
        devices = math.prod(size for size, kind in zip(mesh.axis_sizes, mesh.axis_types)
                            if kind != jax.sharding.AxisType.Manual)
    for x in operands:
        x = x.data if isinstance(x, NVFP4Array) else x
        x = x.values if isinstance(x, DecodedNVFP4) else x
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            devices = max(devices, len(x.sharding.device_set))
    if devices > 1:
        return (f"operands may be sharded over a {devices}-device mesh; the kernels run on "
                "one device's operands")
    return None


def check_impl(impl: Any) -> Impl:
    """Returns ``impl`` or raises `ValueError` naming the valid choices."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


def gpu_capability() -> tuple[int, int] | None:
    """Compute capability of the default device, or None if it is not a CUDA GPU."""
    d = jax.devices()[0]
    cc = getattr(d, "compute_capability", None)
    if d.platform != "gpu" or not cc:
        return None
    major, minor = (int(v) for v in str(cc).split(".")[:2])
    return major, minor


def on_hopper() -> bool:
    """Whether the default device is a Hopper GPU (sm_9x): where the Pallas kernels run."""
    cc = gpu_capability()
    return cc is not None and (9, 0) <= cc < (10, 0)


GemmLayout = Literal["fprop", "dgrad", "wgrad"]


def gemm_layout(rhs: NVFP4Array, *, lhs_from_mT: bool) -> GemmLayout:  # noqa: N803
    """Which training GEMM's operand layout a product has: ``"wgrad"`` (``lhs`` is the
    ``.mT`` view of a tensor blocked along tokens), ``"dgrad"`` (``rhs`` blocked along N:
    the transposed weight) or ``"fprop"`` (``rhs`` blocked along K)."""
    if lhs_from_mT:
        return "wgrad"
    return "dgrad" if rhs.axis == rhs.ndim - 1 else "fprop"


KERNEL_WIN_MARGIN = 0.95
"""The GEMM kernel must have measured at most this fraction of XLA's time to be chosen:
measurement-noise ties go to XLA."""

TABLE_SMS = 132
"""SMs of the GPU the GEMM table was measured on (H200)."""


def gemm_kernel_ctas(m: int, n: int, k: int) -> int:
    """CTAs (output tiles × K splits) of the GEMM kernel's default tuning for a shape."""
    from pallas_kernels import gemm_config  # the kernel's own tiling rule

    cfg = gemm_config.default_config(m, n, k)
    return -(-m // cfg.cta_tile_m) * (n // cfg.cta_tile_n) * cfg.k_splits


def auto_prefers_gemm_kernel(m: int, n: int, k: int, layout: GemmLayout = "fprop") -> bool:
    """Whether ``"auto"`` sends an (M, K) × (K, N) NVFP4 GEMM to the Hopper kernel.

    Read from the measured table `fp4jax.gemm_table.MEASURED` (H200; regenerate it with
    ``benchmarks/gemm_auto_table.py``): the kernel is chosen where it measured at most
    `KERNEL_WIN_MARGIN` of the XLA decode-and-dot time, so a shape of the table never
    runs the slower implementation and noise-level ties go to XLA. Another shape follows
    the nearest measured shape of its layout (distance: the sum of ``|log2|`` ratios of
    M, N and K), but a kernel win is only carried over when the kernel would launch at
    least as many CTAs as at that measured shape (or fill the GPU): a shape with a longer
    K per CTA, e.g. a weight gradient over many tokens, is not assumed to win.

    Example:
      >>> auto_prefers_gemm_kernel(16, 8192, 8192, "fprop")  # skinny: the kernel measured faster
      True
      >>> auto_prefers_gemm_kernel(8192, 8192, 8192, "fprop")  # square: XLA measured faster
      False
    """
    entries = [(key, t) for key, t in gemm_table.MEASURED.items() if key[0] == layout]
    if not entries:
        raise ValueError(f"no measured GEMM table for layout {layout!r}")

    def distance(key):
        _, mm, nn, kk = key
        return sum(abs(math.log2(a / b)) for a, b in ((m, mm), (n, nn), (k, kk)))

    (_, mm, nn, kk), (xla_ms, pallas_ms) = min(entries, key=lambda e: distance(e[0]))
    if pallas_ms is None or xla_ms is None or pallas_ms > KERNEL_WIN_MARGIN * xla_ms:
        return False
    if (m, n, k) == (mm, nn, kk):
        return True
    return gemm_kernel_ctas(m, n, k) >= min(gemm_kernel_ctas(mm, nn, kk), TABLE_SMS)


def auto_gemm_runs_xla(m: int, n: int, k: int, layout: GemmLayout = "fprop") -> bool:
    """Whether ``impl="auto"`` surely multiplies this GEMM with XLA's dot here, on Hopper
    (sm_9x), where its operands come from the quantize kernels: they may then come
    decoded (`quantize_rowwise_columnwise`'s ``decoded``), skipping the GEMM's decode pass.

    False off Hopper (no quantize kernels; Blackwell multiplies codes natively) and where
    the measured table prefers the GEMM kernel (it multiplies codes).
    """
    return on_hopper() and not auto_prefers_gemm_kernel(m, n, k, layout)


def auto_prefers_quantize_kernel(*, columnwise: bool, stochastic: bool) -> bool:
    """Whether ``"auto"`` quantizes with the Pallas kernel (where it takes the problem).

    Every quantization the kernels take is bit-identical to the reference on the H200
    and faster than the XLA path (docs/BENCHMARKS.md), so the kernel is always preferred.
    """
    del columnwise, stochastic  # no measured case where the XLA path is faster
    return True


def choose(
    impl: Impl, *, gemm: bool, kernel_reason: Callable[[], str | None], auto_prefers_kernel: bool
) -> Backend:
    """The backend that runs one quantization (``gemm=False``) or GEMM (``gemm=True``).

    Args:
      impl: what the caller asked for.
      gemm: whether the call is a GEMM (``"native"`` applies to GEMMs only).
      kernel_reason: returns None when the Pallas kernel takes the problem, else why not
        (the kernel module's ``supports()``); called only when the kernel is considered.
      auto_prefers_kernel: the measured policy's verdict for this problem on sm_90.

    Raises:
      ValueError: ``impl="pallas"`` for a problem the kernel does not take.
    """
    match check_impl(impl):
        case "xla":
            return "xla"
        case "native":
            return "native" if gemm else "xla"
        case "pallas":
            reason = kernel_reason()
            if reason is not None:
                raise ValueError(
                    f"impl='pallas': the Pallas kernel does not take this "
                    f"{'GEMM' if gemm else 'quantization'}: {reason} (use impl='auto' to fall "
                    "back to the XLA path where the kernel does not apply)"
                )
            return "pallas"
        case "auto":
            cc = gpu_capability()
            if cc is None or cc < (9, 0):
                return "xla"
            if cc >= (10, 0):
                return "native" if gemm else "xla"
            if auto_prefers_kernel and kernel_reason() is None:
                return "pallas"
            return "xla"


def output_scales(pairs: Sequence[tuple[jax.Array, jax.Array]], *, impl: Impl = "xla"
                  ) -> jax.Array:
    """The output factors ``fl(gds_lhs · gds_rhs)`` of several NVFP4 GEMMs: float32[n].

    ``pairs`` holds each GEMM's ``(lhs.amax, rhs.amax)``. Computed in one vectorized pass
    (`fp4jax.numerics.scales.output_scales`), or, with ``impl`` "auto" or "pallas" on one
    Hopper GPU with the operands on one device (`mesh_reason`), in one tiny kernel
    (`pallas_kernels.scale_kernels`, as the quantize kernels compute their scales). Same
    bits either way.

    Example:
      >>> output_scales([(2688.0, 5376.0)]).tolist()
      [2.0]
    """
    if impl in ("auto", "pallas") and on_hopper() \
            and mesh_reason(*(a for pair in pairs for a in pair)) is None:
        from pallas_kernels import scale_kernels  # noqa: PLC0415

        return scale_kernels.output_scales(pairs)
    return scales.output_scales(pairs)


def quantize(
    x: jax.typing.ArrayLike,
    *,
    axis: int = -1,
    block_2d: bool = False,
    rounding: Rounding = "nearest",
    key: jax.Array | None = None,
    hadamard: bool = False,
    hadamard_signs: Sequence[int] | None = None,
    amax: jax.typing.ArrayLike | None = None,
    scale_rule: ScaleRule = "six",
    impl: Impl = "xla",
) -> NVFP4Array:
    """Quantizes ``x`` to NVFP4 with 16-element blocks along ``axis``.

    Steps (docs/RECIPE.md §2, every step in float32): global amax; global encode scale
    ``ges``; per-block amax; block decode scale ``s = e4m3(min(bamax * fl(ges *
    fl(1/6)), 448))``; per-block encode scale ``min(1 / (s * gds), FLT_MAX)``;
    elements ``clamp(x * enc, -6, 6)`` rounded to E2M1 (nearest-even or stochastic),
    the sign taken from ``v < 0``.

    A partial last block along ``axis`` is **zero-padded** (zeros change no amax);
    the padding is stored in ``data`` but `dequantize` drops it. With
    ``hadamard=True`` the length of ``axis`` must be a multiple of 16
    (`ValueError` otherwise), because the rotation would mix padding into real
    values.

    Non-finite inputs: if ``x`` holds a NaN or ±inf, the stored ``amax`` is NaN, so
    every dequantized element and every GEMM output using this tensor is NaN — a
    non-finite input is never turned into finite values.

    Args:
      x: float32, bfloat16 or float16 array of rank >= 1.
      axis: the block (contraction) axis.
      block_2d: one scale per 16×16 tile spanning ``axis`` and the other of the last
        two axes (for weights, docs/RECIPE.md §3). ``axis`` must be one of the last two.
      rounding: ``"nearest"`` (round-to-nearest-even) or ``"stochastic"`` (unbiased;
        needs ``key``; docs/RECIPE.md §5).
      key: a ``jax.random`` key (typed or raw), required for stochastic rounding. The
        same key gives the same bits.
      hadamard: quantize ``RHT(x)`` along ``axis`` (amax taken after the transform);
        `dequantize` then returns rotated-domain values.
      hadamard_signs: the RHT sign vector (16 entries ±1); default
        `fp4jax.DEFAULT_HADAMARD_SIGNS`.
      amax: a precomputed global amax (float scalar), e.g. reduced across devices.
        Must be at least ``max|x|`` (of the rotated ``x`` with ``hadamard``).
      scale_rule: ``"six"`` (the standard rule above) or ``"four_over_six"``: each block
        (tile) also tries the scale mapping its amax to 4 and keeps it when its squared
        error is strictly lower (docs/RECIPE.md §2.8). Not with ``hadamard`` or stochastic
        rounding (`ValueError`); XLA only (``impl="pallas"`` raises).
      impl: ``"xla"`` (the pure-JAX reference), ``"pallas"`` (the fused Hopper kernel;
        bit-identical) or ``"auto"``; see this module's docstring.

    Returns:
      An `NVFP4Array`.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> x = jax.random.normal(jax.random.key(0), (4, 64), jnp.bfloat16)
      >>> q = fp4jax.quantize(x)
      >>> y = fp4jax.dequantize(q)
      >>> bool(jnp.all(fp4jax.dequantize(fp4jax.quantize(y)) == y))  # idempotent
      True
    """
    args = checks.check_quantize_arguments(
        x, axis=axis, block_2d=block_2d, rounding=rounding, key=key, hadamard=hadamard,
        hadamard_signs=hadamard_signs, amax=amax, scale_rule=scale_rule)
    kw = dict(axis=args.axis, block_2d=block_2d, rounding=rounding, key=key, hadamard=hadamard,
              hadamard_signs=args.hadamard_signs, amax=args.amax)

    def kernel_reason() -> str | None:
        from pallas_kernels import quantize_single

        if scale_rule != "six":
            return f"scale_rule={scale_rule!r} is implemented in XLA only"
        return mesh_reason(args.x) or quantize_single.supports(
            args.x.shape, args.x.dtype, axis=args.axis, block_2d=block_2d, hadamard=hadamard)

    backend = choose(
        impl, gemm=False, kernel_reason=kernel_reason,
        auto_prefers_kernel=auto_prefers_quantize_kernel(
            columnwise=args.axis != args.x.ndim - 1, stochastic=rounding == "stochastic"))
    if backend == "pallas":
        from pallas_kernels import quantize_single

        return quantize_single.quantize(args.x, **kw)
    return reference_quantization.quantize(args.x, scale_rule=scale_rule, **kw)


def dequantize(q: NVFP4Array, dtype: Any = jnp.float32) -> jax.Array:
    """Decodes an `NVFP4Array` to a dense array (docs/RECIPE.md §2.7).

    ``x̂ = fl(e2m1(code) * fl(fl(f32(s) * amax) * fl(1/2688)))`` per element, then cast
    to ``dtype``. Padding is dropped. For ``q.hadamard`` the result is in the rotated
    domain. One implementation on every platform (XLA fuses it into its consumer).

    Args:
      q: the quantized tensor.
      dtype: output dtype (a float type).

    Returns:
      Array of shape ``q.shape`` and dtype ``dtype``.

    Example:
      >>> import jax.numpy as jnp, fp4jax
      >>> x = jnp.array([[0.0, 1.0, -2.0, 6.0] * 4])
      >>> fp4jax.dequantize(fp4jax.quantize(x))[0, :4].tolist()
      [0.0, 1.0, -2.0, 6.0]
    """
    return reference_quantization.dequantize(q, dtype)


def quantize_rowwise_columnwise(
    x: jax.Array,
    *,
    rounding: Rounding = "nearest",
    row_key: jax.Array | None = None,
    col_key: jax.Array | None = None,
    hadamard_signs: Sequence[int] | None = None,
    impl: Impl = "xla",
    decoded: tuple[bool, bool] = (False, False),
) -> tuple[NVFP4Array | DecodedNVFP4, NVFP4Array | DecodedNVFP4]:
    """The two copies of an ``(M, K)`` tensor that a linear layer keeps for its GEMMs.

    ``decoded`` (rowwise, columnwise): where the kernel runs, return that copy as a
    `DecodedNVFP4` (``code · s`` in BF16) for an XLA GEMM to multiply right away; the
    XLA path returns NVFP4Arrays (`matmul` takes either, with the same results).

    The rowwise copy has 1D blocks along K (fprop's X, dgrad's dY); the columnwise copy
    is Hadamard-rotated with blocks along M (wgrad's Xᵀ, dYᵀ), with M zero-padded to a
    multiple of 16 first. Both use ``rounding``; with the kernel one read of ``x``
    produces both.

    Mathematically equivalent to::

      (quantize(x, axis=1, rounding=rounding, key=row_key),
       quantize(pad_to_block(x, 0), axis=0, hadamard=True, rounding=rounding, key=col_key))

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from fp4jax import implementation
      >>> x = jax.random.normal(jax.random.key(0), (40, 64), jnp.bfloat16)
      >>> r, c = implementation.quantize_rowwise_columnwise(x)
      >>> r.shape, c.shape, c.hadamard
      ((40, 64), (48, 64), True)
    """
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"quantize_rowwise_columnwise takes an (M, K) array, got shape {x.shape}")
    m = x.shape[0]
    padded = layout.pad_to_block(x, 0)

    def kernel_reason() -> str | None:
        from pallas_kernels import quantize_two_output

        return mesh_reason(x) or quantize_two_output.supports(
            (layout.num_blocks(m) * BLOCK,) + x.shape[1:], x.dtype)

    backend = choose(
        impl, gemm=False, kernel_reason=kernel_reason,
        auto_prefers_kernel=auto_prefers_quantize_kernel(
            columnwise=True, stochastic=rounding == "stochastic"))
    if backend == "pallas":
        from pallas_kernels import quantize_two_output

        row, col = quantize_two_output.quantize_rowwise_columnwise(
            padded, rounding=rounding, row_key=row_key, col_key=col_key,
            hadamard_signs=hadamard_signs, decoded=decoded)
        # Zero rows change neither the amax nor any other row's codes, scales or SR bits
        # (the counter is the index within the padded row), so the rowwise copy of the
        # unpadded tensor is the first m rows.
        return row.take_leading(m), col
    row = reference_quantization.quantize(x, axis=1, rounding=rounding, key=row_key)
    col = reference_quantization.quantize(
        padded, axis=0, hadamard=True, rounding=rounding, key=col_key,
        hadamard_signs=hadamard_signs)
    return row, col


def matmul(
    lhs: NVFP4Array | DecodedNVFP4,
    rhs: NVFP4Array | DecodedNVFP4,
    *,
    preferred_element_type: Any = jnp.float32,
    impl: Impl = "xla",
    lhs_from_mT: bool = False,  # noqa: N803 - mirrors jax.Array.mT
    out_sharding: Any = None,
    output_scale: jax.typing.ArrayLike | None = None,
) -> jax.Array:
    """Multiplies two NVFP4 tensors: ``lhs (..., M, K) @ rhs (..., K, N)``.

    Emulated exactly on hardware without FP4 tensor cores (docs/RECIPE.md §9): each
    operand is decoded to ``code · s`` in BF16 (exact), multiplied with FP32
    accumulation, and the accumulator is scaled by ``fl(gds_lhs · gds_rhs)``.

    Args:
      lhs: ``(..., M, K)`` blocked along K (or 2D-tiled); or a `DecodedNVFP4` (a quantize
        kernel's decoded copy), which XLA's dot multiplies as it is (``impl`` "xla" or
        "auto"; "pallas" and "native" multiply codes and refuse it).
      rhs: ``(..., K, N)`` blocked along K (or 2D-tiled); likewise.
      preferred_element_type: output dtype.
      impl: ``"xla"`` (decode to BF16 and XLA's dot), ``"pallas"`` (the Hopper
        kernel, decode in-kernel), ``"native"`` (`jax.nn.scaled_matmul`, Blackwell;
        untested there) or ``"auto"``; see this module's docstring.
      lhs_from_mT: a layout hint: ``lhs`` is the ``.mT`` view of an array blocked
        along its rows (wgrad's Xᵀ), so both backends read it in its stored
        orientation. Results do not depend on it.
      out_sharding: the output's sharding (a `PartitionSpec` under an explicit mesh), as
        in `jax.lax.dot_general`; needed when the contraction is sharded.
      output_scale: the accumulator's factor ``fl(gds_lhs · gds_rhs)`` if already
        computed (`fp4jax.numerics.scales.output_scales`, several GEMMs in one pass);
        by default computed from the operands' amaxes. A wrong value scales the result.

    Returns:
      ``(..., M, N)`` array of ``preferred_element_type``.

    Mathematically equivalent to::

      dequantize(lhs) @ dequantize(rhs)   # up to float32 summation order

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> a = fp4jax.quantize(jax.random.normal(jax.random.key(0), (8, 32)))
      >>> b = fp4jax.quantize(jax.random.normal(jax.random.key(1), (32, 4)), axis=0)
      >>> fp4jax.matmul(a, b).shape
      (8, 4)
    """
    checks.check_gemm_operands(lhs, rhs)
    out_dtype = jnp.dtype(preferred_element_type)
    m, k, n = lhs.shape[-2], lhs.shape[-1], rhs.shape[-1]
    if isinstance(lhs, DecodedNVFP4) or isinstance(rhs, DecodedNVFP4):
        # Decoded by the quantize kernel for exactly this: XLA's dot, no decode pass.
        if check_impl(impl) in ("pallas", "native"):
            raise ValueError(
                f"impl={impl!r} multiplies E2M1 codes; a DecodedNVFP4 operand (decoded "
                "values) is multiplied by XLA's dot: use impl='auto' or 'xla'")
        return reference_gemm.matmul(lhs, rhs, preferred_element_type=out_dtype,
                                     out_sharding=out_sharding, lhs_from_mT=lhs_from_mT,
                                     single_device=mesh_reason(lhs, rhs) is None,
                                     output_scale=output_scale)

    def kernel_reason() -> str | None:
        from pallas_kernels import gemm

        if (reason := mesh_reason(lhs, rhs)) is not None:
            return reason
        if out_sharding is not None:
            return "the kernel runs on one device's operands (no out_sharding)"
        if out_dtype not in GEMM_KERNEL_OUTPUT_DTYPES:
            return f"the kernel writes float32, bfloat16 or float16, not {out_dtype}"
        return gemm.supports(lhs, rhs, lhs_from_mT=lhs_from_mT)

    backend = choose(impl, gemm=True, kernel_reason=kernel_reason,
                     auto_prefers_kernel=auto_prefers_gemm_kernel(
                         m, n, k, gemm_layout(rhs, lhs_from_mT=lhs_from_mT)))
    if backend == "pallas":
        from pallas_kernels import gemm

        return gemm.matmul(lhs, rhs, preferred_element_type=out_dtype, lhs_from_mT=lhs_from_mT,
                           output_scale=output_scale)
    if backend == "native":
        return native_gemm.matmul(lhs, rhs, preferred_element_type=out_dtype,
                                  output_scale=output_scale)
    return reference_gemm.matmul(lhs, rhs, preferred_element_type=out_dtype,
                                 out_sharding=out_sharding, lhs_from_mT=lhs_from_mT,
                                 single_device=mesh_reason(lhs, rhs) is None,
                                 output_scale=output_scale)
