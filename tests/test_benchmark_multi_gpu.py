"""benchmarks/multi_gpu.py (the 2-GPU measurement of issue 11) on 2 host CPU devices."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tiny run: one block of width 32 whose MLP down projection (128 x 32, 16 columns
# per device under fsdp=2: whole 16x16 tiles) is the only NVFP4 layer, 3 steps.
ARGS = ["--models", "32:1", "--batch", "4", "--seq", "32", "--steps", "3", "--recipes",
        "nvfp4", "--keep", r".*\.attn\..*", "--keep", r".*\.mlp\.(gate|up)", "--iters", "1",
        "--reps", "1"]


@pytest.mark.slow  # ~19 s on 2 shared cores: four NVFP4 train-step compilations (~3 s each)
def test_multi_gpu_benchmark_measures_every_part_on_2_host_devices(tmp_path):
    """In one subprocess with 2 host devices, ``main`` runs twice on a tiny model:

    * ``--budget-s 0``: every part is skipped (listed, nothing compiled);
    * every part, two programs compiled at once: the JSON has data parallel rows for 1
      and 2 devices (tokens/s, speedup); FSDP rows with the FP4 all-gather (the down
      projection gathered in NVFP4: u8 codes and scales) and without (no u8 gather),
      the FP4 step's all-gathers fewer bytes in total and the NVFP4 layer's >= 3x fewer
      than the float gathers they replace (BF16 basis); loss curves of 3 steps on 1
      device and on 2 (data parallel and both FSDP runs) within 1e-5 relative (the
      same SR keys and global amaxes; only float32 sums reordered); the markdown table
      printed last."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(200):  # enough files for data.load_corpus's 2% validation split
        (src / f"m{i}.py").write_text("".join(chr(c) for c in rng.integers(32, 127, 300)))
    args = [*ARGS, "--data", str(src)]
    none = [*args, "--budget-s", "0", "--out", str(tmp_path / "none.json")]
    full = [*args, "--compile-workers", "2", "--out", str(tmp_path / "all.json")]
    code = f"from benchmarks import multi_gpu\nmulti_gpu.main({none!r})\nmulti_gpu.main({full!r})"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
               XLA_FLAGS="--xla_force_host_platform_device_count=2 "
                         "--xla_backend_optimization_level=0 "
                         "--xla_llvm_disable_expensive_passes=true")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    none = json.loads((tmp_path / "none.json").read_text())
    assert [s.split(": ")[0] for s in none["skipped"]] == ["32:1 dp", "32:1 curve", "32:1 fsdp"]
    assert not (none["dp"] or none["fsdp"] or none["curve"] or none["compiles"])

    r = json.loads((tmp_path / "all.json").read_text())
    assert r["devices"] == 2 and not r["errors"] and not r["skipped"], r["errors"]
    assert all(c["concurrent"] for c in r["compiles"]) and len(r["compiles"]) == 4
    dp = {row["devices"]: row for row in r["dp"]}
    assert set(dp) == {1, 2} and dp[2]["speedup"] > 0 and dp[1]["tokens_per_s"] > 0
    assert dp[2]["bytes_by_op"]["all-reduce"] > 0  # the gradient all-reduce

    fsdp = {row["fp4_gather"]: row for row in r["fsdp"]}
    assert fsdp[True]["fp4_gathered"] == ["blocks.0.mlp.down"] and fsdp[False]["fp4_gathered"] == []
    fp4, plain = fsdp[True]["all_gather"], fsdp[False]["all_gather"]
    assert fp4["nvfp4_bytes"] > 0 and plain["nvfp4_bytes"] == 0
    assert fp4["bytes"] < plain["bytes"]
    (gather,) = r["fsdp_gather"]
    assert gather["nvfp4_layers"]["fp4_gather"] == fp4["nvfp4_bytes"]
    assert gather["nvfp4_layers"]["bf16_gather"] >= 3 * fp4["nvfp4_bytes"], gather

    (curve,) = r["curve"]
    assert set(curve["curves"]) == {"1", "dp", "fsdp_fp4", "fsdp_bf16"}
    assert all(len(c) == 3 and np.all(np.isfinite(c)) for c in curve["curves"].values())
    assert max(curve["max_rel_diff"].values()) <= 1e-5, curve["max_rel_diff"]

    out = proc.stdout
    assert "skipped: 32:1 fsdp: estimated" in out
    table = out[out.rindex("cpu x 2, jax"):]
    assert "command: python benchmarks/multi_gpu.py" in table
    assert "| 32:1 | nvfp4 | 2 | auto (XLA: mesh) |" in table and "| FP4 | 1 |" in table
