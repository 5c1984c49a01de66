"""Helpers shared by the kernel tests: bitwise NVFP4Array comparison, test data (also the
GEMM operands of the three training layouts), the interpret-mode worker subprocess and
the interpret-mode GEMM against the reference."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

ON_GPU = jax.devices()[0].platform == "gpu"


def bits(a):
    """The raw bits of an array (uint8 or uint32 view)."""
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


def _mismatch(a, b) -> str:
    a, b = bits(a), bits(b)
    bad = np.argwhere(a != b)
    return f"{len(bad)} of {a.size} differ, first at {bad[:4].tolist()}"


def assert_same(q, r, what: str = ""):
    """Asserts two NVFP4Arrays have the same metadata and the same bits."""
    assert (q.shape, q.axis, q.block_2d, q.hadamard, jnp.dtype(q.dtype)) == (
        r.shape, r.axis, r.block_2d, r.hadamard, jnp.dtype(r.dtype)), what
    assert q.data.shape == r.data.shape and q.scales.shape == r.scales.shape, what
    for name in ("data", "scales", "amax"):
        a, b = getattr(q, name), getattr(r, name)
        assert np.array_equal(bits(a), bits(b)), f"{name} {what}: {_mismatch(a, b)}"


def data(shape, dtype=jnp.bfloat16, seed=0):
    """Wide dynamic range, zeros, -0, tiny values and a whole zero block."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(k1, shape, jnp.float32) * jnp.exp2(
        jax.random.uniform(k2, shape, minval=-10, maxval=10))
    x = x.astype(dtype)
    flat = x.reshape(-1, shape[-1])
    flat = flat.at[0, :16].set(0).at[1, 3].set(-0.0).at[2, 5].set(1e-30).at[3, 16:32].multiply(1e-5)
    return flat.reshape(shape)


def normal_data(shape, seed):
    """Standard normal float32 values."""
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def exact_grid_data(shape, seed):
    """E2M1-grid values with a ±6 in every 16-block along both axes: every block scale
    is 448, the codes are the values, and (for K ≤ 512) every float32 sum is exact."""
    grid = jnp.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], jnp.float32)
    k1, k2 = jax.random.split(jax.random.key(seed))
    x = grid[jax.random.randint(k1, shape, 0, 8)] * jnp.where(
        jax.random.bernoulli(k2, 0.5, shape), -1.0, 1.0)
    return x.at[..., :, ::16].set(6.0).at[..., ::16, :].set(-6.0)


def layout_operands(layout, m, n, k, *, exact=False, seed=0):
    """(lhs, rhs, kwargs) of the ``layout`` GEMM (`pallas_kernels.gemm_data.layout_operands`)
    from `exact_grid_data` or `normal_data`, quantized by the reference."""
    from fp4jax.reference.quantization import quantize  # noqa: PLC0415 - test data only
    from pallas_kernels.gemm_data import layout_operands as operands  # noqa: PLC0415

    data = exact_grid_data if exact else normal_data
    return operands(quantize, layout, m, n, k, seed=seed, data=data)


def abstract_layout_operands(layout, m, n, k):
    """Like `layout_operands`, as shapes only (for tests that only trace)."""
    lhs, rhs = jax.eval_shape(lambda: layout_operands(layout, m, n, k)[:2])
    return lhs, rhs, ({"lhs_from_mT": True} if layout == "wgrad" else {})


def poison_allocator(nbytes: int):
    """Fills and frees device memory with a sentinel so fresh outputs start as garbage.

    Output buffers of the next call are typically carved from the freed block, so any
    element the kernel fails to write shows up as 0xA5 bytes (best effort).
    """
    junk = jnp.full((nbytes,), 0xA5, jnp.uint8)
    junk.block_until_ready()
    del junk


def nan_poison_allocator(nbytes: int):
    """Fills and frees a NaN buffer of ``nbytes`` so a fresh float output likely reuses it
    (elements a GEMM kernel fails to write then show as NaN)."""
    junk = jnp.full((max(nbytes // 4, 1),), jnp.nan, jnp.float32)
    junk.block_until_ready()
    junk.delete()


def on_cpu(fn, *args):
    """``jit(fn)(*args)`` on the CPU (the reference's bits on the host)."""
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        return jax.jit(fn)(*jax.device_put(args, cpu))


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.cache
def interpret_worker_results(test_file: str) -> dict:
    """Runs ``python test_file --interpret-worker`` on the CPU (8 host devices) and returns
    the JSON its last line prints: a test module's interpret-mode cases in one process,
    away from the pytest process's JAX configuration (once per file: cached)."""
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path,
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
               + " --xla_force_host_platform_device_count=8")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(test_file), "--interpret-worker"],
        cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare_outputs(got, want) -> dict:
    """How a GEMM result ``got`` compares with ``want`` (JSON-able: the interpret-mode
    workers print it): shapes equal, all finite, relative error (norm and worst
    element) and whether the float32 bits are equal."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return {
        "shape_ok": got.shape == want.shape,
        "finite": bool(np.isfinite(got).all()),
        "rel": float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)),
        "max_rel_elem": float(np.max(np.abs(got - want) / (np.abs(want) + 1e-3))),
        "bitwise": bool(np.array_equal(got.view(np.uint32), want.view(np.uint32))),
    }


def interpreted_gemm_vs_reference(lhs, rhs, dtype, cfg, **kw) -> dict:
    """`compare_outputs` of `pallas_kernels.gemm.matmul` in Mosaic GPU interpret mode
    (``config=cfg``, ``kw``) against the reference GEMM, both with
    ``preferred_element_type=dtype``."""
    from fp4jax.reference.gemm import matmul as ref_matmul  # noqa: PLC0415 - GEMM tests only
    from pallas_kernels import gemm  # noqa: PLC0415

    got = gemm.matmul(lhs, rhs, preferred_element_type=dtype, config=cfg, interpret=True, **kw)
    return compare_outputs(got, ref_matmul(lhs, rhs, preferred_element_type=dtype))


def worker_main(cases, run_case) -> None:
    """A test module's ``__main__``: ``--interpret-worker`` prints `run_case` of every case
    as one JSON line (what `interpret_worker_results` reads); ``--time-worker`` prints
    each case's time."""
    if "--interpret-worker" in sys.argv:
        print(json.dumps({name: run_case(name) for name in cases}))
    elif "--time-worker" in sys.argv:
        import time  # noqa: PLC0415

        for name in cases:
            t = time.time()
            r = run_case(name)
            print(name, f"{time.time() - t:.1f}s", r, flush=True)
