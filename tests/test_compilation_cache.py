"""The suite's persistent XLA compilation cache (tests/conftest.py): ordinary tests compile
through it, and a test marked ``fresh_compilation`` (it counts or times compilations)
compiles without it, so that a cached program cannot pass for a compilation."""

import os

import jax
import numpy as np
import pytest


def _cache_lookups(scale: float) -> list[str]:
    """The persistent-cache hits and misses of compiling a program new to this process."""
    events = []

    def on_event(event, **_):
        if event in ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"):
            events.append(event)

    jax.monitoring.register_event_listener(on_event)
    try:
        jax.jit(lambda x: x * scale + 1.0)(np.arange(7.0, dtype=np.float32)).block_until_ready()
    finally:
        jax.monitoring.unregister_event_listener(on_event)
    return events


@pytest.mark.fresh_compilation
def test_a_test_marked_fresh_compilation_compiles_without_the_cache():
    assert _cache_lookups(3.0) == []


def test_other_tests_look_their_programs_up_in_the_cache():
    assert os.environ.get("JAX_COMPILATION_CACHE_DIR")
    assert len(_cache_lookups(5.0)) == 1
