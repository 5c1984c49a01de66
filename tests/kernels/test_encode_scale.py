"""The kernels' block encode scale (`bit_tricks.encode_scale`) is the reference's, bit for bit.

The reference divides with integers (`fp4jax.numerics.rounding.div_rn`) because GPU float32
division is not correctly rounded; the kernels must not divide either. Here the encode
scale of every E4M3 code, under global decode scales across float32's whole range, is
compared with `fp4jax.numerics.scales.block_encode_scale_table`: in plain JAX, inside a
Mosaic GPU kernel in interpret mode (CPU), and compiled on the GPU (``-m gpu``).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from fp4jax.numerics import scales
from pallas_kernels import bit_tricks as bits
from pallas_kernels import tma_pipeline as tp
from tests.kernels.nvfp4_bits import ON_GPU

_CODES = 127  # non-negative E4M3 codes but NaN


def _gds_sweep(n: int) -> np.ndarray:
    """``n`` global decode scales: every float32 binade (subnormals included) with random
    significands, and those of typical amaxes."""
    rng = np.random.default_rng(1)
    exps = np.resize(np.arange(-126, 128), n - 8)
    bits_ = ((exps + 127).astype(np.uint32) << 23) | rng.integers(0, 2**23, n - 8, np.uint32)
    sub = rng.integers(1, 2**23, 8, np.uint32)  # subnormal gds
    return np.concatenate([bits_, sub]).view(np.float32)


@jax.jit
def _grid_arrays(gds):
    codes = jnp.minimum(jnp.arange(128), _CODES - 1).astype(jnp.uint8)
    s = jnp.broadcast_to(jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn)
                         .astype(jnp.float32), (gds.shape[0], 128))
    g = jnp.broadcast_to(gds[:, None], s.shape)
    recips = jax.vmap(bits.mantissa_recips)(gds)  # (n, 8)
    r = jnp.broadcast_to(recips.T[:, :, None], (8, *s.shape))
    return s, g, r, scales.block_encode_scale(s, g)


def _grid(gds: np.ndarray):
    """(s, gds, recips, want, exact) as (len(gds), 128) float32 arrays (code 0 padded)."""
    s, g, r, want = _grid_arrays(jnp.asarray(gds))
    with np.errstate(over="ignore"):
        y = np.asarray(s) * np.asarray(g)
    exact = (y >= bits.EXACT_FROM) & (np.asarray(g) >= bits.EXACT_FROM) & (
        np.asarray(g) <= bits.EXACT_TO)
    return s, g, r, np.asarray(want), exact


def test_division_free_identity():
    """Where `encode_scale` does not divide, ``2**-E · recips[m]`` is the reference's
    ``min(fl(1 / fl(s · gds)), FLT_MAX)`` for ``s = 2**E (1 + m/8)``, computed here in
    NumPy; and it covers every code but 0 for the gds of any amax in [1e-30, FLT_MAX]."""
    gds = _gds_sweep(512)
    s, g, r, want, exact = _grid(gds)
    sb = np.asarray(s).view(np.uint32)
    inv_pow2 = (np.uint32(254 << 23) - (sb & np.uint32(0x7F800000))).view(np.float32)
    m = (sb >> 20) & 7
    r = np.asarray(r)
    with np.errstate(over="ignore"):  # outside the exact range (not compared)
        scaled = np.take_along_axis(np.moveaxis(r, 0, -1), m[..., None], -1)[..., 0] * inv_pow2
    np.testing.assert_array_equal(scaled[exact].view(np.uint32), want[exact].view(np.uint32))
    amaxes = jnp.asarray([1e-30, 1e-10, 1.0, 2688.0, 3e38], jnp.float32)
    real = np.asarray(jax.jit(scales.global_decode_scale)(amaxes))
    smallest = real * np.float32(2.0**-9)  # fl(s·gds) of the smallest nonzero E4M3 value
    assert ((smallest >= bits.EXACT_FROM) & (real <= bits.EXACT_TO)).all()


def test_encode_scale_is_the_table_in_plain_jax():
    """All 127 codes under 256 gds across float32's range: the same bits as the table.
    And in the exact range the result comes from ``recips``, not from a division: one
    ulp more in every ``recips[m]`` moves exactly those results."""
    s, g, r, want, exact = _grid(_gds_sweep(256))
    enc = jax.jit(bits.encode_scale)
    got = np.asarray(enc(s, g, tuple(r[i] for i in range(8))))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    bumped = np.asarray(enc(s, g, tuple(jnp.nextafter(r[i], jnp.inf) for i in range(8))))
    np.testing.assert_array_equal(bumped != want, exact)


def _encode_kernel(s_ref, g_ref, r_ref, new_ref, old_ref):
    s, g = s_ref[...], g_ref[...]
    new_ref[...] = bits.encode_scale(s, g, tuple(r_ref[i] for i in range(8)))
    old_ref[...] = 1.0 / (s * g)  # the kernels' former formula, for the GPU report


@functools.partial(jax.jit, static_argnames=("interpret",))
def _in_kernel(s, g, r, *, interpret):
    out = jax.ShapeDtypeStruct(s.shape, jnp.float32)
    return plgpu.kernel(_encode_kernel, out_type=(out, out), compiler_params=tp.lane_params(),
                        interpret=tp.interpret_params(interpret))(s, g, r)


def test_encode_scale_in_a_kernel_interpret():
    """Inside a Mosaic GPU kernel in interpret mode (CPU): the table's bits everywhere."""
    s, g, r, want, _ = _grid(_gds_sweep(256))
    new, _ = (np.asarray(a) for a in _in_kernel(s, g, r, interpret=True))
    np.testing.assert_array_equal(new.view(np.uint32), want.view(np.uint32))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gpu_encode_scale_in_a_kernel(capsys):
    """Compiled on the GPU: the table's bits wherever `encode_scale` does not divide.
    Reports (run with -s) how often the former in-kernel division ``1 / (s·gds)`` was
    not correctly rounded, and the fallback's mismatches (blocks of amax below ~1e-37)."""
    s, g, r, want, exact = _grid(_gds_sweep(256))
    new, old = (np.asarray(a) for a in _in_kernel(s, g, r, interpret=False))
    old = np.minimum(old, np.float32(3.4028235e38))
    bad_old = int((old.view(np.uint32) != want.view(np.uint32))[exact].sum())
    with capsys.disabled():
        print(f"\n[encode scale] in-kernel 1/(s*gds) misrounded in {bad_old} of "
              f"{int(exact.sum())} cases; fallback mismatches "
              f"{int((new.view(np.uint32) != want.view(np.uint32))[~exact].sum())} of "
              f"{int((~exact).sum())}")
    np.testing.assert_array_equal(new[exact].view(np.uint32), want[exact].view(np.uint32))


@pytest.mark.skipif(ON_GPU, reason="the CPU host lowering; on a GPU the kernel runs")
def test_encode_kernel_lowers_for_cuda():
    """The division-free encode scale lowers for the GPU (layouts of the scalar selects)."""
    sds = jax.ShapeDtypeStruct
    jax.jit(functools.partial(_in_kernel, interpret=False)).trace(
        sds((256, 128), jnp.float32), sds((256, 128), jnp.float32),
        sds((8, 256, 128), jnp.float32)).lower(lowering_platforms=("cuda",))
