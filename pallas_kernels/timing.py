"""The one timer: median of warm, device-synchronized runs, and what a report records.

Used by every kernel's ``main()`` sweep and by the scripts in ``benchmarks/``.

Example:
  >>> import jax.numpy as jnp
  >>> t = time_fn(lambda a: a + 1, [(jnp.ones(4),)], warmup=1, iters=2, reps=2)
  >>> t > 0
  True
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def time_fn(fn: Callable, args_sets: Sequence[tuple], *, warmup: int = 3, iters: int = 20,
            reps: int = 10) -> float:
    """Median time (seconds) per call of ``fn(*args)`` on the device.

    Each of ``iters`` samples dispatches ``reps`` calls back to back and synchronizes
    once on the last output, so host dispatch overlaps device work and sub-millisecond
    kernels are not inflated by launch latency. ``args_sets`` are rotated between
    calls so repeated calls do not just hit L2.
    """
    for i in range(warmup):
        jax.block_until_ready(fn(*args_sets[i % len(args_sets)]))
    times = []
    for i in range(iters):
        t0 = time.perf_counter()
        for r in range(reps):
            out = fn(*args_sets[(i * reps + r) % len(args_sets)])
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def environment() -> dict:
    """Device, JAX version and date, recorded beside every number."""
    d = jax.devices()[0]
    return {
        "device": getattr(d, "device_kind", str(d)),
        "platform": d.platform,
        "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def copy_seconds(x: jax.Array, **kw) -> float:
    """`time_fn` of an XLA elementwise ``x + 1``: the HBM copy baseline (read + write ``x``)."""
    copy = jax.jit(lambda a: a + jnp.asarray(1, a.dtype))
    return time_fn(copy, [(x,)], **kw)


def nbytes(tree: Any) -> int:
    """Bytes held by the arrays of a pytree (what a kernel reads or writes)."""
    return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(tree))


def bits_equal(a: Any, b: Any) -> bool:
    """Whether two NVFP4 arrays hold the same bits in ``data``, ``scales`` and ``amax``."""

    def u(x):
        x = np.asarray(x)
        return x.view(np.uint8) if x.dtype.itemsize == 1 else x.view(np.uint32)

    return all(np.array_equal(u(x), u(y)) for x, y in
               ((a.data, b.data), (a.scales, b.scales), (a.amax, b.amax)))


def sweep_input(m: int, k: int) -> jax.Array:
    """An (m, k) bfloat16 tensor of normal values spread over 16 binades (never zeros)."""
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    spread = jnp.exp2(jax.random.uniform(jax.random.key(1), (m, k), minval=-8, maxval=8))
    return (x * spread).astype(jnp.bfloat16)


class Sweep:
    """A kernel file's ``main()`` table: each row a variant's time and GB/s on ``x``.

    The first row is the HBM copy bandwidth measured in the same run.
    """

    def __init__(self, x: jax.Array, *, reps: int, interpret: bool):
        self.x, self.reps = x, reps
        self.inner = 1 if interpret else 20
        self.in_bytes = x.size * x.dtype.itemsize
        self.rows: list[dict] = []
        t_copy = copy_seconds(x, warmup=2, iters=reps, reps=20)
        copy_gbs = 2 * self.in_bytes / t_copy / 1e9
        dev = jax.devices()[0]
        print(f"device: {dev.device_kind}  jax {jax.__version__}  shape "
              f"{'x'.join(map(str, x.shape))} {x.dtype}")
        print(f"{'HBM copy (XLA x+1, read+write)':58s} {t_copy * 1e6:9.1f} us {copy_gbs:8.1f} GB/s")
        self.rows.append({"name": "copy", "us": t_copy * 1e6, "gbs": copy_gbs})
        self.copy_gbs = copy_gbs

    def add(self, name: str, fn: Callable, out_bytes: int, check: Callable | None = None,
            *args) -> None:
        """Times ``fn(*args)`` (default ``fn(x)``); ``check()`` reports bit-exactness."""
        t = time_fn(fn, [args or (self.x,)], warmup=2, iters=self.reps, reps=self.inner)
        gbs = (self.in_bytes + out_bytes) / t / 1e9
        row = {"name": name, "us": t * 1e6, "gbs": gbs}
        if check is not None:
            row["bit_exact"] = check()
        self.rows.append(row)
        print(f"{name:58s} {t * 1e6:9.1f} us {gbs:8.1f} GB/s"
              + (f"  bit-exact={row['bit_exact']}" if check is not None else ""), flush=True)

    def finish(self) -> list[dict]:
        """Adds each row's fraction of the copy bandwidth, prints it, returns the rows."""
        print("\nfraction of copy bandwidth:")
        for r in self.rows:
            r["frac_of_copy"] = r["gbs"] / self.copy_gbs
            print(f"  {r['name']:58s} {r['frac_of_copy']:6.2f}")
        return self.rows
