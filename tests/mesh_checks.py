"""Sharded training and checkpoint checks on 8 host CPU devices.

`tests/test_train_mesh.py` runs ``python tests/mesh_checks.py OUT.json TMPDIR`` in a
subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the pytest
process itself has one CPU device); every check's outcome ("ok" or the traceback) and
the measured differences land in OUT.json. Nothing runs on import.

The model is the example's Llama (``examples/llama.py``, annotated with logical axes),
one block, width 32, computing in float32, with both recipes in one model (one
compilation per layout): the MLP's down projection in NVFP4 (`Recipe.nvfp4()`; row-split
under tensor parallelism, so its contraction is sharded) and the other block matmuls
through fp4jax's dot_general with `Recipe.unquantized()`. The mesh layouts use
`fp4jax.parallel.DEFAULT_RULES`, with FP4 weight gathers on (`MeshRules.fp4_gather`):
under ``dp_fsdp`` the down projection's weight (4 x 16 columns per fsdp shard: whole
16x16 tiles) is gathered as NVFP4 codes and scales; under ``fsdp`` (4 columns per
shard) it cannot be and XLA gathers it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback

import numpy as np

from fp4jax.testing.hlo import all_gathers  # dtype, elements, bytes sent per device, op_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYOUTS = {
    "dp": ((8,), ("data",)),
    "fsdp": ((8,), ("fsdp",)),
    "tp": ((4,), ("model",)),
    "dp_tp": ((2, 4), ("data", "model")),
    "dp_fsdp": ((4, 2), ("data", "fsdp")),
}
"""Mesh shape and axis names of each layout."""

# Expected parameter specs (trailing Nones dropped) and per-device shard shapes.
EXPECTED = {
    "dp": {"attn.q": ((), (32, 32)), "attn.o": ((), (32, 32)), "mlp.down": ((), (64, 32)),
           "embed": ((), (256, 32)), "lm_head": ((), (32, 256)), "norm": ((), (32,))},
    "fsdp": {"attn.q": (("fsdp",), (4, 32)), "attn.o": ((None, "fsdp"), (32, 4)),
             "mlp.down": ((None, "fsdp"), (64, 4)), "embed": ((None, "fsdp"), (256, 4)),
             "lm_head": (("fsdp",), (4, 256)), "norm": ((), (32,))},
    "tp": {"attn.q": ((None, "model"), (32, 8)), "attn.o": (("model",), (8, 32)),
           "mlp.down": (("model",), (16, 32)), "embed": (("model",), (64, 32)),
           "lm_head": ((None, "model"), (32, 64)), "norm": ((), (32,))},
}
EXPECTED["dp_tp"] = EXPECTED["tp"]
EXPECTED["dp_fsdp"] = {
    "attn.q": (("fsdp",), (16, 32)), "attn.o": ((None, "fsdp"), (32, 16)),
    "mlp.down": ((None, "fsdp"), (64, 16)), "embed": ((None, "fsdp"), (256, 16)),
    "lm_head": (("fsdp",), (16, 256)), "norm": ((), (32,))}
BATCH = {"dp": "data", "fsdp": "fsdp", "tp": None, "dp_tp": "data", "dp_fsdp": ("data", "fsdp")}
"""The mesh axes the batch is split over."""
FP4_GATHERED = {"dp": set(), "fsdp": set(), "tp": set(), "dp_tp": set(),
                "dp_fsdp": {"blocks.0.mlp.down"}}
"""The layers whose weight each layout all-gathers as NVFP4 codes and scales."""
FLOATS = ("f32", "bf16", "f16", "f64")

STEPS = 3
LR = 1e-2
ADAM_EPS = 1e-4  # bounds Adam's amplification of tiny gradients' rounding (see the test)
LOSS_RTOL = 1e-5
"""Losses vs the 1-device run (tests/test_train_mesh.py says why)."""
PARAM_ATOL = 2e-6
"""Parameters vs the 1-device run."""


def layer_gathers(hlo: str) -> list[dict]:
    """The all-gathers of the NVFP4 down projection: inside its `fp4jax.dot_general` (the
    only NVFP4 layer of the model) or of its weight parameter itself."""
    return [g for g in all_gathers(hlo)
            if "_dot_general" in g["op_name"] or "['down']" in g["op_name"]]


def main(out_path: str, tmp: str) -> None:  # noqa: PLR0915 - one script, many checks
    sys.path.insert(0, os.path.join(REPO, "examples"))
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from llama import Llama, LlamaConfig, loss_and_metrics

    import fp4jax
    from fp4jax import implementation
    from fp4jax.checkpoint import Checkpointer, leaves
    from fp4jax.parallel import MeshRules
    from fp4jax.train import TrainStep, init_state, nnx_loss_fn, state_shardings

    assert jax.device_count() == 8, jax.devices()
    results: dict = {"ok": {}, "diff": {}, "seconds": {}}

    def check(name, fn, *args):
        t = time.perf_counter()
        try:
            fn(*args)
            results["ok"][name] = "ok"
        except Exception:  # noqa: BLE001 - reported to the test
            results["ok"][name] = traceback.format_exc()
        results["seconds"][name] = round(time.perf_counter() - t, 2)

    cfg = LlamaConfig(dim=32, layers=1, heads=4, hidden=64, dtype="float32")
    opt = optax.adam(LR, eps=ADAM_EPS)
    tokens = np.random.default_rng(0).integers(0, 256, (STEPS, 8, 17))
    batches = [(tokens[i, :, :-1], tokens[i, :, 1:]) for i in range(STEPS)]

    def build():
        """The loss function and parameters: the down projection in NVFP4 (one
        quantized layer keeps the CPU compilation short), the other block matmuls
        unquantized through fp4jax, the output head plain."""
        model = Llama(cfg, rngs=nnx.Rngs(0))
        policy = fp4jax.flax.paper_policy(
            num_blocks=1, recipe=fp4jax.Recipe.nvfp4(),
            extra_rules=[fp4jax.flax.Rule(pattern=r".*\.(attn\..*|mlp\.(gate|up))",
                                          recipe=fp4jax.Recipe.unquantized())])
        report = fp4jax.flax.nnx.quantize(model, policy)
        assert report.quantized == ("blocks.0.mlp.down",), report
        assert len(report.high_precision) == 7, report  # 6 unquantized + the head
        return nnx_loss_fn(model, loss_and_metrics)

    def run(layout, fp4_gather=True):
        loss_fn, params = build()
        rules = None
        if layout is not None:
            shape, names = LAYOUTS[layout]
            mesh = jax.make_mesh(shape, names, devices=jax.devices()[:int(np.prod(shape))])
            rules = MeshRules(mesh=mesh, fp4_gather=fp4_gather)
        state = init_state(params, opt, 0, mesh_rules=rules)
        kernel_reasons = []

        def traced_loss_fn(p, b):  # what impl="auto" sees while the step is traced
            kernel_reasons.append(implementation.mesh_reason())
            return loss_fn(p, b)

        step = TrainStep(traced_loss_fn, opt, has_aux=True, max_grad_norm=1.0, donate=True,
                         mesh_rules=rules)
        losses, first_state = [], state
        for i, b in enumerate(batches):
            state, m = step(state, b, step=i)
            losses.append(float(m["loss"]))
            if i == 0:
                assert all(x.is_deleted() for x in jax.tree.leaves(first_state.params)), \
                    "the state was not donated"
                metrics_sharding = m["loss"].sharding
        if rules is not None:
            assert metrics_sharding.is_fully_replicated, metrics_sharding
        return {"state": state, "losses": losses, "step": step, "params0": params,
                "rules": rules, "kernel_reasons": kernel_reasons}

    def flat(tree):
        return {k: np.asarray(v) for k, v in leaves(tree).items()}

    def compare(layout, ref, got):
        lr = np.max(np.abs(np.array(got["losses"]) - ref["losses"]) / np.array(ref["losses"]))
        a, b = flat(ref["state"].params), flat(got["state"].params)
        pd = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
        results["diff"][layout] = {"loss_rel": float(lr), "param_abs": pd,
                                   "bitwise": bool(lr == 0 and pd == 0)}
        assert lr <= LOSS_RTOL, f"losses {got['losses']} vs {ref['losses']}"
        assert pd <= PARAM_ATOL, f"params differ by up to {pd}"

    def check_shardings(layout, got):
        state = got["state"]
        p = state.params
        where = {"attn.q": p["blocks"][0]["attn"]["q"]["kernel"],
                 "attn.o": p["blocks"][0]["attn"]["o"]["kernel"],
                 "mlp.down": p["blocks"][0]["mlp"]["down"]["kernel"],
                 "embed": p["embed"]["embedding"], "lm_head": p["lm_head"]["kernel"],
                 "norm": p["norm"]["scale"]}
        n = int(np.prod(LAYOUTS[layout][0]))
        for name, (spec, shard_shape) in EXPECTED[layout].items():
            x = where[name].get_value()
            actual = tuple(x.sharding.spec)
            while actual and actual[-1] is None:
                actual = actual[:-1]
            assert actual == spec, (layout, name, x.sharding)
            assert len(x.sharding.device_set) == n, (layout, name, x.sharding)
            assert x.addressable_shards[0].data.shape == shard_shape, (layout, name)
        # The optimizer state is sharded like the parameters; step and key replicated.
        mu, nu = state.opt_state[0].mu, state.opt_state[0].nu
        for tree in (mu, nu):
            for (k, x), y in zip(leaves(p).items(), jax.tree.leaves(tree)):
                assert y.sharding == x.sharding, (layout, k, y.sharding, x.sharding)
        assert state.step.sharding.is_fully_replicated
        assert state.rng.sharding.is_fully_replicated
        want = state_shardings(state, opt, got["rules"])
        for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(want)):
            assert x.sharding == s
        assert got["rules"].batch_spec == jax.sharding.PartitionSpec(BATCH[layout])
        # The step was traced under its mesh: impl="auto" would keep the kernels out.
        assert got["kernel_reasons"] and all(f"{n}-device mesh" in r
                                             for r in got["kernel_reasons"]), got["kernel_reasons"]
        assert set(got["step"].fp4_gathered) == FP4_GATHERED[layout], got["step"].fp4_gathered

    def compiled_hlo(got):
        """The compiled step (from the jit cache) as text."""
        jitted = got["step"].jitted._entry(got["state"])[1]  # noqa: SLF001
        return jitted.lower(got["state"], batches[0], "recipe").compile().as_text()

    t = time.perf_counter()
    def check_collectives(layout, got):
        """What XLA made of the layout (the compiled step, from the jit cache): data
        parallel all-reduces the gradients and gathers nothing; FSDP all-gathers the
        weights (at least one gather per sharded weight matrix); tensor parallel
        all-reduces (the row-split projections' outputs) and gathers no weight."""
        hlo = compiled_hlo(got)
        count = {op: len(re.findall(rf" {op}(-start)?\(", hlo))
                 for op in ("all-gather", "all-reduce")}
        results["collectives"] = {**results.get("collectives", {}), layout: count}
        if layout == "dp":
            assert count["all-gather"] == 0 and count["all-reduce"] >= 1, count
        elif layout in ("fsdp", "dp_fsdp"):
            assert count["all-gather"] >= 9, count  # q, k, v, o, gate, up, down, embed, head
        else:
            assert count["all-reduce"] >= 2, count

    runs = {None: run(None)}
    results["seconds"]["1 device"] = round(time.perf_counter() - t, 2)
    assert runs[None]["kernel_reasons"] == [None], runs[None]["kernel_reasons"]
    for layout in LAYOUTS:
        def one(layout=layout):
            got = runs[layout] = run(layout)
            compare(layout, runs[None], got)
            check_shardings(layout, got)
            check_collectives(layout, got)
        check(layout, one)

    def fp4_gather():
        """dp_fsdp with FP4 gathers vs the plain FSDP step (XLA gathers, fp4_gather=False)
        on the same mesh: the same losses and parameters; the compiled FP4 step
        all-gathers the down projection's weight only as uint8 codes and scales (no
        float copy of it, and no float gather inside its NVFP4 GEMMs), and its bytes
        gathered per step are >= 3x fewer than the plain step's in BF16."""
        plain, fp4 = run("dp_fsdp", fp4_gather=False), runs["dp_fsdp"]
        assert not plain["step"].fp4_gathered
        compare("dp_fsdp fp4 vs plain", plain, fp4)
        down = {"fp4": layer_gathers(compiled_hlo(fp4)),
                "plain": layer_gathers(compiled_hlo(plain))}
        assert down["fp4"] and all(g["dtype"] == "u8" for g in down["fp4"]), down["fp4"]
        # One gather of the codes (64x32 / 2 bytes) and one of the tile scales (4x2).
        assert sorted(g["elements"] for g in down["fp4"]) == [8, 1024], down["fp4"]
        assert any(g["dtype"] in FLOATS for g in down["plain"]), down["plain"]
        fp4_bytes = sum(g["bytes"] for g in down["fp4"])
        plain_bytes = sum(g["bytes"] for g in down["plain"])
        # XLA:CPU gathers float32 here (the model computes in float32); a BF16 model
        # on a GPU moves 2 bytes per element.
        plain_bf16 = sum(g["bytes"] * 2 // g["itemsize"] for g in down["plain"]
                         if g["dtype"] in FLOATS)
        results["gathered_bytes"] = {
            "fp4": fp4_bytes, "plain_as_compiled": plain_bytes, "plain_as_bf16": plain_bf16,
            "ratio_vs_bf16": plain_bf16 / fp4_bytes, "gathers": down}
        assert plain_bf16 >= 3 * fp4_bytes, results["gathered_bytes"]

    check("fp4 gather", fp4_gather)

    def linen():
        """A linen model annotated with nn.with_logical_partitioning (boxed parameters),
        its first Dense NVFP4 (dot_general_cls), trains on fsdp=2 x model=4 like on one
        device, sharded as annotated, with the NVFP4 kernel all-gathered over fsdp as
        codes and scales only (the model axis stays sharded: 16x16 per device)."""
        import flax.linen as nn

        def dense(features, names, nvfp4=False):
            kernel_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)
            return nn.Dense(features, use_bias=False, kernel_init=kernel_init,
                            dot_general_cls=fp4jax.flax.linen.dot_general_cls() if nvfp4
                            else None)

        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                h = nn.relu(dense(64, ("embed", "mlp"), nvfp4=True)(x))  # Dense_0
                return dense(32, ("mlp", "embed"))(h)

        model = MLP()
        x = jax.random.normal(jax.random.key(1), (32, 32))  # whole 16-token blocks per shard
        y = jnp.cos(x)
        params = model.init(jax.random.key(0), x)["params"]
        assert isinstance(params["Dense_0"]["kernel"], nn.LogicallyPartitioned)

        def loss_fn(p, b):
            return jnp.mean((model.apply({"params": p}, b[0]) - b[1]) ** 2)

        out = []
        for rules in (None, MeshRules(mesh=jax.make_mesh((2, 4), ("fsdp", "model")))):
            state = init_state(params, opt, 0, mesh_rules=rules)
            step = TrainStep(loss_fn, opt, mesh_rules=rules)
            for i in range(2):
                state, m = step(state, (x, y), step=i)
            out.append((float(m["loss"]), flat(state.params)))
        assert set(step.fp4_gathered) == {"Dense_0"}, step.fp4_gathered
        jitted = step.jitted._entry(state)[1]  # noqa: SLF001
        gathers = [g for g in all_gathers(jitted.lower(state, (x, y), "recipe").compile()
                                          .as_text()) if "_dot_general" in g["op_name"]]
        # The codes (32x64 / 2, over 4 model shards) and tile scales (2x4 / 4) of Dense_0.
        assert sorted((g["dtype"], g["elements"]) for g in gathers) == \
            [("u8", 2), ("u8", 256)], gathers
        kernel = state.params["Dense_0"]["kernel"].unbox()
        assert tuple(kernel.sharding.spec) == ("fsdp", "model"), kernel.sharding
        assert kernel.addressable_shards[0].data.shape == (16, 16), kernel.sharding
        assert abs(out[0][0] - out[1][0]) <= LOSS_RTOL * out[0][0], out
        for k, v in out[0][1].items():
            assert np.max(np.abs(v - out[1][1][k])) <= PARAM_ATOL, k

    check("linen", linen)

    def errors():
        """Uneven splits are errors naming the parameter or batch leaf."""
        rules = MeshRules(mesh=jax.make_mesh((8,), ("fsdp",)), param_rules=((r"w", ("embed",)),))
        try:
            rules.param_shardings({"w": jnp.zeros(12)})
        except ValueError as e:
            assert "parameter w of shape (12,): dimension 0 ('embed', size 12) does not " \
                   "split evenly over mesh axes 'fsdp' (8 devices)" in str(e), e
        else:
            raise AssertionError("no error for an uneven parameter split")
        loss_fn, params = build()
        step = TrainStep(loss_fn, opt, has_aux=True, mesh_rules=rules)
        try:
            step(init_state(params, opt, 0), (tokens[0, :6, :-1], tokens[0, :6, 1:]))
        except ValueError as e:
            assert "batch leaf 0 of shape (6, 16)" in str(e) and "(8 parts)" in str(e), e
        else:
            raise AssertionError("no error for an uneven batch")

    check("errors", errors)

    # ------------------------------------------------------------------ checkpoints

    def bits(tree):
        out = {}
        for k, x in leaves(tree).items():
            if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
                x = jax.random.key_data(x)
            out[k] = np.asarray(x).tobytes()
        return out

    def as_tree(state):
        return state._replace(rng=jax.random.key_data(state.rng))

    def same_bits(a, b):
        ba, bb = bits(as_tree(a)), bits(as_tree(b))
        assert ba.keys() == bb.keys()
        bad = [k for k in ba if ba[k] != bb[k]]
        assert not bad, f"not bit-identical: {bad[:5]}"

    def same_shardings(state, template):
        want = leaves(as_tree(template))
        for k, x in leaves(as_tree(state)).items():
            assert x.sharding.is_equivalent_to(want[k].sharding, x.ndim), (k, x.sharding)

    def rules_on(n, shape, names):
        return MeshRules(mesh=jax.make_mesh(shape, names, devices=jax.devices()[:n]))

    def roundtrip(name, state, template):
        with Checkpointer(os.path.join(tmp, name)) as ckpt:
            ckpt.save(state)
            restored = ckpt.restore(template)
        same_bits(restored, state)
        same_shardings(restored, template)
        return restored

    params0 = runs[None]["params0"]

    def same_mesh():
        """DP x TP: save, restore into a fresh template on the same mesh, bit-identical;
        one more step from the restored state equals one more from the saved one."""
        got = runs["dp_tp"]
        state = got["state"]
        template = init_state(params0, opt, 7, mesh_rules=got["rules"])
        restored = roundtrip("same", state, template)
        step, batch = got["step"], batches[0]
        a, _ = step(restored, batch)
        b, _ = step(state, batch)
        same_bits(a, b)

    def two_to_one():
        one = runs[None]["state"]
        on_two = jax.device_put(one, state_shardings(one, opt, rules_on(2, (2,), ("fsdp",))))
        assert len(on_two.params["embed"]["embedding"].get_value().sharding.device_set) == 2
        roundtrip("2to1", on_two, init_state(params0, opt, 7))

    def one_to_two():
        one = runs[None]["state"]
        template = init_state(params0, opt, 7, mesh_rules=rules_on(2, (2,), ("model",)))
        restored = roundtrip("1to2", one, template)
        x = restored.params["blocks"][0]["mlp"]["down"]["kernel"].get_value()
        assert x.addressable_shards[0].data.shape == (32, 32), x.sharding

    def eight_to_4x2():
        state = runs["fsdp"]["state"]
        template = init_state(params0, opt, 7, mesh_rules=rules_on(8, (4, 2), ("data", "model")))
        restored = roundtrip("8to4x2", state, template)
        x = restored.opt_state[0].mu["blocks"][0]["attn"]["q"]["kernel"].get_value()
        assert x.addressable_shards[0].data.shape == (32, 16), x.sharding

    check("checkpoint/same mesh", same_mesh)
    check("checkpoint/2 to 1", two_to_one)
    check("checkpoint/1 to 2", one_to_two)
    check("checkpoint/8 to 4x2", eight_to_4x2)

    # ------------------------------------------------------------------ the example

    def example():
        """examples/train_llama.py --mesh data=2,fsdp=2,model=2 trains two steps, its
        NVFP4 down projection (the other block matmuls kept BF16) gathering its weight
        in NVFP4 over fsdp."""
        import train_llama

        src = os.path.join(tmp, "corpus")
        rng = np.random.default_rng(0)
        for i in range(24):
            os.makedirs(os.path.join(src, f"p{i % 3}"), exist_ok=True)
            text = "".join(chr(c) for c in rng.integers(32, 127, 1500))
            with open(os.path.join(src, f"p{i % 3}", f"m{i}.py"), "w") as f:
                f.write(f"# {i}\n{text}\n")
        summary = train_llama.main([
            "--mesh", "data=2,fsdp=2,model=2", "--recipe", "nvfp4", "--steps", "2",
            "--keep", r".*\.attn\..*", "--keep", r".*\.mlp\.(gate|up)",
            "--dim", "32", "--layers", "1", "--heads", "4", "--batch", "8", "--seq", "16",
            "--eval-batches", "1", "--log-every", "1", "--data", src])
        assert summary["steps"] == 2 and np.isfinite(summary["final_val_bpb"]), summary
        assert summary["run_config"]["mesh"] == "data=2,fsdp=2,model=2"
        assert summary["fp4_gathered"] == ["blocks.0.mlp.down"], summary["fp4_gathered"]
        x = summary["final_state"].params["blocks"][0]["mlp"]["up"]["kernel"].get_value()
        assert tuple(x.sharding.spec) == ("fsdp", "model"), x.sharding
        assert x.addressable_shards[0].data.shape == (16, 64), x.sharding  # (32, 128) whole

    check("example --mesh", example)

    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
