"""benchmarks/train_step.py reports which layers are NVFP4 and where each of their GEMMs runs."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import train_llama  # noqa: E402
from llama import LlamaConfig  # noqa: E402

from benchmarks import train_step  # noqa: E402
from fp4jax import implementation  # noqa: E402


def test_auto_gemm_backends_lists_the_three_gemms_of_every_quantized_layer_and_no_other():
    """Every NVFP4 layer contributes fprop, dgrad and wgrad in gemm_auto_table's (M, N, K)
    convention; the BF16 LM head contributes none; ``sm90`` is the measured table's verdict
    and ``here`` what this device runs."""
    cfg = LlamaConfig(dim=64, layers=2, heads=2, dtype="float32")  # hidden 192
    trainer = train_llama.Trainer(cfg, train_step.run_config("nvfp4", batch=2, seq=64), 1)
    tokens = 128
    rows = train_step.auto_gemm_backends(trainer, tokens)
    assert "lm_head" not in trainer.report.quantized
    assert sum(r["gemms"] for r in rows) == 3 * len(trainer.report.quantized) == 3 * 14
    shapes = {(r["layout"], r["m"], r["n"], r["k"]): r["gemms"] for r in rows}
    assert shapes[("fprop", tokens, 64, 64)] == 8  # q, k, v, o of two blocks
    assert shapes[("dgrad", tokens, 192, 64)] == 2  # down (192 -> 64): dY (tokens, 64) @ W^T
    assert shapes[("wgrad", 64, 192, tokens)] == 4  # gate, up: X^T (64, tokens) @ dY
    for r in rows:
        verdict = implementation.auto_prefers_gemm_kernel(r["m"], r["n"], r["k"], r["layout"])
        assert r["sm90"] in (("pallas", "xla") if verdict else ("xla",))  # xla: no kernel fits
        if implementation.gpu_capability() is None:
            assert r["here"] == "xla"
    text = train_step.describe_nvfp4(trainer, rows)
    assert "14 of 15 matmul layers quantized" in text and "| wgrad | 64 | 192 | 128 |" in text
    bf16 = train_llama.Trainer(cfg, train_step.run_config("bf16", batch=2, seq=64), 1)
    assert train_step.auto_gemm_backends(bf16, tokens) == []
