"""The GEMM's in-kernel decode (`pallas_kernels.gemm_decode`), checked on the CPU: the
integer bit recipes of the GPU decode (numpy mirror of the Mosaic GPU code) and the
register renamings against Mosaic's layout definitions."""

import numpy as np
from jax.experimental.mosaic import gpu as mgpu

from pallas_kernels import gemm_decode as dec

_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def _bf16_bits_value(bits):
    """Exact value (float64, subnormals kept) of uint16 BF16 bit patterns."""
    return (np.asarray(bits, np.uint32) << 16).view(np.float32).astype(np.float64)


def test_gpu_decode_bit_recipes():
    """The integer recipes give e2m1(code) · 2**-126 (numpy mirror of the mgpu code)."""
    b = np.arange(256, dtype=np.uint64)
    lo, hi = _E2M1[b & 15] * 2.0**-126, _E2M1[b >> 4] * 2.0**-126
    m32 = np.uint64(0xFFFFFFFF)
    # Rows layout: one byte -> bf16x2 (low code, high code).
    w = (((b * dec.ROWS_MAG_MUL) & m32) & dec.MAG_MASK) | (
        ((b * dec.ROWS_SIGN_MUL) & m32) & dec.SIGN_MASK)
    np.testing.assert_array_equal(_bf16_bits_value(w & 0xFFFF), lo)
    np.testing.assert_array_equal(_bf16_bits_value(w >> 16), hi)
    # Cols layout: bytes (b0, b1) of one row -> even-row (lo0, lo1), odd-row (hi0, hi1).
    b0, b1 = np.meshgrid(b, b, indexing="ij")
    assert dec.COLS_SPREAD == 0x4140  # prmt: bytes [b0, 0, b1, 0]
    y = b0 | (b1 << 16)
    for which, code in (("even", lambda v: v & 15), ("odd", lambda v: v >> 4)):
        mag_s, sign_s = dec.COLS_SHIFTS[which]
        w = (((y << mag_s) & m32) & dec.MAG_MASK) | (((y << sign_s) & m32) & dec.SIGN_MASK)
        np.testing.assert_array_equal(_bf16_bits_value(w & 0xFFFF), _E2M1[code(b0)] * 2.0**-126)
        np.testing.assert_array_equal(_bf16_bits_value(w >> 16), _E2M1[code(b1)] * 2.0**-126)
    # Times the scale factor s · 2**118 (BF16), every product is e2m1 · s · 2**-8, exactly.
    s = np.array([2.0**-9, 7 * 2.0**-9, 0.8125, 1.0, 240.0, 448.0])
    prod = lo[:, None] * (s * 2.0**118)[None, :]
    np.testing.assert_array_equal(prod, _E2M1[b & 15][:, None] * s[None, :] * 2.0**-8)
    assert dec.SCALE_FACTOR_SUBNORMAL == 2.0**118 and dec.ACC_UNSCALE == 2.0**16
    assert dec.SCALE_FACTOR_EXACT == 2.0**-8
    # decode="normal": r = bf16((c & 7) << 6 + 0x3F00), then min(r, 2r - 1), then the sign.
    mag = np.arange(8, dtype=np.uint64) << 6
    r = _bf16_bits_value((mag + (dec.NORMAL_BIAS & 0xFFFF)) & 0xFFFF)
    assert r.min() > 2.0**-126  # no subnormals anywhere
    np.testing.assert_array_equal(np.minimum(r, 2 * r - 1), _E2M1[:8])
    assert dec.NORMAL_BIAS >> 16 == dec.NORMAL_BIAS & 0xFFFF


def _tiled_owner(layout, shape):
    """{(warp, lane, register index, vector position): logical index} of a TiledLayout,
    from the tiling semantics documented in mosaic/gpu/fragmented_array.py."""
    idx = np.arange(int(np.prod(shape))).reshape(shape)
    for tile in layout.tiling.tiles:
        lead, dims = idx.shape[:-len(tile)], idx.shape[-len(tile):]
        idx = idx.reshape(*lead, *[v for d, t in zip(dims, tile) for v in (d // t, t)])
        nl = len(lead)
        idx = idx.transpose(*range(nl), *range(nl, nl + 2 * len(tile), 2),
                            *range(nl + 1, nl + 2 * len(tile), 2))
    nd = idx.ndim

    def axes_of(ds):
        return [d % nd for d in ds if isinstance(d, int)]

    warp_d, lane_d = axes_of(layout.warp_dims), axes_of(layout.lane_dims)
    vec_d = layout.vector_dim % nd
    owner = {}
    for pos in np.ndindex(idx.shape):
        def lin(ds, pos=pos):
            return int(np.ravel_multi_index([pos[d] for d in ds], [idx.shape[d] for d in ds]))
        reg = tuple(0 if d in warp_d + lane_d + [vec_d] else pos[d] for d in range(nd))
        owner[(lin(warp_d), lin(lane_d), reg, pos[vec_d])] = np.unravel_index(idx[pos], shape)
    return owner


def test_gpu_register_renamings():
    """Decode and zip only rename registers: check them against Mosaic's layouts."""
    wgmma = _tiled_owner(mgpu.WGMMA_LAYOUT, (128, 64))
    # The simulator reproduces the documented WGMMA assignment (lane 5: row 1, cols 2-3).
    zero = (0,) * 9
    assert [wgmma[(0, 5, zero, v)] for v in (0, 1)] == [(1, 2), (1, 3)]
    assert wgmma[(1, 0, zero, 0)] == (16, 0)
    rows_bytes = _tiled_owner(dec.ROWS_BYTES_LAYOUT.to_mgpu(), (128, 32))
    for (w, l, reg, v), (i, j) in rows_bytes.items():  # byte (i, j) -> elements 2j, 2j+1
        assert v == 0
        for half in (0, 1):
            assert wgmma[(w, l, reg, half)] == (i, 2 * j + half)
    cols_bytes = _tiled_owner(dec.COLS_BYTES_LAYOUT.to_mgpu(), (8, 128))
    decoded = _tiled_owner(dec.COLS_DECODED_LAYOUT.to_mgpu(), (16, 128))
    for (w, l, reg, v), (j, c) in cols_bytes.items():  # packed row j -> rows 2j, 2j+1
        for parity in (0, 1):
            assert decoded[(w, l, dec.zipped_register(reg, parity), v)] == (2 * j + parity, c)
