"""Timing helpers shared by the benchmarks: median of warm, device-synchronized runs."""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable, Sequence

import jax


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
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
