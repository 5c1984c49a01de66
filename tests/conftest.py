"""Test-runner configuration: hypothesis profiles for the property-based tests.

* ``ci`` (default): derandomized (the same examples on every run and machine), a small
  fixed example budget, no deadline (the first example of a shape pays for XLA
  compilation) and no example database.
* ``dev``: many more random examples, with the local example database
  (``.hypothesis/``) replaying earlier failures first.

Select with ``HYPOTHESIS_PROFILE=dev pytest tests/test_properties.py`` (or hypothesis'
own ``--hypothesis-profile=dev``). This is test-runner configuration, not library
configuration: fp4jax itself reads no environment variables.

On a CPU-only install (CI: no CUDA plugin), XLA's LLVM backend runs at optimization level
0 without its expensive passes: compilation dominates the CPU suite and takes about a third
less time. It changes no result: XLA:CPU uses no fast-math at any level, the optimized HLO
(what tests/test_compile_size.py measures) is the same text, and every program a test
compares is compiled the same way. The subprocess tests inherit the flags. On a GPU
machine the flags are left alone (they would also slow the GPU kernels' codegen).

A run's processes (the pytest workers and the subprocesses tests start) share one
persistent XLA compilation cache in a fresh temporary folder, removed when the run ends:
many tests compile the same programs (the same layer, recipe and shapes), and a program
served from the cache is the one compiled, so no result changes. A test that counts or
times compilations is marked ``fresh_compilation`` and runs with the cache off. A run
given ``JAX_COMPILATION_CACHE_DIR`` uses that folder and keeps it.
"""

import atexit
import importlib.util
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

_FAST_CPU_COMPILE = ("--xla_backend_optimization_level=0",
                     "--xla_llvm_disable_expensive_passes=true")

if not any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin")):
    # Before any test module initializes a JAX backend (this conftest loads first).
    _flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = " ".join(
        [_flags, *(f for f in _FAST_CPU_COMPILE if f.split("=")[0] not in _flags)]).strip()

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # Set in the first process (the xdist controller, before it starts its workers, or a
    # plain run), which the workers and the tests' subprocesses inherit; JAX reads these
    # when it is imported. Every compilation is cached, however short.
    _cache_dir = tempfile.mkdtemp(prefix="fp4jax-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_cache_dir,
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


@pytest.fixture(autouse=True)
def _fresh_compilation(request):
    """Turns the persistent compilation cache off for a test marked ``fresh_compilation``
    (it counts or times compilations, which the cache would serve instead)."""
    if request.node.get_closest_marker("fresh_compilation") is None:
        yield
        return
    import jax  # noqa: PLC0415
    from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415

    # JAX decides once per process whether it uses the cache: reset it both ways.
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()


settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=6,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The longest tests (mostly subprocesses on 8 host devices, and whole documents), slowest
# first. They run first so that, with `--dist worksteal` (Makefile), the other worker
# takes the many short tests meanwhile and no long test is left to run alone at the end.
# Only the order changes; a name that no longer matches is ignored.
_RUN_FIRST = (
    "tests/test_train_mesh.py::test_sharded_training_checkpoints_and_example_on_8_devices",
    "tests/test_sharding.py::test_sharded_quantize_and_gemms_equal_unsharded",
    "tests/test_readme.py::test_readme_python_blocks_run",
    "tests/test_testing_docs.py::test_testing_docs_python_blocks_run",
    "tests/test_sharding.py::test_fp4_all_gather_moves_4x_fewer_bytes_and_changes_no_bit",
    "tests/test_properties.py::test_dot_general_fwd_bwd_conform_to_recipe",
    "tests/test_examples.py::test_tiny_study_runs_end_to_end_and_nvfp4_really_quantizes",
    "tests/test_study.py::test_resume_through_a_handoff_is_bitwise_the_straight_run",
    "tests/test_benchmark_multi_gpu.py::",
    "tests/kernels/test_gemm.py::test_interpret_matches_reference",
    "tests/kernels/test_gemm_skinny.py::test_interpret_matches_reference",
    "tests/test_quantize.py::test_op_by_op_equals_jit",
)


def pytest_collection_modifyitems(items):
    def rank(item):
        return next((i for i, p in enumerate(_RUN_FIRST) if item.nodeid.startswith(p)),
                    len(_RUN_FIRST))

    items.sort(key=rank)  # stable: the rest keep pytest's order
