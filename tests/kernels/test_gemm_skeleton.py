"""Tests of the GEMM kernels' shared K pipeline, `gemm_skeleton.role_pipeline`, on its own.

The GEMM tests run it under every mainloop; here a kernel with no GEMM in it checks the
pipeline's contract directly, in Mosaic GPU interpret mode (CPU): every consumer
warpgroup sees every K step of every output tile of its CTA, in order, with the blocks the
specs name; a CTA owning several tiles (and one CTA owning one tile fewer than the other)
keeps its barrier phases right across tiles; more stages than K steps are clamped; and no
barrier is left with a phase its waiter never observed (the interpreter checks that when
the barriers are freed).
"""

import functools

import jax
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import gemm_skeleton as sk

_ROWS, _COLS = 8, 128  # one K step's block of a tile


def _weighted_tile_sums(x: jax.Array, *, k_steps: int, stages: int) -> jax.Array:
    """``out[t, w] = Σ_k (k + 1 + w) · x[t, k]`` over the blocks ``x[t, k]`` (each
    (_ROWS, _COLS)) of tile ``t``, summed by consumer warpgroup ``w`` through the
    pipeline: the weights make a skipped, repeated or reordered step visible."""
    num_tiles = x.shape[0]
    spec = plgpu.BlockSpec((_ROWS, _COLS), lambda k: (k, 0))

    def body(x_gmem, out_gmem, acc_smem):
        def tile_operands(info):
            (t,) = info.index
            return (x_gmem.at[t],)

        def consumer(wg):
            def per_tile(info, run_k):
                (t,) = info.index
                acc = acc_smem.at[wg]
                acc[...] = jnp.zeros((_ROWS, _COLS), jnp.float32)

                def mma_body(idx, block, acc_ref):
                    weight = (idx[0] + 1 + wg).astype(jnp.float32)
                    acc_ref[...] = acc_ref[...] + weight * block[...]

                run_k(mma_body, acc)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(acc, out_gmem.at[t, wg])
                plgpu.wait_smem_to_gmem(0)
            return per_tile

        sk.role_pipeline([spec], [x_gmem.dtype], stages=stages, k_steps=k_steps,
                         num_tiles=num_tiles, tile_operands=tile_operands, consumer=consumer)

    out_type = jax.ShapeDtypeStruct((num_tiles, sk.NUM_CONSUMERS, _ROWS, _COLS), jnp.float32)
    return sk.launch(body, (x,), out_type=out_type, num_tiles=num_tiles, num_ctas=None,
                     kernel_name="role_pipeline_test",
                     scratch={"acc_smem": plgpu.SMEM((sk.NUM_CONSUMERS, _ROWS, _COLS),
                                                     jnp.float32)},
                     interpret=True)


@pytest.mark.parametrize("num_tiles, k_steps, stages", [
    (5, 3, 2),  # 2 CTAs: 3 and 2 tiles each, slots reused across tiles
    (3, 2, 4),  # more stages than K steps: clamped to 2
    (1, 1, 3),  # one tile, one K step: the drain waits on the only release
])
def test_every_consumer_sees_every_step_of_its_tiles_in_order(num_tiles, k_steps, stages):
    """Each consumer's weighted sum over the pipeline's blocks equals numpy's."""
    rng = np.random.default_rng(num_tiles * 10 + k_steps)
    x = rng.integers(-8, 8, (num_tiles, k_steps * _ROWS, _COLS)).astype(np.float32)
    out = jax.jit(functools.partial(_weighted_tile_sums, k_steps=k_steps, stages=stages))(
        jnp.asarray(x))
    blocks = x.reshape(num_tiles, k_steps, _ROWS, _COLS)
    for w in range(sk.NUM_CONSUMERS):
        weights = (np.arange(k_steps) + 1 + w).astype(np.float32)
        want = np.einsum("k,tkrc->trc", weights, blocks)
        np.testing.assert_array_equal(np.asarray(out[:, w]), want)


def test_consumer_registers_fill_the_register_file():
    """The two consumers' and the producer's ``setmaxnreg`` budgets use at most the 64K
    registers of an SM for one 384-thread CTA, in steps of 8; the producer decreases
    from, and the consumers increase from, the even share the CTA launches with."""
    total = 128 * (sk.MEMORY_REGISTERS + sk.NUM_CONSUMERS * sk.CONSUMER_REGISTERS)
    assert total <= 65536
    assert sk.CONSUMER_REGISTERS % 8 == 0 and sk.MEMORY_REGISTERS % 8 == 0
    assert 128 * (sk.MEMORY_REGISTERS + sk.NUM_CONSUMERS * (sk.CONSUMER_REGISTERS + 8)) > 65536
    launch_share = 65536 // (128 * (sk.NUM_CONSUMERS + 1)) // 8 * 8  # 168
    assert sk.MEMORY_REGISTERS <= launch_share <= sk.CONSUMER_REGISTERS
    # setmaxnreg draws from the pool the CTA launched with (share x threads), not from
    # the 64K: a budget over the pool waits forever (five warpgroups hung on an H200).
    assert total <= 128 * launch_share * (sk.NUM_CONSUMERS + 1)
