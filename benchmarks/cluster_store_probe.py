"""Probe: can one CTA of a 2-CTA cluster store a decoded tile into its peer's SMEM?

Issue 9 target 1's next step is a 2-CTA cluster along M whose CTAs share the rhs decode:
each decodes half of the common rhs tile and stores it both into its own decoded buffer
and into its peer's. This probe builds the smallest kernel that does that with the
primitives of JAX 0.11.2 — a WGMMA-layout BF16 register array stored into the peer's
128-byte-swizzled SMEM with ``plgpu.async_store_smem`` (``st.async``, completing on the
peer's mbarrier) in the Lane semantics our kernels use — and lowers it for CUDA. On a GPU
it also runs it and checks that each CTA holds both halves.

Usage (repo root)::

  PYTHONPATH=. python benchmarks/cluster_store_probe.py   # CPU host: lowering only
"""

from __future__ import annotations

import jax
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax import lax

ROWS, COLS = 64, 128
SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def _body(o_gmem, smem, full):
    cta = lax.axis_index("cluster")
    v = plgpu.layout_cast(jnp.full((ROWS, COLS), 1.0, jnp.bfloat16), plgpu.Layout.WGMMA)
    v = v * (cta + 1).astype(jnp.bfloat16)
    smem.at[cta][...] = v  # own half: plain stores
    plgpu.async_store_smem(v, smem.at[cta], full.at[0], cluster_idx=1 - cta,
                           cluster_dim="cluster")  # the peer's copy of this half
    plgpu.barrier_wait(full.at[0])  # the peer's half has arrived here
    plgpu.commit_smem()
    for half in range(2):
        plgpu.copy_smem_to_gmem(smem.at[half], o_gmem.at[cta, half])
    plgpu.wait_smem_to_gmem(0)


def probe_kernel():
    """The probe: no inputs; output ``(cta, half, ROWS, COLS)``, half ``h`` filled with
    ``h + 1`` in both CTAs if the peer stores arrived."""
    return plgpu.kernel(
        _body, out_type=jax.ShapeDtypeStruct((2, 2, ROWS, COLS), jnp.bfloat16),
        grid=(1,), grid_names=("g",), cluster=(2,), cluster_names=("cluster",),
        num_threads=1, thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        scratch_types=[plgpu.SMEM((2, ROWS, COLS), jnp.bfloat16, transforms=SWIZZLED),
                       plgpu.Barrier(num_arrivals=1, num_barriers=1)])


def main() -> None:
    f = jax.jit(probe_kernel())
    text = f.trace().lower(lowering_platforms=("cuda",)).as_text()
    print(f"lowers for CUDA: {len(text)} characters of module, st.async in it: "
          f"{'st.async' in text}")
    if jax.devices()[0].platform == "gpu":
        out = np.asarray(jax.block_until_ready(f()), np.float32)
        want = np.broadcast_to(np.arange(1, 3, dtype=np.float32)[None, :, None, None],
                               out.shape)
        print(f"runs on {jax.devices()[0].device_kind}: both halves in both CTAs: "
              f"{bool(np.array_equal(out, want))}")


if __name__ == "__main__":
    main()
