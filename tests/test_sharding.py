"""Sharded numerics and the FP4 all-gather for FSDP, on 8 host CPU devices (issue 11).

The 8-device checks run in one fresh interpreter each (XLA_FLAGS must be set before
JAX starts; the main test process has one CPU device), each with many meshes and
shardings in it, so that the suite pays the start-up and the compiles once.
"""

import os
import re
import subprocess
import sys
import textwrap

import jax
import pytest
from jax.sharding import PartitionSpec as P

import fp4jax
from fp4jax import weight_gather

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Shared by both subprocesses: bit views and the bytes of the all-gathers of a
# compiled program (operand bytes per device, read from the compiled HLO text).
_PRELUDE = r"""
import re, time
import jax, jax.numpy as jnp, numpy as np
import fp4jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
assert len(jax.devices()) == 8, jax.devices()
E, A = AxisType.Explicit, AxisType.Auto

def full(spec, ndim):
    return P(*spec, *(None,) * (ndim - len(spec)))

def bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])

from fp4jax.testing.hlo import all_gathers as _all_gathers

def all_gathers(hlo):
    '''(dtype, operand bytes) of every all-gather of a compiled program's HLO text.'''
    return [(g["dtype"], g["bytes"]) for g in _all_gathers(hlo)]
"""


def _run_on_8_host_devices(code: str) -> str:
    """Runs ``code`` in a fresh interpreter with 8 CPU devices; it must print OK.

    LLVM optimization level 0 cuts the compile time (which dominates) by a fifth; it
    changes no result (XLA:CPU uses no fast-math at any level), and every program the
    checks compare is compiled with it.
    """
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8 "
               "--xla_backend_optimization_level=0",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
    return res.stdout


def test_sharded_quantize_and_gemms_equal_unsharded():
    """Under 1-D and 2-D meshes, explicit and auto axes, with operands sharded along
    batch, tokens, features or the contraction (shards of fewer tokens than a 16-block
    included): quantize's codes, block scales and global amax (1D rowwise, columnwise,
    16x16 tiles, RHT + SR) are bitwise the unsharded ones; the forward and both
    gradients of dot_general (full Recipe.nvfp4, SR key) are bitwise equal where the
    GEMM's contraction is not sharded, else within float32 summation order
    (|diff| <= 1e-6 of the largest value); out_sharding is the output's sharding under
    explicit axes."""
    out = _run_on_8_host_devices("""
        x = (jax.random.normal(jax.random.key(0), (4, 32, 128))
             * jnp.exp(jax.random.normal(jax.random.key(3), (4, 32, 1))))
        w = jax.random.normal(jax.random.key(1), (128, 64)) / 11
        key = jax.random.key(2)
        dn = (((2,), (0,)), ((), ()))

        def check(x, w, out_sharding=None):
            xb = x.astype(jnp.bfloat16)
            qs = [fp4jax.quantize(xb), fp4jax.quantize(xb, axis=1),
                  fp4jax.quantize(w.astype(jnp.bfloat16), axis=0, block_2d=True),
                  fp4jax.quantize(xb, axis=1, hadamard=True, rounding="stochastic", key=key)]
            f = lambda x, w: fp4jax.dot_general(x, w, dn, key=key, out_sharding=out_sharding)
            y, vjp = jax.vjp(f, x, w)
            return [(q.data, q.scales, q.amax) for q in qs], (y, *vjp(jnp.cos(y)))

        t0 = time.time()
        want_q, want = jax.jit(check)(x, w)
        print("unsharded", f"{time.time() - t0:.1f}s")
        # (mesh shape, axis type, x spec, w spec, out_sharding): batch, tokens (8 or 4
        # per shard: a block spans shards), features, contraction.
        cases = [
            ((8,), E, P(None, "data"), P(None, "data"), P(None, None, "data")),
            ((4, 2), A, P("data", None, "model"), P("model", "data"), P(None, "data", "model")),
            ((2, 4), E, P("model", "data"), P("data", "model"), None),
        ]
        for shape, kind, xspec, wspec, ospec in cases:
            names = ("data", "model")[:len(shape)]
            mesh = jax.make_mesh(shape, names, axis_types=(kind,) * len(shape))
            with jax.set_mesh(mesh):
                xs = jax.device_put(x, NamedSharding(mesh, xspec))
                ws = jax.device_put(w, NamedSharding(mesh, wspec))
                got_q, got = jax.jit(check, static_argnums=2)(xs, ws, ospec)
            case = (shape, kind, xspec, wspec)
            for a, b in zip(jax.tree.leaves(want_q), jax.tree.leaves(got_q)):
                np.testing.assert_array_equal(bits(a), bits(b), err_msg=str(case))
            contracted = {"y": xspec[2:3] + wspec[:1], "gx": wspec[1:2], "gw": xspec[:2]}
            for name, a, b in zip(("y", "gx", "gw"), want, got):
                if any(s is not None for s in contracted[name]):
                    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6 * float(jnp.abs(a).max()),
                                               err_msg=f"{name} {case}")
                else:
                    np.testing.assert_array_equal(bits(a), bits(b), err_msg=f"{name} {case}")
            y, gx, gw = got
            if ospec is not None:
                assert full(y.sharding.spec, 3) == full(ospec, 3), (y.sharding.spec, case)
            if kind == E:  # each gradient sharded like its primal
                assert full(gx.sharding.spec, 3) == full(xspec, 3), (gx.sharding.spec, case)
                assert full(gw.sharding.spec, 2) == full(wspec, 2), (gw.sharding.spec, case)
            print(case, f"{time.time() - t0:.1f}s")
        print("OK", f"{time.time() - t0:.1f}s")
    """)
    print(out)


def test_fp4_all_gather_moves_4x_fewer_bytes_and_changes_no_bit():
    """FSDP (weight sharded over the data axis, 1-D auto mesh, through dot_general;
    FSDP x tensor parallel on a 2-D explicit mesh, through the Flax op): with `FP4Gather`
    the compiled forward + backward all-gathers only uint8 (packed codes, E4M3 scale
    bytes; no float gather, so dgrad reuses the gathered NVFP4 weight), at least 3x
    fewer bytes than gathering the BF16 weight, and the output and both gradients are
    bitwise those of the BF16-gathered (non-FSDP) run, dW sharded like W."""
    out = _run_on_8_host_devices("""
        from fp4jax.flax import DotGeneral, step_scope
        x = jax.random.normal(jax.random.key(0), (128, 128), jnp.bfloat16)
        w = (jax.random.normal(jax.random.key(1), (128, 256)) / 11).astype(jnp.bfloat16)
        dn = (((1,), (0,)), ((), ()))
        t0 = time.time()

        def step(dot_general, x, w):
            with step_scope(jax.random.key(2)):
                y, vjp = jax.vjp(lambda x, w: dot_general(x, w, dn), x, w)
                return (y, *vjp(jnp.cos(y)))

        # (mesh shape, axis type, W spec, gathered axes)
        for shape, kind, wspec, axes in (((8,), A, P("data", None), ("data",)),
                                         ((4, 2), E, P("data", "model"), ("data",))):
            names = ("data", "model")[:len(shape)]
            mesh = jax.make_mesh(shape, names, axis_types=(kind,) * len(shape))
            gathered = P(None, *wspec[1:])
            if kind == E:  # the Flax op; the spec is the operand's type
                fp4 = DotGeneral(name="fc", rhs_gather=fp4jax.FP4Gather(axes=axes))
                op = DotGeneral(name="fc")
                constrain = jax.sharding.reshard
            else:
                gather = fp4jax.FP4Gather(axes=axes, spec=wspec)
                op = lambda x, w, dn, **kw: fp4jax.dot_general(
                    x, w, dn, key=jax.random.key(3), **kw)
                fp4 = lambda x, w, dn: op(x, w, dn, rhs_gather=gather)
                constrain = jax.lax.with_sharding_constraint

            # The BF16 FSDP baseline gathers W's bits as uint16, the bytes a BF16
            # all-gather moves on a GPU (XLA:CPU widens float all-gathers to float32);
            # dW goes back to W's sharding.
            @jax.custom_vjp
            def gather_bf16(w):
                u16 = constrain(jax.lax.bitcast_convert_type(w, jnp.uint16), wspec)
                return jax.lax.bitcast_convert_type(constrain(u16, gathered), jnp.bfloat16)
            gather_bf16.defvjp(lambda w: (gather_bf16(w), None),
                               lambda _, g: (constrain(g, wspec),))
            bf16 = lambda x, w, dn: op(x, gather_bf16(w), dn)
            with jax.set_mesh(mesh):
                xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
                ws = jax.device_put(w, NamedSharding(mesh, wspec))
                results, gathered_bytes = [], []
                for dg in (fp4, bf16):
                    f = jax.jit(lambda x, w: step(dg, x, w))
                    gathers = all_gathers(f.lower(xs, ws).compile().as_text())
                    results.append(f(xs, ws))
                    gathered_bytes.append(sum(b for _, b in gathers))
                    if dg is fp4:
                        assert gathers and {t for t, _ in gathers} == {"u8"}, gathers
            for a, b in zip(*results):
                np.testing.assert_array_equal(bits(a), bits(b), err_msg=str(shape))
            assert full(results[0][2].sharding.spec, 2) == wspec, results[0][2].sharding
            ratio = gathered_bytes[1] / gathered_bytes[0]
            print(f"mesh {shape} {kind}: W {w.shape} bf16 sharded {wspec}: all-gather bytes per "
                  f"device FP4 {gathered_bytes[0]} vs BF16 {gathered_bytes[1]} ({ratio:.2f}x)")
            assert ratio >= 3, gathered_bytes
        print("OK", f"{time.time() - t0:.1f}s")
    """)
    print(out)


def test_sharding_md_example_runs():
    """docs/SHARDING.md's python block runs as written (one CPU device: a 1-device mesh)."""
    text = open(os.path.join(ROOT, "docs", "SHARDING.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/SHARDING.md", "exec"), {})  # noqa: S102


def test_fp4_gather_rejects_bad_configs_with_clear_errors():
    """Bad axes/spec types, a spec not sharded over the axes, auto axes without a spec
    or without a mesh, and a wrong rhs_gather type each raise naming the fault."""
    assert fp4jax.FP4Gather(axes="fsdp").axes == ("fsdp",)
    with pytest.raises(TypeError, match="axes"):
        fp4jax.FP4Gather(axes=())
    with pytest.raises(TypeError, match="axes"):
        fp4jax.FP4Gather(axes=(0,))
    with pytest.raises(TypeError, match="PartitionSpec"):
        fp4jax.FP4Gather(axes="fsdp", spec=("fsdp", None))
    with pytest.raises(ValueError, match="not sharded over"):
        fp4jax.FP4Gather(axes="fsdp", spec=P("model", None))
    x, w = jax.numpy.ones((16, 32)), jax.numpy.ones((32, 16))
    dn = (((1,), (0,)), ((), ()))
    with pytest.raises(ValueError, match="needs spec="):
        fp4jax.dot_general(x, w, dn, rhs_gather=fp4jax.FP4Gather(axes="fsdp"))
    with pytest.raises(ValueError, match="set_mesh"):
        fp4jax.dot_general(x, w, dn, rhs_gather=fp4jax.FP4Gather(axes="fsdp", spec=P("fsdp")))
    with pytest.raises(TypeError, match="rhs_gather"):
        fp4jax.dot_general(x, w, dn, rhs_gather=("fsdp",))
    assert weight_gather.without_axes(P(("fsdp", "data"), "model"), ("fsdp",)) == P(
        "data", "model")


def test_flax_layers_carry_the_gather():
    """nnx.quantize(rhs_gather=...) and linen.dot_general_cls(rhs_gather=...) hand the
    FP4Gather to every converted layer's op (what reaches fp4jax.dot_general)."""
    from flax import nnx

    gather = fp4jax.FP4Gather(axes="fsdp")
    model = nnx.Sequential(nnx.Linear(32, 32, rngs=nnx.Rngs(0)),
                           nnx.Linear(32, 16, rngs=nnx.Rngs(1)))
    fp4jax.flax.nnx.quantize(model, rhs_gather=gather)
    assert [layer.dot_general.rhs_gather for layer in model.layers] == [gather, gather]
    assert fp4jax.flax.linen.dot_general_cls(rhs_gather=gather)().rhs_gather is gather
    with pytest.raises(TypeError, match="rhs_gather"):
        fp4jax.flax.DotGeneral(name="fc", rhs_gather="fsdp")
