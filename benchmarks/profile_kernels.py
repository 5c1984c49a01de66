"""Runs each kernel of interest once inside a CUDA profiler range, for Nsight Compute.

Every case is compiled and warmed up first, then run once between ``cuProfilerStart``
and ``cuProfilerStop`` (the CUDA driver API, through ctypes), so that
``ncu --profile-from-start off`` sees exactly the kernels of the measured calls and
none of the compilation, input generation or checks. Cases run in the order given and
print a marker line, so the profiler's kernel list can be read case by case.

Cases (8192×8192 BF16 input unless stated):

* ``copy``: XLA elementwise read + write (the bandwidth reference);
* ``amax``, ``amax_rht``: the amax pass without / with the columnwise RHT;
* ``q_rne``, ``q_sr``: the single-output rowwise kernel, amax given;
* ``q2_rne``, ``q2_sr``: the two-output rowwise + columnwise-RHT kernel, amax given;
* ``q_xla``: the XLA reference quantize (1D RNE, amax given);
* ``gemm_pallas``, ``gemm_xla``, ``gemm_bf16``: 8192³ NVFP4 GEMM (Pallas kernel; XLA
  dequantize + dot) and the BF16 ``jnp.dot``;
* ``gemm_skinny``, ``gemm_skinny_bf16``: the same weight with 16 rows of activations
  (the skinny kernel, as `pallas_kernels.gemm.matmul` calls it) and its BF16 ``jnp.dot``;
* ``layer_bf16``, ``layer_auto``: one linear layer fwd+bwd (8192 tokens, 8192→8192,
  full recipe, ``impl="auto"``) — for the where-the-time-goes table.

Usage (GPU machine, repo root)::

  ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
      --csv --log-file OUT.csv python3 benchmarks/profile_kernels.py --cases q_rne,q2_sr

Without ncu the script just runs (a smoke test of the cases).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fp4jax
from fp4jax.numerics.hadamard import DEFAULT_SIGNS
from pallas_kernels import amax as amax_pass
from pallas_kernels import gemm as kgemm
from pallas_kernels import quantize_single as kq
from pallas_kernels import quantize_two_output as kq2
from pallas_kernels.quantize_single import TWO_OUTPUT_CONFIG
from pallas_kernels.timing import environment, sweep_input

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layer_breakdown import layer_fn  # noqa: E402  (the layer this repo profiles)


def _profiler():
    """(start, stop) of the CUDA driver's profiler range, or no-ops without libcuda."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        return lib.cuProfilerStart, lib.cuProfilerStop
    except OSError:
        return (lambda: 0), (lambda: 0)


def cases(n: int) -> dict:
    """name -> (jitted function, args) for every case."""
    x = sweep_input(n, n)
    key = jax.random.key(3)
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    rot_amax = fp4jax.quantize(x, axis=0, hadamard=True).amax
    sr = dict(rounding="stochastic")
    out = {
        "copy": (jax.jit(lambda a: jax.lax.bitcast_convert_type(
            jax.lax.bitcast_convert_type(a, jnp.uint16) ^ jnp.uint16(1), jnp.bfloat16)), (x,)),
        "amax": (jax.jit(lambda a: amax_pass.run_amax(a, False, None, TWO_OUTPUT_CONFIG,
                                                      False)), (x,)),
        "amax_rht": (jax.jit(lambda a: amax_pass.run_amax(
            a, True, DEFAULT_SIGNS, TWO_OUTPUT_CONFIG, False)), (x,)),
        "q_rne": (jax.jit(lambda a, s: kq.quantize(a, amax=s)), (x, amax)),
        "q_sr": (jax.jit(lambda a, s, k: kq.quantize(a, amax=s, key=k, **sr)), (x, amax, key)),
        "q_xla": (jax.jit(lambda a, s: fp4jax.quantize(a, amax=s, impl="xla")), (x, amax)),
        "q2_rne": (jax.jit(lambda a, s, t: kq2.quantize_rowwise_columnwise(
            a, row_amax=s, col_amax=t)), (x, amax, rot_amax)),
        "q2_sr": (jax.jit(lambda a, s, t, k: kq2.quantize_rowwise_columnwise(
            a, row_amax=s, col_amax=t, row_key=k, col_key=k, **sr)), (x, amax, rot_amax, key)),
    }
    a = jax.random.normal(jax.random.key(4), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(5), (n, n), jnp.bfloat16)
    qa, qb = fp4jax.quantize(a), fp4jax.quantize(b, axis=0, block_2d=True)
    out["gemm_pallas"] = (jax.jit(lambda p, q: kgemm.matmul(
        p, q, preferred_element_type=jnp.bfloat16)), (qa, qb))
    out["gemm_xla"] = (jax.jit(lambda p, q: fp4jax.matmul(
        p, q, preferred_element_type=jnp.bfloat16, impl="xla")), (qa, qb))
    out["gemm_bf16"] = (jax.jit(lambda p, q: jnp.dot(
        p, q, preferred_element_type=jnp.bfloat16)), (a, b))
    out["gemm_skinny"] = (jax.jit(lambda p, q: kgemm.matmul(
        p, q, preferred_element_type=jnp.bfloat16)), (fp4jax.quantize(a[:16]), qb))
    out["gemm_skinny_bf16"] = (jax.jit(lambda p, q: jnp.dot(
        p, q, preferred_element_type=jnp.bfloat16)), (a[:16], b))
    w = (b.astype(jnp.float32) / np.sqrt(n)).astype(jnp.bfloat16)
    ct = jax.random.normal(jax.random.key(6), (n, n), jnp.bfloat16)
    out["layer_bf16"] = (layer_fn(None), (a, w, ct, key))
    out["layer_auto"] = (layer_fn("auto"), (a, w, ct, key))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="all", help="comma-separated case names, or 'all'")
    p.add_argument("--n", type=int, default=8192)
    args = p.parse_args(argv)
    print(environment(), flush=True)
    table = cases(args.n)
    names = list(table) if args.cases == "all" else args.cases.split(",")
    unknown = [c for c in names if c not in table]
    if unknown:
        sys.exit(f"unknown cases {unknown}; known: {list(table)}")
    start, stop = _profiler()
    for name in names:
        fn, fargs = table[name]
        for _ in range(2):
            jax.block_until_ready(fn(*fargs))
        print(f"== case {name}", flush=True)
        start()
        jax.block_until_ready(fn(*fargs))
        stop()


if __name__ == "__main__":
    main()
