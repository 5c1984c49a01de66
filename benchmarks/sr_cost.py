"""Where the stochastic-rounding quantize kernel's time goes: variants that leave a stage out.

    PYTHONPATH=. python benchmarks/sr_cost.py --out /tmp/sr_cost.json        # GPU
    PYTHONPATH=. python benchmarks/sr_cost.py --shapes 64x128 --interpret    # CPU smoke

Hopper has no hardware counters we can read for the quantize kernels (Nsight Compute
crashed on them in this JAX process), so the cost of each stage of the two-output
RHT+SR kernel (`pallas_kernels.quantize_two_output`, amaxes given, the backward pass's
dY quantization) is measured by difference: the kernel is timed as shipped, with
round-to-nearest, and with the random bits drawn by cheaper hashes (2, 1 and 0 mixing
rounds instead of the recipe's 3) or with the stochastic rounding step replaced by
round-to-nearest fed the same bits; and with the previous rounding sequence for values
below 1 (a remainder against ``float(2 u8 + 1)``, replaced by one threshold compare), to
time that change. The shipped variants and the previous sequence produce the recipe's
bits (checked against the XLA reference); the others exist to be timed. The floor is
the bytes the kernel must move (read ``x``, write both copies' codes and scales) at
the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import jax
import jax.numpy as jnp

from fp4jax.numerics import random_bits
from pallas_kernels import bit_tricks, quantize_two_output, timing


def _hash_rounds(rounds: int):
    def hash32(k0, k1, k2, counter):
        del k2
        h = counter ^ k0
        for r in range(rounds):
            h = random_bits.mix32(h + k1 if r else h)
        return h
    return hash32


def _sr_small_values_by_remainder(x, enc, u8):
    # The sequence the kernels used before 2026-12-01 (third session) for a < 1: the
    # remainder 1024 a - 512 lo against float(2 u8 + 1). The same bits as the shipped one.
    u32, f32 = jnp.uint32, jnp.float32
    v = x * enc
    a = jnp.minimum(jnp.abs(v), f32(6.0))
    b = jax.lax.bitcast_convert_type(a, u32)
    big = (b - (u8 << 14) + u32((0x3FDFFF - (252 << 22)) & 0xFFFFFFFF)) >> 22
    x1024 = a * f32(1024.0)
    lo = x1024 >= f32(512.0)
    rem = jnp.where(lo, x1024 - f32(512.0), x1024)
    odd = jax.lax.bitcast_convert_type((u8 << 1) | u32(0x4B000001), f32) - f32(8388608.0)
    small = jnp.where(lo, u32(1), u32(0)) + jnp.where(odd < rem, u32(1), u32(0))
    mag = jnp.where(b >= u32(0x3F800000), big, small)
    return mag | jnp.where(v < 0, u32(8), u32(0))


def _nearest_fed_bits(x, enc, u8):
    # Keeps the random byte live (the hash is still computed) but rounds to nearest.
    return bit_tricks.nibble_nearest(x, enc) ^ (u8 & jnp.uint32(1))


VARIANTS = {
    "SR, as shipped (3 mixing rounds)": {},
    "RNE": None,
    "SR, 2 mixing rounds": {"hash32": _hash_rounds(2)},
    "SR, 1 mixing round": {"hash32": _hash_rounds(1)},
    "SR, no mixing (counter ^ key)": {"hash32": _hash_rounds(0)},
    "RNE fed the 3-round bits": {"nibble_stochastic": _nearest_fed_bits},
    "SR, previous sequence below 1 (remainder)": {
        "nibble_stochastic": _sr_small_values_by_remainder},
}
"""Variant name -> `bit_tricks` functions replaced while it is traced (None: rounding='nearest')."""


@contextlib.contextmanager
def _patched(replacements: dict):
    saved = {k: getattr(bit_tricks, k) for k in replacements}
    jax.clear_caches()  # the kernel is traced anew with the replacements
    for k, v in replacements.items():
        setattr(bit_tricks, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(bit_tricks, k, v)
        jax.clear_caches()


def measure(m: int, k: int, *, reps: int, interpret: bool) -> list[dict]:
    """Times every `VARIANTS` entry on an ``(m, k)`` bfloat16 input; returns the sweep rows."""
    sweep = timing.Sweep(timing.sweep_input(m, k), reps=reps, interpret=interpret)
    x = sweep.x
    rk, ck = jax.random.key(2), jax.random.key(3)
    ref = jax.jit(lambda a: quantize_two_output.reference(
        a, rounding="stochastic", row_key=rk, col_key=ck))(x)
    amaxes = (ref[0].amax, ref[1].amax)
    out_bytes = timing.nbytes([(q.data, q.scales) for q in ref])
    for name, repl in VARIANTS.items():
        rounding = "nearest" if repl is None else "stochastic"
        with _patched(repl or {}):
            f = jax.jit(lambda a, s1, s2, rounding=rounding: (
                quantize_two_output.quantize_rowwise_columnwise(
                    a, rounding=rounding, row_key=rk, col_key=ck, row_amax=s1, col_amax=s2,
                    interpret=interpret)))
            check = None
            if repl == {} or name.startswith("SR, previous"):  # the recipe's bits
                def check(f=f):
                    got = f(x, *amaxes)
                    return all(timing.bits_equal(g, r) for g, r in zip(got, ref))
            sweep.add(name, f, out_bytes, check, x, *amaxes)
    rows = sweep.finish()
    floor_us = (sweep.in_bytes + out_bytes) / (sweep.copy_gbs * 1e9) * 1e6
    for r in rows:
        r["floor_us"] = floor_us
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="32768x2048,32768x5504",
                   help="comma-separated MxK of the bfloat16 input")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--interpret", action="store_true", help="Mosaic GPU interpret mode (CPU)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    results = {}
    for shape in a.shapes.split(","):
        m, k = (int(v) for v in shape.split("x"))
        results[shape] = measure(m, k, reps=a.reps, interpret=a.interpret)
    command = "python " + " ".join([os.path.relpath(__file__)]
                                   + (sys.argv[1:] if argv is None else list(argv)))
    result = {**timing.environment(), "command": command, "shapes": results}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{result['device']}, jax {result['jax']}, {result['date']}\ncommand: {command}")
    print("| shape | variant | us | floor us | of floor | x shipped SR |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape, rows in results.items():
        shipped = next(r for r in rows if r["name"].startswith("SR, as shipped"))
        for r in rows[1:]:
            print(f"| {shape} | {r['name']}{' (bit-exact)' if r.get('bit_exact') else ''} | "
                  f"{r['us']:.1f} | {r['floor_us']:.1f} | {r['floor_us'] / r['us']:.0%} | "
                  f"{r['us'] / shipped['us']:.2f} |")
    return result


if __name__ == "__main__":
    main()
