"""`make demo`: BF16 vs NVFP4 on a small Llama trained on this interpreter's Python sources.

A few minutes on a 2-core CPU (a tiny model, float32 compute because XLA's CPU BF16
matmuls are slow; quantized GEMMs still use NVFP4 operands exactly as on a GPU);
a larger model on a GPU. Prints the comparison table. Any ``compare.py`` flag
overrides the preset, e.g. ``python examples/demo.py --steps 50``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare  # noqa: E402
import jax  # noqa: E402

CPU_PRESET = dict(dim=128, layers=2, heads=2, batch=8, seq=128, steps=150,
                  time_budget_s=0, evals=3, eval_batches=8, log_every=25)
"""~26 s of compilation, ~0.16 s (BF16) and ~0.55 s (NVFP4) per step on 2 cores."""

GPU_PRESET = dict(dim=256, layers=4, heads=4, batch=32, seq=256, steps=1000,
                  time_budget_s=240, evals=4, eval_batches=16, log_every=50)


def main(argv: list[str] | None = None) -> dict:
    cpu = jax.default_backend() == "cpu"
    preset = CPU_PRESET if cpu else GPU_PRESET
    what = ("the CPU preset: a tiny model computing in float32, so the baseline is float32, "
            "not BF16" if cpu else "the GPU preset: BF16 compute")
    print(f"fp4jax demo on {jax.default_backend()}: {what}; compare.py flags override it "
          "(e.g. --steps 50)", flush=True)
    return compare.main(argv, defaults=preset)


if __name__ == "__main__":
    main()
