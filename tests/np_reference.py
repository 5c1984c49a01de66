"""An independent NumPy transcription of docs/RECIPE.md §2–§5 (Transformer Engine's reference).

Written separately from fp4jax (NumPy float32 arithmetic, ml_dtypes for the E4M3
cast, explicit E2M1 comparison table), so that agreement with it checks fp4jax's
formulas, not just fp4jax against itself. 2D inputs, blocks along the last axis.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], F32)


def e2m1_codes_nearest(v: np.ndarray) -> np.ndarray:
    """Transformer Engine's comparison table (cast_to_fp4x2), in NumPy."""
    r = np.zeros(v.shape, np.uint8)
    r[(v >= 0.0) & (v <= 0.25)] = 0
    r[(v > 0.25) & (v < 0.75)] = 1
    r[(v >= 0.75) & (v <= 1.25)] = 2
    r[(v > 1.25) & (v < 1.75)] = 3
    r[(v >= 1.75) & (v <= 2.5)] = 4
    r[(v > 2.5) & (v < 3.5)] = 5
    r[(v >= 3.5) & (v <= 5.0)] = 6
    r[v > 5.0] = 7
    r[(v >= -0.25) & (v < -0.0)] = 8
    r[(v < -0.25) & (v > -0.75)] = 9
    r[(v <= -0.75) & (v >= -1.25)] = 10
    r[(v < -1.25) & (v > -1.75)] = 11
    r[(v <= -1.75) & (v >= -2.5)] = 12
    r[(v < -2.5) & (v > -3.5)] = 13
    r[(v <= -3.5) & (v >= -5.0)] = 14
    r[v < -5.0] = 15
    return r


def e2m1_codes_stochastic(v: np.ndarray, u8: np.ndarray) -> np.ndarray:
    """Stochastic rounding with given 8-bit uniforms: up iff 2u + 1 < 512 frac."""
    grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float64)
    a = np.abs(v.astype(np.float64))
    lo_i = np.searchsorted(grid, a, side="right") - 1
    lo_i = np.clip(lo_i, 0, 7)
    hi_i = np.minimum(lo_i + 1, 7)
    lo, hi = grid[lo_i], grid[hi_i]
    frac = np.where(hi > lo, (a - lo) / np.where(hi > lo, hi - lo, 1), 0.0)
    up = 2.0 * u8.astype(np.float64) + 1.0 < frac * 512.0
    m = np.where(up, hi_i, lo_i).astype(np.uint8)
    return m | np.where(v < 0, 8, 0).astype(np.uint8)


def _lowbias32(x: np.ndarray) -> np.ndarray:
    """Wellons' lowbias32 in NumPy uint64 arithmetic, reduced mod 2**32 at each step."""
    m = np.uint64(0xFFFFFFFF)
    x = x.astype(np.uint64) & m
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & m
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & m
    return x ^ (x >> np.uint64(16))


def sr_bytes_rowwise(key_words: tuple[int, int], m: int, k: int) -> np.ndarray:
    """The 8-bit SR uniforms of an (m, k) tensor quantized along its last axis (RECIPE §5).

    Block b (row-major over the (m, k/16) block grid) hashes counters 4b + j; element
    p = 4j + i of the block takes byte i of word j.
    """
    k0, k1 = (np.uint64(w) for w in key_words)
    mask = np.uint64(0xFFFFFFFF)
    counters = np.arange(m * k // 4, dtype=np.uint64)  # one per group of 4 elements
    h = _lowbias32(counters ^ k0)
    h = _lowbias32((h + k1) & mask)
    h = _lowbias32(h ^ ((k0 * np.uint64(0x9E3779B9)) & mask))
    bytes_ = (h[:, None] >> (np.uint64(8) * np.arange(4, dtype=np.uint64))) & np.uint64(0xFF)
    return bytes_.reshape(m, k).astype(np.uint32)


def global_and_block_amax(x: np.ndarray, block_2d: bool):
    """(amax, ges, gds, per-block amax (M, K/16)) of a 2D float32 array (docs/RECIPE.md §2)."""
    m, k = x.shape
    amax = F32(np.max(np.abs(x)))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        ges = np.minimum(F32(2688.0) / amax, FLT_MAX).astype(F32)
        if amax == 0 or ges == 0:
            ges = F32(1.0)
        gds = (F32(1.0) / ges).astype(F32)
    if block_2d:
        t = np.abs(x).reshape(m // 16, 16, k // 16, 16).max(axis=(1, 3))
        bamax = np.repeat(t, 16, axis=0)
    else:
        bamax = np.abs(x).reshape(m, k // 16, 16).max(axis=-1)
    return amax, ges, gds, bamax


def quantize_2d_input(x: np.ndarray, block_2d: bool = False, u8: np.ndarray | None = None):
    """Quantizes a 2D array along its last axis (length a multiple of 16).

    Returns (codes uint8 (M, K), scales float32 (M, K/16) per 1x16 block,
    amax float32, dequantized float32 (M, K)).
    """
    x = np.asarray(x).astype(F32)
    m, k = x.shape
    assert k % 16 == 0 and (not block_2d or m % 16 == 0)
    amax, ges, gds, bamax = global_and_block_amax(x, block_2d)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        blocks = x.reshape(m, k // 16, 16)
        mult = (ges * (F32(1.0) / F32(6.0))).astype(F32)
        d = np.minimum((bamax * mult).astype(F32), F32(448.0))
        s = d.astype(ml_dtypes.float8_e4m3fn).astype(F32)
        enc = np.minimum((F32(1.0) / (s * gds).astype(F32)).astype(F32), FLT_MAX)
        v = np.clip((blocks * enc[..., None]).astype(F32), F32(-6.0), F32(6.0)).reshape(m, k)
    if u8 is None:
        codes = e2m1_codes_nearest(v)
    else:
        codes = e2m1_codes_stochastic(v, u8)
    factor = ((s * amax).astype(F32) * (F32(1.0) / F32(2688.0))).astype(F32)
    deq = (E2M1[codes] * np.repeat(factor, 16, axis=1)).astype(F32)
    return codes, s, amax, deq


def rht_exact(x: np.ndarray, signs) -> np.ndarray:
    """Exact (float64) 16x16 RHT along the last axis."""
    h = np.ones((1, 1))
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    t = (np.asarray(signs, np.float64)[:, None] * h) / 4.0
    x = np.asarray(x, np.float64)
    return (x.reshape(*x.shape[:-1], -1, 16) @ t).reshape(x.shape)


def four_over_six_errors(x: np.ndarray, codes: np.ndarray, s: np.ndarray, ges, block_2d: bool):
    """Per-block (per-tile with ``block_2d``) squared errors of docs/RECIPE.md §2.8.

    ``x`` (M, K) inputs, ``codes`` (M, K), ``s`` (M, K/16) the scale of each 1x16 block.
    Element by element: ``t = fl(x·ges)``, ``d = fl(e2m1·s - t)``, ``e = fl(d·d)``; a
    block sums its 16 ``e`` from left to right; a tile adds its 16 row sums pairwise
    (rows i and i+8, then i+4, i+2, i+1). Returns (M, K/16) or (M/16, K/16).
    """
    m, k = x.shape
    t = (x.astype(F32) * F32(ges)).astype(F32)
    y = (E2M1[codes] * np.repeat(s, 16, axis=1)).astype(F32)  # exact
    d = (y - t).astype(F32)
    e = (d * d).astype(F32).reshape(m, k // 16, 16)
    total = e[..., 0].copy()
    for i in range(1, 16):
        total = (total + e[..., i]).astype(F32)
    if not block_2d:
        return total
    r = total.reshape(m // 16, 16, k // 16)
    for h in (8, 4, 2, 1):
        r = (r[:, :h] + r[:, h:2 * h]).astype(F32)
    return r[:, 0]


def quantize_2d_input_four_over_six(x: np.ndarray, block_2d: bool = False):
    """`quantize_2d_input` with the 4/6 scale rule (docs/RECIPE.md §2.8), round to nearest.

    Each block (tile) is quantized with ``s6 = e4m3(min(bamax · fl(ges · fl(1/6)), 448))``
    and with ``s4 = e4m3(min(bamax · fl(ges · 0.25), 448))``; ``s4`` and its codes are kept
    iff their squared error is strictly lower. Same returns as `quantize_2d_input`.
    """
    x = np.asarray(x).astype(F32)
    m, k = x.shape
    amax, ges, gds, bamax = global_and_block_amax(x, block_2d)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        candidates = []
        for mult in ((ges * (F32(1.0) / F32(6.0))).astype(F32), (ges * F32(0.25)).astype(F32)):
            d = np.minimum((bamax * mult).astype(F32), F32(448.0))
            s = d.astype(ml_dtypes.float8_e4m3fn).astype(F32)
            enc = np.minimum((F32(1.0) / (s * gds).astype(F32)).astype(F32), FLT_MAX)
            v = np.clip((x.reshape(m, k // 16, 16) * enc[..., None]).astype(F32),
                        F32(-6.0), F32(6.0)).reshape(m, k)
            codes = e2m1_codes_nearest(v)
            candidates.append((s, codes, four_over_six_errors(x, codes, s, ges, block_2d)))
    (s6, c6, e6), (s4, c4, e4) = candidates
    use4 = e4 < e6
    if block_2d:
        use4 = np.repeat(use4, 16, axis=0)
    s = np.where(use4, s4, s6).astype(F32)
    codes = np.where(np.repeat(use4, 16, axis=1), c4, c6).astype(np.uint8)
    factor = ((s * amax).astype(F32) * (F32(1.0) / F32(2688.0))).astype(F32)
    deq = (E2M1[codes] * np.repeat(factor, 16, axis=1)).astype(F32)
    return codes, s, amax, deq
