"""The timers: medians of warm, device-synchronized runs, and what a report records.

* `time_fn` dispatches calls from Python, back to back: right for calls of a few hundred
  microseconds and more (every kernel's ``main()`` sweep, the scripts in ``benchmarks/``).
* `time_in_program` runs the calls inside one compiled program: right for calls whose
  device time is near or below the host's dispatch time per call (tens of microseconds:
  skinny GEMMs, layers 2048 wide, small quantizations), which `time_fn` would report
  as the dispatch time.

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


L2_DEFEAT_BYTES = 192 * 2**20
"""Bytes of distinct operands a timer should rotate through: four times the H200's 50 MB L2,
so that no call finds its operands left in L2 by an earlier one."""


def sets_to_defeat_l2(bytes_per_set: int, *, minimum: int = 2, maximum: int = 64) -> int:
    """How many distinct argument sets of ``bytes_per_set`` bytes `L2_DEFEAT_BYTES` takes,
    within ``[minimum, maximum]``.

    The cap bounds the set-up time and the arguments of a timed program: sets so small
    that ``maximum`` of them fit in L2 belong to calls bound by latency, not bandwidth.

    Example:
      >>> sets_to_defeat_l2(32 * 2**20), sets_to_defeat_l2(2**30), sets_to_defeat_l2(2**10)
      (6, 2, 64)
    """
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, got {bytes_per_set}")
    return min(maximum, max(minimum, -(-L2_DEFEAT_BYTES // bytes_per_set)))


def program_of_calls(fn: Callable, calls: int) -> Callable:
    """One jitted program making ``calls`` calls of ``fn``, each on its own argument set.

    The program takes a list of argument tuples ``sets`` and returns the list of the
    ``calls`` outputs of ``fn(*sets[i % len(sets)])``, ``i = 0, 1, ...``. Every output is
    returned, so XLA can drop no call. ``fn`` is jitted once and called ``calls`` times,
    so it is traced and lowered once.

    Each call's arguments pass through an optimization barrier together with the
    previous call's output. The barrier computes nothing; it makes call ``i`` wait for
    call ``i - 1`` (as layers do in a model) and makes every call's operands distinct
    values in XLA's graph. Without it, two calls on the same argument set (``calls >
    len(sets)``) are one common subexpression, which XLA computes once, and independent
    small calls may be fused into one kernel (horizontal fusion), either of which would
    time less work than was asked for (calls on distinct sets are distinct parameters,
    never merged). XLA:GPU keeps the barriers through fusion and scheduling and runs the
    program's kernels on one stream, one after another. XLA:CPU removes them right after
    its common-subexpression pass, so there no call is merged either but calls may
    overlap: CPU times are a smoke run only.

    Example:
      >>> import jax.numpy as jnp
      >>> program = program_of_calls(lambda a, b: a @ b, 3)
      >>> outs = program([(jnp.ones((2, 2)), jnp.eye(2)), (jnp.eye(2), jnp.eye(2))])
      >>> [float(o.sum()) for o in outs]
      [4.0, 2.0, 4.0]
    """
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    call = jax.jit(fn)

    def program(sets):
        outs, previous = [], None
        for i in range(calls):
            args = tuple(sets[i % len(sets)])
            if previous is not None:
                args, _ = jax.lax.optimization_barrier((args, previous))
            previous = call(*args)
            outs.append(previous)
        return outs

    return jax.jit(program)


def time_in_program(fn: Callable, args_sets: Sequence[tuple], *, calls_per_program: int = 16,
                    iters: int = 10, warmup: int = 2) -> float:
    """Device time (seconds) per call of ``fn(*args)``, the calls made inside one program.

    Two programs of `program_of_calls` are compiled, one making ``N =
    calls_per_program`` calls and one ``2N``; each of ``iters`` samples runs both (one
    after the other, so drift affects both alike), each run timed from dispatch to
    ``block_until_ready``. The result is the slope ``median(t(2N) - t(N)) / N``: the
    fixed cost of a run (dispatching the program and its arguments, launching,
    synchronizing) is in both times and cancels, so only the device time of ``N`` calls
    remains, however small the calls. It is the time of a call among other calls of
    one program, as in a training step (XLA:GPU may run the program as CUDA graphs,
    which it does for a whole step too). ``N`` only divides the noise of the two runs'
    difference (a few microseconds on a GPU); a result below it (calls of well under a
    microsecond on a GPU, tiny ones on a loaded CPU) can come out zero or negative.

    ``args_sets`` are rotated: call ``i`` of the whole run (across programs and
    samples) uses set ``i % len(args_sets)``, so with enough sets
    (`sets_to_defeat_l2`) no call finds its operands in L2. Every set is an argument
    of both programs. Memory: the ``2N`` outputs of a run live until it ends.

    Args:
      fn: a function of arrays (pytrees such as `NVFP4Array` included) returning a pytree
        of arrays; jitted here.
      args_sets: argument tuples, at least one.
      calls_per_program: ``N`` (at least 1).
      iters: timed samples (at least 1).
      warmup: untimed runs of each program after compiling it.

    Example:
      >>> import jax.numpy as jnp
      >>> sets = [(jnp.full((64, 64), i, jnp.float32),) for i in range(2)]
      >>> t = time_in_program(lambda a: a @ a, sets, calls_per_program=2, iters=2,
      ...                     warmup=1)
      >>> isinstance(t, float)
      True
    """
    if not args_sets:
        raise ValueError("args_sets is empty: time_in_program needs at least one argument set")
    if calls_per_program < 1 or iters < 1 or warmup < 0:
        raise ValueError(f"need calls_per_program >= 1, iters >= 1, warmup >= 0; got "
                         f"{calls_per_program}, {iters}, {warmup}")
    sets = [tuple(s) for s in args_sets]
    kinds = {str(jax.tree.map(lambda a: jax.typeof(a).str_short(), s)) for s in sets}
    if len(kinds) > 1:
        raise ValueError(f"args_sets differ in structure, shape or dtype: {sorted(kinds)}")
    n = calls_per_program
    programs = [program_of_calls(fn, c).lower(sets).compile() for c in (n, 2 * n)]
    start = 0

    def run(calls: int) -> float:
        """One run of the program of ``calls`` calls, continuing the rotation."""
        nonlocal start
        r = start % len(sets)
        rotated = sets[r:] + sets[:r]
        start += calls
        t0 = time.perf_counter()
        jax.block_until_ready(programs[calls // n - 1](rotated))
        return time.perf_counter() - t0

    for _ in range(warmup):
        run(n)
        run(2 * n)
    slopes = []
    for _ in range(iters):
        t_n = run(n)
        slopes.append((run(2 * n) - t_n) / n)
    return statistics.median(slopes)


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
