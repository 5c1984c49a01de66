"""The implementation choice (fp4jax.implementation): one place decides xla/pallas/native."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax import gemm_table, implementation

_NO_KERNEL = lambda: "the kernel does not take it"  # noqa: E731
_KERNEL_OK = lambda: None  # noqa: E731


def _off_gpu():
    if jax.devices()[0].platform == "gpu":
        pytest.skip("GPU present")


def test_auto_means_xla_off_gpu():
    """On a machine without a CUDA GPU, impl='auto' runs the XLA path for everything."""
    _off_gpu()
    assert implementation.gpu_capability() is None
    for gemm in (False, True):
        assert implementation.choose("auto", gemm=gemm, kernel_reason=_KERNEL_OK,
                                     auto_prefers_kernel=True) == "xla"


def test_explicit_impls_are_taken_as_asked():
    """'xla' is always XLA; 'native' applies to GEMMs only; 'pallas' runs the kernel."""
    for gemm in (False, True):
        assert implementation.choose("xla", gemm=gemm, kernel_reason=_KERNEL_OK,
                                     auto_prefers_kernel=True) == "xla"
        assert implementation.choose("pallas", gemm=gemm, kernel_reason=_KERNEL_OK,
                                     auto_prefers_kernel=False) == "pallas"
    assert implementation.choose("native", gemm=True, kernel_reason=_NO_KERNEL,
                                 auto_prefers_kernel=False) == "native"
    assert implementation.choose("native", gemm=False, kernel_reason=_NO_KERNEL,
                                 auto_prefers_kernel=False) == "xla"


def test_explicit_pallas_never_falls_back():
    """impl='pallas' on a problem the kernel does not take raises with the kernel's reason."""
    with pytest.raises(ValueError, match="the kernel does not take it"):
        implementation.choose("pallas", gemm=False, kernel_reason=_NO_KERNEL,
                              auto_prefers_kernel=True)


def test_pallas_quantize_of_float32_says_why():
    """A float32 input under impl='pallas' names the dtype (the kernel takes 16-bit inputs)."""
    with pytest.raises(ValueError, match="float32"):
        fp4jax.quantize(jnp.ones((64, 128), jnp.float32), impl="pallas")


def test_unknown_impl_rejected():
    with pytest.raises(ValueError, match="impl must be one of"):
        implementation.check_impl("cuda")
    with pytest.raises(ValueError, match="impl must be one of"):
        fp4jax.quantize(jnp.ones((4, 16)), impl="cuda")
    with pytest.raises(ValueError, match="impl must be one of"):
        fp4jax.dot_general(jnp.ones((4, 16)), jnp.ones((16, 4)), (((1,), (0,)), ((), ())),
                           impl="cuda")


def test_auto_gemm_choice_is_the_faster_measured_implementation_on_every_table_shape():
    """On every shape of the measured table, auto picks the kernel iff it measured faster
    than XLA's decode-and-dot by the margin (so auto is never the slower one there, and
    ties go to XLA); every quantization the kernels take goes to them."""
    assert gemm_table.MEASURED
    margin = implementation.KERNEL_WIN_MARGIN
    for (layout, m, n, k), (xla_ms, pallas_ms) in gemm_table.MEASURED.items():
        want = pallas_ms is not None and pallas_ms <= margin * xla_ms
        assert implementation.auto_prefers_gemm_kernel(m, n, k, layout) == want, (layout, m, n, k)
    with pytest.raises(ValueError, match="no measured GEMM table for layout 'fwd'"):
        implementation.auto_prefers_gemm_kernel(16, 16, 16, "fwd")
    for columnwise in (False, True):
        for stochastic in (False, True):
            assert implementation.auto_prefers_quantize_kernel(
                columnwise=columnwise, stochastic=stochastic)


def test_auto_gemm_kernel_win_is_not_extrapolated_to_a_smaller_grid():
    """Off the table, a kernel win carries over only where the kernel launches at least
    the measured neighbour's CTAs (or fills the GPU). The weight gradients of a dim-768
    model over 32768 tokens (18-48 CTAs, a 4x longer K per CTA than their neighbour, a
    measured tie) go to XLA; a skinny fprop with the same grid as its winning neighbour
    keeps the kernel."""
    for m, n in ((768, 768), (768, 2048), (2048, 768)):
        assert not implementation.auto_prefers_gemm_kernel(m, n, 32768, "wgrad")
        assert implementation.gemm_kernel_ctas(m, n, 32768) < implementation.TABLE_SMS
    assert implementation.auto_prefers_gemm_kernel(16, 8192, 8192, "fprop")
    assert implementation.auto_prefers_gemm_kernel(16, 8192, 16384, "fprop")
    assert implementation.gemm_kernel_ctas(16, 8192, 16384) >= implementation.gemm_kernel_ctas(
        16, 8192, 8192)
    assert not implementation.auto_prefers_gemm_kernel(16, 1024, 8192, "fprop")


def test_gemm_layout_names_the_training_gemm():
    """fprop: rhs blocked along K; dgrad: the transposed tiled weight (blocked along N);
    wgrad: lhs is the .mT view (lhs_from_mT)."""
    w = fp4jax.quantize(jnp.ones((64, 32)), axis=0, block_2d=True)
    assert implementation.gemm_layout(w, lhs_from_mT=False) == "fprop"
    assert implementation.gemm_layout(w.mT, lhs_from_mT=False) == "dgrad"
    assert implementation.gemm_layout(w, lhs_from_mT=True) == "wgrad"


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_rowwise_columnwise_kernel_matches_xla_bitwise(rounding):
    """The two-output kernel that dot_general uses for X and dY (tokens padded 56 -> 64)
    gives the XLA path's bits, in Mosaic GPU interpret mode on CPU."""
    from jax._src.pallas.mosaic_gpu.interpret import params

    x = jax.random.normal(jax.random.key(0), (56, 128), jnp.bfloat16)
    keys = dict(row_key=jax.random.key(3), col_key=jax.random.key(4)) \
        if rounding == "stochastic" else {}
    want = implementation.quantize_rowwise_columnwise(x, rounding=rounding, impl="xla", **keys)
    with params.force_gpu_interpret_mode():
        got = implementation.quantize_rowwise_columnwise(
            x, rounding=rounding, impl="pallas", **keys)
    for a, b in zip(got, want):
        assert (a.shape, a.axis, a.hadamard) == (b.shape, b.axis, b.hadamard)
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
        np.testing.assert_array_equal(np.asarray(a.scales.view(jnp.uint8)),
                                      np.asarray(b.scales.view(jnp.uint8)))
        assert float(a.amax) == float(b.amax)


def _mesh(*sizes, types=None):
    names = tuple("abcd"[:len(sizes)])
    types = types or (jax.sharding.AxisType.Auto,) * len(sizes)
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh(sizes, names, axis_types=types))


def test_mesh_reason_counts_the_devices_of_the_mesh_in_context():
    """The kernels run on one device's operands: mesh_reason names a context mesh of more
    than one device (its manual axes, inside shard_map, not counted) and is None with no
    mesh, a single-device mesh or only manual axes."""
    manual, auto = jax.sharding.AxisType.Manual, jax.sharding.AxisType.Auto
    assert implementation.mesh_reason(jnp.ones(3)) is None
    with _mesh(2, 4):
        assert implementation.mesh_reason() == (
            "operands may be sharded over a 8-device mesh; the kernels run on one device's "
            "operands")
    with _mesh(4, 2, types=(manual, auto)):
        assert "a 2-device mesh" in implementation.mesh_reason()
    for sizes, types in (((1,), None), ((1, 1), None), ((4,), (manual,))):
        with _mesh(*sizes, types=types):
            assert implementation.mesh_reason() is None, sizes


def test_auto_keeps_the_kernels_off_a_multi_device_mesh(monkeypatch):
    """On sm_90 impl='auto' traces the quantize kernel with no mesh and on a one-device
    mesh, the XLA path on a 4-device mesh; impl='pallas' there raises the mesh reason
    (quantize, the two-output quantize, the GEMM)."""
    monkeypatch.setattr(implementation, "gpu_capability", lambda: (9, 0))
    x = jnp.ones((64, 128), jnp.bfloat16)

    def uses_kernel():  # the Mosaic GPU kernels trace (not lower) on a CPU
        jaxpr = str(jax.make_jaxpr(lambda x: fp4jax.quantize(x, impl="auto"))(x))
        return "pallas_call" in jaxpr or "mpmd_map" in jaxpr

    assert uses_kernel()
    with _mesh(1):
        assert uses_kernel()
    qa, qb = fp4jax.quantize(x), fp4jax.quantize(x.T, axis=0)
    with _mesh(4):
        assert not uses_kernel()
        calls = {
            "quantize": lambda: fp4jax.quantize(x, impl="pallas"),
            "two-output": lambda: implementation.quantize_rowwise_columnwise(x, impl="pallas"),
            "gemm": lambda: implementation.matmul(qa, qb, impl="pallas"),
        }
        for what, call in calls.items():
            with pytest.raises(ValueError, match="sharded over a 4-device mesh"):
                jax.eval_shape(call)
                pytest.fail(what)


def test_decoded_operands_multiply_as_their_codes():
    """A `DecodedNVFP4` operand (the kernel's decoded copy: code · s in BF16) gives the GEMM
    the same result bit for bit as the NVFP4Array it stands for, as lhs, as rhs or both
    (fprop with a 2D-tiled weight; wgrad with an `lhs_from_mT` view and Hadamard copies),
    with ``impl`` "auto" or "xla"; "pallas" (which multiplies codes) refuses it; an operand
    of another type is a TypeError naming it."""
    from fp4jax.numerics.nvfp4_array import DecodedNVFP4
    from fp4jax.reference.quantization import scaled_codes_bf16

    def decoded(q):
        return DecodedNVFP4(values=scaled_codes_bf16(q), amax=q.amax, axis=q.axis,
                            hadamard=q.hadamard)

    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (64, 96), jnp.bfloat16)
    w = jax.random.normal(k[1], (96, 48), jnp.bfloat16)
    g = jax.random.normal(k[2], (64, 48), jnp.bfloat16)
    qx, qw = fp4jax.quantize(x), fp4jax.quantize(w, axis=0, block_2d=True)
    want = implementation.matmul(qx, qw)
    for lhs, rhs in ((decoded(qx), qw), (qx, decoded(fp4jax.quantize(w, axis=0))),
                     (decoded(qx), decoded(fp4jax.quantize(w, axis=0)))):
        if not isinstance(rhs, DecodedNVFP4):
            got = implementation.matmul(lhs, rhs, impl="auto")
            np.testing.assert_array_equal(got, want)
        ref = implementation.matmul(
            qx if isinstance(lhs, DecodedNVFP4) else lhs,
            fp4jax.quantize(w, axis=0) if isinstance(rhs, DecodedNVFP4) else rhs)
        np.testing.assert_array_equal(implementation.matmul(lhs, rhs, impl="xla"), ref)
        with pytest.raises(ValueError, match="DecodedNVFP4 operand"):
            implementation.matmul(lhs, rhs, impl="pallas")
    xc = fp4jax.quantize(x, axis=0, hadamard=True)
    gc = fp4jax.quantize(g, axis=0, hadamard=True, rounding="stochastic", key=k[2])
    want = implementation.matmul(xc.mT, gc, lhs_from_mT=True)
    np.testing.assert_array_equal(
        implementation.matmul(xc.mT, decoded(gc), lhs_from_mT=True), want)
    with pytest.raises(TypeError, match="lhs must be an NVFP4Array, got Array"):
        implementation.matmul(x, qw)


def test_auto_layer_with_decoded_copies_equals_the_xla_path_bitwise(monkeypatch):
    """One NVFP4 linear layer, forward and backward, as ``impl="auto"`` runs it on an H200
    where XLA's dot multiplies every GEMM: the quantize kernels (interpret mode here) hand
    X rowwise and both copies of dY to the GEMMs decoded, and the output and both
    gradients equal the XLA path's bit for bit."""
    import functools

    from fp4jax.numerics.nvfp4_array import DecodedNVFP4
    from pallas_kernels import quantize_single, quantize_two_output, scale_kernels

    monkeypatch.setattr(implementation, "gpu_capability", lambda: (9, 0))
    monkeypatch.setattr(implementation, "auto_prefers_gemm_kernel", lambda *_: False)
    for mod, name in ((quantize_two_output, "quantize_rowwise_columnwise"),
                      (quantize_single, "quantize"), (scale_kernels, "output_scales")):
        monkeypatch.setattr(mod, name, functools.partial(getattr(mod, name), interpret=True))
    seen = []
    matmul = implementation.matmul

    def recording_matmul(lhs, rhs, **kw):
        seen.append((type(lhs).__name__, type(rhs).__name__))
        return matmul(lhs, rhs, **kw)

    monkeypatch.setattr(implementation, "matmul", recording_matmul)
    jax.clear_caches()
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (128, 256), jnp.bfloat16)
    w = (jax.random.normal(k[1], (256, 128)) / 16).astype(jnp.bfloat16)

    def fwd_bwd(impl):
        y, vjp = jax.vjp(lambda x, w: fp4jax.dot_general(
            x, w, (((1,), (0,)), ((), ())), key=k[2], impl=impl), x, w)
        return (y, *vjp(jnp.full_like(y, 0.01)))

    got = fwd_bwd("auto")
    decoded = DecodedNVFP4.__name__
    # fprop and dgrad: a decoded lhs (X, dY rowwise); wgrad: a decoded rhs (dY columnwise)
    # against the saved columnwise X; no GEMM of two coded operands.
    assert set(seen) == {(decoded, "NVFP4Array"), ("NVFP4Array", decoded)}, seen
    for name, a, b in zip(("y", "dx", "dw"), got, fwd_bwd("xla")):
        np.testing.assert_array_equal(a, b, err_msg=name)
