"""The suite's fast XLA:CPU compile flags (tests/conftest.py) change no bit of the numerics.

On a CPU-only install the suite compiles at LLVM optimization level 0 without the
expensive passes, while users' programs compile at XLA's default level, where LLVM may
also contract a multiply and an add into one fused operation (XLA:CPU allows FMA
fusion). A rounding step that depends on such a contraction would pass the suite and
differ for users. This test runs the same quantizations and quantized GEMMs (every
rounding path: 1D and 2D blocks, the RHT, stochastic rounding, 4/6 scaling, the three
GEMMs of the full recipe's forward and backward) in a fresh interpreter at XLA's
default optimization and compares their bits with this process's.
"""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

_PROGRAMS = textwrap.dedent("""
    import hashlib
    import jax, jax.numpy as jnp, numpy as np
    import fp4jax

    def digest():
        k = jax.random.key(7)
        x = (jax.random.normal(k, (256, 512), jnp.float32)
             * jnp.exp(jax.random.normal(jax.random.key(8), (256, 1)) * 3)).astype(jnp.bfloat16)
        w = jax.random.normal(jax.random.key(9), (512, 384), jnp.bfloat16)
        ct = jax.random.normal(jax.random.key(10), (256, 384), jnp.bfloat16)
        sk = jax.random.key(11)
        outs = [
            fp4jax.quantize(x),
            fp4jax.quantize(x, block_2d=True),
            fp4jax.quantize(x, axis=0, hadamard=True, rounding="stochastic", key=sk),
            fp4jax.quantize(x, rounding="stochastic", key=sk),
            fp4jax.quantize(x, scale_rule="four_over_six"),
        ]
        leaves = [l for q in outs for l in (q.data, q.scales, q.amax)]
        leaves += [fp4jax.dequantize(q, jnp.float32) for q in outs]
        lin = (((1,), (0,)), ((), ()))
        y, vjp = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, lin, key=sk), x, w)
        leaves += [y, *vjp(ct)]
        h = hashlib.sha256()
        for l in leaves:
            h.update(np.ascontiguousarray(np.asarray(jax.device_get(l))).tobytes())
        return h.hexdigest()
""")


@pytest.mark.skipif(jax.devices()[0].platform != "cpu", reason="the flags are CPU-only")
def test_fast_cpu_compile_flags_change_no_bit():
    """Same digest of every quantization/GEMM output at O0 (this process, under the
    suite's flags) and at XLA's default optimization (a fresh interpreter without them)."""
    if "--xla_backend_optimization_level=0" not in os.environ.get("XLA_FLAGS", ""):
        pytest.skip("this process compiles at XLA's default optimization: nothing to compare")
    namespace = {}
    exec(_PROGRAMS, namespace)  # noqa: S102 - the same source both sides
    here = namespace["digest"]()
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                     if not f.startswith(("--xla_backend_optimization_level",
                                          "--xla_llvm_disable_expensive_passes")))
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", _PROGRAMS + "\nprint(digest())"], env=env,
                         capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == here
