"""Choosing an implementation: ``impl="xla" | "pallas" | "native" | "auto"``.

* ``"xla"``: the pure-JAX reference (every platform).
* ``"pallas"``: the Hopper kernels in `pallas_kernels` (sm_90). A shape or dtype a
  kernel cannot take raises its `ValueError`.
* ``"native"``: the GEMM goes to `jax.nn.scaled_matmul` (cuDNN's block-scaled FP4
  GEMM on Blackwell, sm_100+; untested there, see `fp4jax.native`); quantization
  uses the XLA path.
* ``"auto"``: ``"native"`` on sm_100+, the kernels on sm_90 where they take the
  shape (the XLA path otherwise, silently), the XLA path elsewhere.
"""

from __future__ import annotations

from typing import Literal

import jax

Impl = Literal["xla", "pallas", "native", "auto"]
IMPLS = ("xla", "pallas", "native", "auto")


def check_impl(impl: str) -> str:
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


def resolve(impl: str) -> str:
    """The concrete implementation ``impl`` means on the default device.

    Returns ``"xla"``, ``"pallas"``, ``"native"`` or ``"auto-pallas"`` (kernels where
    they take the shape, XLA otherwise).
    """
    check_impl(impl)
    if impl != "auto":
        return impl
    cc = gpu_capability()
    if cc is None:
        return "xla"
    if cc >= (10, 0):
        return "native"
    if cc >= (9, 0):
        return "auto-pallas"
    return "xla"


def auto_uses_gemm_kernel(m: int, n: int, k: int) -> bool:
    """Whether ``impl="auto"`` sends an (M, K) x (K, N) NVFP4 GEMM to the Hopper kernel.

    From the H200 measurements in docs/BENCHMARKS.md (2026-11-29): the kernel beat
    the XLA dequantize+dot path at 4096³ (270 vs 225 TFLOP/s) and on the skinny
    16×8192×8192 shape (14.0 vs 6.9) but lost at 8192³ (394 vs 513), so the
    crossover lies between 4096 and 8192.
    """
    return m <= 64 or max(m, n, k) <= 4096


def auto_uses_quantize_kernel(*, columnwise: bool, stochastic: bool) -> bool:
    """Whether ``impl="auto"`` quantizes with the Pallas kernel.

    Columnwise (along tokens) stochastic rounding is excluded: on the H200 one
    element of a 384×640 test differed from the reference (2026-11-29), cause not
    found, so it stays on the bit-exact XLA path until fixed.
    """
    return not (columnwise and stochastic)
