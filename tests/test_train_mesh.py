"""fp4jax.train on a device mesh: data, FSDP and tensor parallel training, sharded
checkpoints and the example's ``--mesh``, on 8 host CPU devices (in a subprocess:
this process has one device); plus `fp4jax.parallel.MeshRules` and ``--mesh``
validation in-process."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

import fp4jax
from fp4jax import implementation
from fp4jax.flax import DotGeneral, step_scope
from fp4jax.parallel import DEFAULT_RULES, MeshRules
from fp4jax.train import TrainStep, init_state, make_eval_step, nnx_loss_fn, state_shardings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))

import train_llama  # noqa: E402


def test_sharded_training_checkpoints_and_example_on_8_devices(tmp_path):
    """One subprocess with 8 host devices runs tests/mesh_checks.py:

    * DP (data=8), FSDP (fsdp=8), TP (model=4) and DP×TP (data=2 × model=4) each train 3
      steps (Adam, clipping, donated state) of the example Llama with an NVFP4 down
      projection and unquantized fp4jax matmuls, and equal the 1-device run: losses
      within 1e-5 relative, parameters within 2e-6 absolute (|p| ≤ 1). Why these bounds:
      the sharded step computes the same function with the same SR keys and bits and
      the same global amaxes; only FP32 sums are reordered (partial sums per shard plus
      an all-reduce), which moves each gradient by a few ulps of its terms' magnitude.
      Adam divides by sqrt(v) + eps, so a gradient near zero amplifies that; eps = 1e-4
      bounds it (lr 1e-2 · 1e-9 / 1e-4 ≈ 1e-7 per step). Measured: losses ≤ 2e-7,
      parameters ≤ 4e-7. An NVFP4 rounding that flipped with the summation order would
      show as a larger difference (one E2M1 step of a block), and different SR keys per
      device as a large one.
    * The state's actual shardings are the rules': named parameters' specs and
      per-device shard shapes, the Adam moments sharded like their parameters, step and
      key replicated, metrics replicated, the batch split over the data axes. The
      compiled steps' collectives fit: DP all-reduces gradients and gathers nothing,
      FSDP all-gathers every weight matrix, TP all-reduces.
    * Checkpoints: a DP×TP state restores bit-identically onto its own mesh (and the
      next step from it equals the next step from the saved state, bit for bit), and
      onto other mesh shapes: 2 devices → 1, 1 → 2 (model), 8 (fsdp) → 4×2 (data ×
      model), each leaf with the template's sharding.
    * A linen model's own annotations (nn.with_logical_partitioning) apply the same way
      (fsdp=2 × model=4 vs one device), and its NVFP4 Dense (dot_general_cls) gathers its
      kernel over fsdp as uint8 codes and scales only.
    * FP4 all-gather (data=4 x fsdp=2, the NVFP4 down projection 4 x 16 columns per
      shard): the step equals the plain FSDP step (``fp4_gather=False``: XLA gathers) on
      the same mesh (measured: bitwise); its compiled HLO all-gathers the down weight
      only as uint8 codes (1024 B whole) and scales (8 B), with no float all-gather of
      it or inside its NVFP4 GEMMs, and sends >= 3x fewer bytes for it than the plain
      step in BF16 (measured: 516 vs 4096 B per device per step, 7.9x; the plain step
      compiles to float32 gathers here, 8192 B). Under fsdp=8 (4 columns per shard:
      no whole 16x16 tiles) and without an fsdp axis, no layer gathers in FP4. Every
      sharded step is traced under its mesh, where `implementation.mesh_reason` keeps
      impl="auto" off the single-device kernels; the 1-device step is not.
    * ``examples/train_llama.py --mesh data=2,fsdp=2,model=2`` trains 2 steps with its
      NVFP4 down projection gathered in NVFP4.
    * A parameter or batch that does not split evenly over its mesh axes is a
      ValueError naming it.
    """
    out = tmp_path / "results.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
               # Both the 1-device and the sharded programs are compiled with these; the
               # checks compare them with each other, and compile twice as fast.
               XLA_FLAGS="--xla_force_host_platform_device_count=8 "
                         "--xla_backend_optimization_level=0 "
                         "--xla_llvm_disable_expensive_passes=true")
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "mesh_checks.py"), str(out), str(tmp_path)],
        env=env, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-4000:]
    results = json.loads(out.read_text())
    want = {"dp", "fsdp", "tp", "dp_tp", "dp_fsdp", "fp4 gather", "linen", "errors",
            "checkpoint/same mesh", "checkpoint/2 to 1", "checkpoint/1 to 2",
            "checkpoint/8 to 4x2", "example --mesh"}
    assert set(results["ok"]) == want
    failed = {k: v for k, v in results["ok"].items() if v != "ok"}
    assert not failed, "\n\n".join(f"{k}:\n{v}" for k, v in failed.items())
    sent = results["gathered_bytes"]
    assert sent["plain_as_bf16"] >= 3 * sent["fp4"], sent


# ---------------------------------------------------------------- in-process, 1 device


def _rules(**kw):
    return MeshRules(mesh=jax.make_mesh((1, 1, 1), ("data", "fsdp", "model")), **kw)


def test_rules_map_logical_axes_flax_style():
    """First free rule wins; absent mesh axes are dropped from the rules; a mesh axis
    name maps to itself; unknown names are replicated; an explicit-axes mesh is used as
    Auto (XLA partitions the step)."""
    r = _rules()
    assert r.mesh.axis_types == (AxisType.Explicit,) * 3  # JAX 0.11's default
    assert r.auto_mesh.axis_types == (AxisType.Auto,) * 3
    assert r.spec(("embed", "mlp")) == P("fsdp", "model")
    assert r.spec(("vocab", "embed")) == P("model", "fsdp")
    assert r.spec(("norm",)) == P(None)
    assert r.spec(("model", "data")) == P("model", "data")
    assert r.batch_spec == P(("data", "fsdp"))
    only_data = MeshRules(mesh=jax.make_mesh((1,), ("data",)))
    assert only_data.spec(("embed", "mlp")) == P(None, None)
    assert only_data.batch_spec == P("data")
    custom = MeshRules(mesh=jax.make_mesh((1,), ("x",)), rules=(("embed", "x"), ("mlp", "x")))
    assert custom.spec(("embed", "mlp")) == P("x", None)  # x is taken by embed
    assert DEFAULT_RULES[0] == ("batch", ("data", "fsdp"))


def test_param_rules_and_annotations_give_the_state_shardings():
    """An nnx annotation (with_partitioning) and a param_rules regex (fullmatch on the
    dotted path, before the annotation) decide each parameter's sharding, and the
    optimizer state follows its parameter."""
    lin = nnx.Linear(4, 8, rngs=nnx.Rngs(0), kernel_init=nnx.with_partitioning(
        nnx.initializers.lecun_normal(), ("embed", "mlp"), eager_sharding=False))
    params = nnx.state(lin, nnx.Param)
    r = _rules(param_rules=((r"bias", ("mlp",)),))
    assert r.logical_axes(params) == {"bias": ("mlp",), "kernel": ("embed", "mlp")}
    opt = optax.adam(1e-3)
    sh = state_shardings(init_state(params, opt, 0), opt, r)
    assert sh.params["kernel"].get_value().spec == P("fsdp", "model")
    assert sh.params["bias"].get_value().spec == P("model")
    assert sh.opt_state[0].nu["kernel"].get_value().spec == P("fsdp", "model")
    assert sh.opt_state[0].count.spec == P()
    overridden = _rules(param_rules=((r"k.*", (None, None)), (r"bias", ("mlp",))))
    sh = state_shardings(init_state(params, opt, 0), opt, overridden)
    assert sh.params["kernel"].get_value().spec == P(None, None)


def test_bad_rules_layouts_and_batches_are_clear_errors():
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        MeshRules(mesh="data=2")
    with pytest.raises(TypeError, match="pair"):
        _rules(rules=(("embed",),))
    with pytest.raises(ValueError, match="bad regex"):
        _rules(param_rules=(("(", ("embed",)),))
    r = _rules(param_rules=((r"w", ("embed",)),))
    with pytest.raises(ValueError, match=r"parameter w of shape \(4, 4\) has 2 dimensions"):
        r.param_shardings({"w": jnp.zeros((4, 4))})
    with pytest.raises(ValueError, match=r"batch leaf x of shape \(\)"):
        r.check_batch({"x": np.float32(1)})
    with pytest.raises(TypeError, match="MeshRules"):
        TrainStep(lambda p, b: 0.0, optax.sgd(1.0), mesh_rules="data=2")
    # (Uneven splits need more than one device: tests/mesh_checks.py "errors".)


def test_example_mesh_option_is_validated():
    """--mesh: unknown axis, malformed entry, repeated axis and a product other than the
    device count are errors that say so."""
    assert train_llama.parse_mesh("data=2, model=4") == {"data": 2, "model": 4}
    with pytest.raises(ValueError, match="unknown mesh axis 'modle'"):
        train_llama.parse_mesh("data=2,modle=4")
    with pytest.raises(ValueError, match="AXIS=SIZE"):
        train_llama.parse_mesh("data:2")
    with pytest.raises(ValueError, match="AXIS=SIZE"):
        train_llama.parse_mesh("data=0")
    with pytest.raises(ValueError, match="given twice"):
        train_llama.parse_mesh("data=1,data=1")
    with pytest.raises(ValueError, match=r"has 8 devices \(2 x 4\) but 1 are available"):
        train_llama.make_mesh_rules("data=2,model=4")
    assert train_llama.make_mesh_rules("data=1,model=1").mesh.shape == {"data": 1, "model": 1}
    with pytest.raises(ValueError, match="batch=6 must split evenly"):
        train_llama.RunConfig(batch=6, mesh="data=4")
    with pytest.raises(ValueError, match="has 3 devices"):  # before loading any data
        train_llama.main(["--mesh", "data=3", "--data", "/nonexistent"])
    with pytest.raises(ValueError, match="has 3 devices"):
        train_llama.main(["--mesh", "data=3", "--no-fp4-gather", "--data", "/nonexistent"])
    assert train_llama.make_mesh_rules("fsdp=1").fp4_gather
    assert not train_llama.make_mesh_rules("fsdp=1", fp4_gather=False).fp4_gather


def test_stateful_model_on_a_one_device_mesh_equals_no_mesh():
    """The mesh path carries a model's non-parameter state (BatchNorm statistics, the
    dropout RNG stream), replicated; on a one-device mesh it computes exactly what the
    plain step computes."""

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(8, 16, rngs=rngs)
            self.bn = nnx.BatchNorm(16, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.drop(self.bn(self.up(x)))

    opt = optax.adam(1e-2)
    batch = jnp.arange(32.0).reshape(4, 8) / 32
    out = []
    for rules in (None, _rules()):
        model = Net(nnx.Rngs(params=0, dropout=1))
        loss_fn, params, model_state = nnx_loss_fn(model, lambda m, b: jnp.mean(m(b) ** 2),
                                                   has_state=True)
        state = init_state(params, opt, 0, model_state=model_state, mesh_rules=rules)
        step = TrainStep(loss_fn, opt, has_state=True, mesh_rules=rules)
        for i in range(2):
            state, _ = step(state, batch, step=i)
        out.append(state)
    mean = out[1].model_state["bn"]["mean"].get_value()
    assert mean.sharding.is_fully_replicated and float(jnp.abs(mean).sum()) > 0
    for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1])):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_steps_are_traced_under_their_mesh():
    """TrainStep and make_eval_step with mesh_rules trace the loss under the rules' mesh
    (what impl="auto" and FP4Gather see); on a one-device mesh the kernels stay
    allowed; without mesh_rules there is no mesh."""
    seen = []

    def loss_fn(p, b):
        mesh = jax.sharding.get_abstract_mesh()
        seen.append((mesh.axis_names, implementation.mesh_reason()))
        return jnp.sum(p["w"] * b)

    opt = optax.sgd(0.1)
    for rules in (None, _rules()):
        state = init_state({"w": jnp.ones(4)}, opt, 0, mesh_rules=rules)
        TrainStep(loss_fn, opt, mesh_rules=rules)(state, jnp.ones((1, 4)))
        make_eval_step(loss_fn, mesh_rules=rules)(state.params, jnp.ones((1, 4)))
    assert seen == [((), None)] * 2 + [(("data", "fsdp", "model"), None)] * 2


def test_fp4_gather_switch_and_fsdp_axes():
    """fp4_gather is a bool; a parameter is FSDP-gathered over the mesh axes (of more
    than one device) that also split the batch; size-1 axes and fp4_gather=False gather
    nothing. (Real gathers need devices: tests/mesh_checks.py.)"""
    with pytest.raises(TypeError, match="fp4_gather must be a bool"):
        _rules(fp4_gather="yes")
    r = _rules(param_rules=((r"w", ("embed", "mlp")),))
    assert r.fp4_gather and r.fsdp_axes(P("fsdp", "model")) == ()  # every axis has size 1
    assert r.fp4_gathers({"w": jnp.zeros((32, 32))}) == {}
    assert _rules(fp4_gather=False).fp4_gathers({"w": jnp.zeros((32, 32))}) == {}


def test_scope_finds_each_layers_fsdp_weight():
    """A layer named N gathers parameter N.kernel (or N) in NVFP4 when the shapes match
    (a stacked parameter's unsharded leading axes dropped) and every shard holds whole
    16-blocks of K and N on the mesh in context; otherwise XLA gathers it (None). The
    layer records it in fp4_gathered, unless its recipe leaves the weight unquantized."""
    spec = fp4jax.FP4Gather(axes=("fsdp",), spec=P("fsdp", None))
    stacked = fp4jax.FP4Gather(axes=("fsdp",), spec=P(None, "fsdp", None))
    gathers = {"fc.kernel": ((32, 16), spec), "w": ((32, 16), spec),
               "blocks.fc.kernel": ((3, 32, 16), stacked)}
    dn = (((1,), (0,)), ((), ()))
    mesh = AbstractMesh((2,), ("fsdp",), axis_types=(AxisType.Auto,))
    with step_scope(None, weight_gathers=gathers) as scope:
        assert scope.rhs_gather("fc", (32, 16), dn) is None  # no mesh in context
        with jax.sharding.use_abstract_mesh(mesh):
            assert scope.rhs_gather("fc", (32, 16), dn) == spec
            assert scope.rhs_gather("w", (32, 16), dn) == spec
            assert scope.rhs_gather("blocks.fc", (32, 16), dn) == spec
            assert scope.rhs_gather("fc", (16, 32), dn) is None  # not the parameter's shape
            assert scope.rhs_gather("other", (32, 16), dn) is None
        with jax.sharding.use_abstract_mesh(AbstractMesh((4,), ("fsdp",),
                                                         axis_types=(AxisType.Auto,))):
            assert scope.rhs_gather("fc", (32, 16), dn) is None  # 8 rows per shard

    x, w = jnp.ones((8, 32)), jnp.ones((32, 16))
    gathered = {}

    def layer(x, w, recipe):
        with step_scope(jax.random.key(0), weight_gathers=gathers) as scope:
            y = DotGeneral(name="fc", recipe=recipe)(x, w, dn)
        gathered.update(scope.fp4_gathered)
        return jnp.sum(y)

    with jax.sharding.use_abstract_mesh(mesh):
        jax.eval_shape(lambda x, w: layer(x, w, fp4jax.Recipe.unquantized()), x, w)
        assert gathered == {}
        jax.eval_shape(jax.grad(lambda x, w: layer(x, w, fp4jax.Recipe.nvfp4()), 1), x, w)
        assert gathered == {"fc": spec}
