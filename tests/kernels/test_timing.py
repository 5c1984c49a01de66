"""`pallas_kernels.timing.time_in_program`: the calls it times are all in one compiled
program (none merged or dropped by XLA), the host's cost of a call is not in its result,
and its result grows with the device work of a call.

GPU (``-m gpu``; skipped without a GPU): on a call long enough for `time_fn` to be right
(a 4096³ BF16 dot), both timers agree.
"""

import time

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import timing

_ON_GPU = jax.devices()[0].platform == "gpu"


def _matmul_sets(n: int, count: int):
    return [(jax.random.normal(jax.random.key(i), (n, n)),
             jax.random.normal(jax.random.key(100 + i), (n, n)) / n) for i in range(count)]


def _dots_compiled(program, sets) -> int:
    return program.lower(sets).compile().as_text().count(" dot(")


def test_program_of_calls_computes_every_call_even_on_repeated_argument_sets():
    """Five calls on two argument sets: five dots in the compiled program and five outputs,
    call i on set i % 2. Without the barriers XLA merges the calls on the same set (the
    control), so the count can fail."""
    sets = _matmul_sets(32, 2)
    program = timing.program_of_calls(lambda a, b: a @ b, 5)
    assert _dots_compiled(program, sets) == 5
    outs = program(sets)
    assert len(outs) == 5
    for i, out in enumerate(outs):
        a, b = sets[i % 2]
        assert jnp.array_equal(out, a @ b)

    def naive(sets):
        return [sets[i % 2][0] @ sets[i % 2][1] for i in range(5)]

    assert _dots_compiled(jax.jit(naive), sets) == 2


def test_program_of_calls_takes_and_returns_pytrees():
    """``fn`` of a dict returning a tuple: every output is the tuple of its own call."""
    sets = [({"x": jnp.full(3, float(i))},) for i in range(2)]
    outs = timing.program_of_calls(lambda d: (d["x"] + 1, d["x"] * 2), 3)(sets)
    assert [float(o[0][0]) for o in outs] == [1.0, 2.0, 1.0]
    assert [float(o[1][0]) for o in outs] == [0.0, 2.0, 0.0]


def test_time_in_program_leaves_out_the_host_cost_of_each_call():
    """A call that sleeps 50 ms on the host: `time_fn`, which calls it from Python, sees
    the sleep; `time_in_program` traces it once and times only the program's work."""
    def slow_on_host(a):
        time.sleep(0.05)
        return a + 1

    sets = [(jnp.full(8, float(i)),) for i in range(2)]
    assert timing.time_fn(slow_on_host, sets, warmup=0, iters=1, reps=1) >= 0.05
    assert timing.time_in_program(slow_on_host, sets, calls_per_program=2, iters=5,
                                  warmup=1) < 0.01


def test_time_in_program_grows_with_the_work_of_a_call():
    """Sixteen chained 256² matmuls per call time more than twice one matmul per call (a
    loose check: sixteen times, up to noise), so the result measures the calls' work."""
    def chain(k):
        def f(a, b):
            for _ in range(k):
                a = jnp.tanh(a @ b)
            return a
        return f

    sets = _matmul_sets(256, 2)
    one, sixteen = (timing.time_in_program(chain(k), sets, calls_per_program=2, iters=5,
                                           warmup=1) for k in (1, 16))
    assert sixteen > 2 * max(one, 0.0) and sixteen > 0


def test_time_in_program_rejects_bad_arguments():
    """No sets, sets of different shapes, or no calls: a ValueError naming the fault."""
    f = lambda a: a + 1  # noqa: E731
    with pytest.raises(ValueError, match="empty"):
        timing.time_in_program(f, [])
    with pytest.raises(ValueError, match="differ"):
        timing.time_in_program(f, [(jnp.ones(2),), (jnp.ones(3),)])
    with pytest.raises(ValueError, match="calls_per_program"):
        timing.time_in_program(f, [(jnp.ones(2),)], calls_per_program=0)
    with pytest.raises(ValueError, match="calls"):
        timing.program_of_calls(f, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a GPU")
def test_gpu_time_in_program_agrees_with_time_fn_on_a_long_call():
    """A 4096³ BF16 dot (~0.2 ms on an H200: dispatch is hidden behind it, so `time_fn` is
    right) on two operand sets, 8 and 16 calls per program: within 30% of `time_fn`. A
    timer that merged the repeated calls would report far less."""
    sets = [(jax.random.normal(jax.random.key(i), (4096, 4096), jnp.bfloat16),
             jax.random.normal(jax.random.key(10 + i), (4096, 4096), jnp.bfloat16))
            for i in range(2)]
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.bfloat16))
    t_fn = timing.time_fn(dot, sets, iters=10)
    t_prog = timing.time_in_program(dot, sets, calls_per_program=8, iters=10)
    assert 0.7 < t_prog / t_fn < 1.3, (t_prog, t_fn)
