"""The programs XLA compiles for one quantization and one quantized GEMM stay small.

Compile time grows with the program: the NVFP4 train step of examples/compare.py
compiled 8–11× slower than BF16 because every quantization and GEMM carried hundreds
of scalar integer operations that XLA then duplicated into many fusions
(docs/BENCHMARKS.md, "Compile time"). These tests bound the sizes measured with
`benchmarks.compile_time` (the unoptimized program with calls inlined, which XLA's
passes work on, and the optimized one with its fusions) at small shapes, where the
sizes do not depend on the shape. Each bound is the size measured after the
reformulation (2026-11-30, CPU) plus ~25% headroom; the sizes before it are given
beside each bound, so each test fails for that formulation.
"""

import re

import jax
import jax.numpy as jnp

import fp4jax
from benchmarks.compile_time import fusion_sizes, hlo_stats, inlined_size, mosaic_kernels

_LINEAR = (((1,), (0,)), ((), ()))


def _sizes(fn, *args):
    lowered = jax.jit(fn).lower(*args)
    return inlined_size(lowered.as_text(dialect="hlo")), hlo_stats(lowered.compile().as_text())


def test_quantize_program_is_small():
    """``jit(fp4jax.quantize)``, 1D RNE and columnwise RHT + SR: no divide instruction
    (XLA starts a fusion at each one), and bounded sizes. Before: 944 / 1144
    instructions unoptimized, 1607 / 1763 optimized with 31 divides; after: 582 / 771
    and 558 / 698."""
    x = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)
    cases = {
        "1d_rne": (lambda x: fp4jax.quantize(x).data, (x,), 730, 700),
        "rht_sr": (lambda x, k: fp4jax.quantize(x, axis=0, hadamard=True, rounding="stochastic",
                                                key=k).data,
                   (x, jax.random.key(0)), 1000, 880),
    }
    for name, (fn, args, max_before, max_after) in cases.items():
        before, after = _sizes(fn, *args)
        assert after["divides"] == 0, (name, after)
        assert before <= max_before, (name, before)
        assert after["instructions"] <= max_after, (name, after)


def test_dot_general_forward_and_backward_program_is_small():
    """One `fp4jax.dot_general`'s forward and VJP (`Recipe.nvfp4`: five quantizations,
    three GEMMs). Before: 8634 instructions unoptimized, 12576 optimized in 188
    fusions; after: 4749, 4921 and 72."""

    def fwd_bwd(x, w, ct, key):
        y, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, _LINEAR, key=key), x, w)
        return y, *vjp(ct)

    args = (jax.ShapeDtypeStruct((64, 128), jnp.bfloat16),
            jax.ShapeDtypeStruct((128, 64), jnp.bfloat16),
            jax.ShapeDtypeStruct((64, 64), jnp.bfloat16), jax.random.key(0))
    before, after = _sizes(fwd_bwd, *args)
    assert before <= 6000, before
    assert after["instructions"] <= 6200, after
    assert after["fusions"] <= 90, after


def test_gemm_output_scale_is_not_recomputed_per_element():
    """The emulated GEMM multiplies its accumulator by ``fl(gds_lhs · gds_rhs)``, two
    integer divisions per operand: computed once, the pass over the (512, 512) output
    is a handful of instructions. Fused into it, as XLA did before the factor went
    behind an optimization barrier: ~250 instructions per output element."""
    fn = lambda x, w: fp4jax.matmul(fp4jax.quantize(x), fp4jax.quantize(w, axis=0))  # noqa: E731
    compiled = jax.jit(fn).lower(jax.ShapeDtypeStruct((512, 256), jnp.bfloat16),
                                 jax.ShapeDtypeStruct((256, 512), jnp.bfloat16)).compile()
    over_output = [n for elements, n in fusion_sizes(compiled.as_text())
                   if elements == 512 * 512]
    assert over_output and max(over_output) <= 16, over_output


def layer_text_for_cuda(impl: str, x_shape, w_shape) -> str:
    """One BF16 linear layer's fwd+bwd through `fp4jax.dot_general` with ``impl``,
    lowered for CUDA on the host (StableHLO text); `test_compile_cache_keys` lowers it in
    fresh processes."""
    def fwd_bwd(x, w, key):
        y, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(x, w, _LINEAR, key=key, impl=impl),
                         x, w)
        return vjp(jnp.ones_like(y))

    return jax.jit(fwd_bwd).trace(
        jax.ShapeDtypeStruct(x_shape, jnp.bfloat16), jax.ShapeDtypeStruct(w_shape, jnp.bfloat16),
        jax.random.key(0)).lower(lowering_platforms=("cuda",)).as_text()


def test_kernel_path_layer_leaves_xla_no_division(monkeypatch):
    """One linear layer's fwd+bwd through the Pallas kernels, lowered for CUDA on the host
    (no GPU needed): the global scales and the GEMM output factors come from tiny kernels
    (`pallas_kernels.scale_kernels`), so the layer's XLA program holds no correctly rounded
    division (no ``count_leading_zeros``, which each one uses) and about 470 StableHLO
    operations. With that scale math in XLA: 2624 (3729 with each division separate)."""
    from fp4jax import implementation

    monkeypatch.setattr(implementation, "gpu_capability", lambda: (9, 0))  # an H200
    text = layer_text_for_cuda("pallas", (4096, 768), (768, 2048))
    assert "count_leading_zeros" not in text
    ops = len(re.findall(r"= (?:\"?)stablehlo\.", text))
    assert ops <= 600, ops


def test_each_mosaic_kernel_of_a_step_is_lowered_once(monkeypatch):
    """Two stacked square NVFP4 linear layers, forward and backward, every quantization
    through the Pallas kernels as ``impl="auto"`` picks them on an H200 (the GEMMs kept in
    XLA), lowered for CUDA on the host: each distinct Mosaic GPU kernel is traced and
    lowered once, however many layers, passes and launches use it. A lowering makes a
    serialized kernel module of its own (its hash in the custom call), so distinct hashes
    count lowerings: 6, one per kernel (the amax pass of X and dY, which have one shape;
    the two-output quantize, round-to-nearest and stochastic; the weight's 16×16 quantize;
    the scale parameters, one kernel for one and two outputs; the output scales, one
    kernel for one and two GEMMs). The weight's amax is reduced by XLA
    (`pallas_kernels.amax.plain_amax`: a small unrotated input). Before: 9 (the weight's
    amax pass, and the scale kernels of one and of two outputs or GEMMs apart); before
    the amax pass and the scale kernels were jitted per launch: 11."""
    from fp4jax import implementation

    monkeypatch.setattr(implementation, "gpu_capability", lambda: (9, 0))  # an H200
    monkeypatch.setattr(implementation, "auto_prefers_gemm_kernel", lambda *_: False)

    def fwd_bwd(x, w1, w2, key):
        def two_layers(x, w1, w2):
            h = fp4jax.dot_general(x, w1, _LINEAR, key=jax.random.fold_in(key, 1), impl="auto")
            return fp4jax.dot_general(h, w2, _LINEAR, key=jax.random.fold_in(key, 2), impl="auto")

        y, vjp = jax.vjp(two_layers, x, w1, w2)
        return vjp(jnp.ones_like(y))

    square = jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)
    jax.clear_caches()  # no kernel traced by an earlier test (the count is of this trace)
    try:
        text = jax.jit(fwd_bwd).trace(square, square, square, jax.random.key(0)).lower(
            lowering_platforms=("cuda",)).as_text()
    finally:
        jax.clear_caches()
    calls, lowered = mosaic_kernels(text)
    assert calls >= 6, calls  # the quantizations are kernels (11 calls of the 6)
    assert lowered <= 6, lowered


def _decoded_kernel_outputs(monkeypatch, prefers_gemm_kernel: bool) -> int:
    """Mosaic GPU results that are decoded copies (uint32 word pairs of a 1024 × 256
    activation or gradient) in one linear layer's fwd+bwd as ``impl="auto"`` runs it on an
    H200, lowered for CUDA on the host."""
    from fp4jax import implementation

    monkeypatch.setattr(implementation, "gpu_capability", lambda: (9, 0))  # an H200
    monkeypatch.setattr(implementation, "auto_prefers_gemm_kernel",
                        lambda *_: prefers_gemm_kernel)
    jax.clear_caches()  # the layer's traces hold the GEMM choice they were traced with
    text = layer_text_for_cuda("auto", (1024, 256), (256, 256))
    results = [line[line.rindex("->"):] for line in text.splitlines()
               if "mosaic_gpu_v2" in line and "->" in line]
    return sum(r.count("tensor<64x16x16x8xui32>") for r in results)


def test_kernel_writes_the_copies_xla_multiplies_decoded(monkeypatch):
    """Where XLA's dot multiplies a GEMM (the measured choice for the step's shapes), the
    two-output kernels write the three copies used once right after (X rowwise for fprop,
    both copies of dY) as BF16 values, so XLA decodes no activation-sized operand but the
    saved columnwise X; where the GEMM kernel is chosen they stay codes and scales."""
    assert _decoded_kernel_outputs(monkeypatch, prefers_gemm_kernel=False) == 3
    assert _decoded_kernel_outputs(monkeypatch, prefers_gemm_kernel=True) == 0
