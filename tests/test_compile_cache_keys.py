"""What JAX's persistent compilation cache keys on stays the same from process to process
for an NVFP4 layer on the Pallas kernels, so a later device call on the same machine can
load the study's compiled steps (`benchmarks/gpu_studies_call.sh`).

Each Mosaic GPU kernel's serialized module carries a name with a process-wide counter
(docs/BENCHMARKS.md, "Compilation caching of Pallas Mosaic GPU kernels"): a second trace
in one process lowers to another program, but a fresh process that traces in the same
order lowers to the same one. Both are checked here by lowering for CUDA on the host (no
GPU needed).
"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LOWER_ONE_LAYER = """
import hashlib
import jax
from fp4jax import implementation
from tests.test_compile_size import layer_text_for_cuda
implementation.gpu_capability = lambda: (9, 0)  # an H200: the kernels' path
first = layer_text_for_cuda("pallas", (256, 128), (128, 256))
jax.clear_caches()
second = layer_text_for_cuda("pallas", (256, 128), (128, 256))
assert "mosaic_gpu" in first
print(hashlib.sha256(first.encode()).hexdigest(), hashlib.sha256(second.encode()).hexdigest())
"""


def _hashes() -> tuple[str, str]:
    """(first trace, second trace) hashes of the layer's CUDA program in a fresh process."""
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _LOWER_ONE_LAYER], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True)
    first, second = out.stdout.split()
    return first, second


def test_a_fresh_process_lowers_an_nvfp4_layer_to_the_same_program():
    """Two fresh processes lower one NVFP4 layer's forward and backward through the
    kernels to the same StableHLO (the same persistent-cache key), while a second trace
    within one process differs (why seeds of a variant share one compiled step instead:
    `train_llama.Trainer.for_run`)."""
    a_first, a_second = _hashes()
    b_first, b_second = _hashes()
    assert a_first == b_first and a_second == b_second
    assert a_first != a_second
