"""fp4jax.checkpoint: bit-identical resume and crash-safe saves."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import fp4jax
from fp4jax.checkpoint import Checkpointer
from fp4jax.train import TrainStep, init_state, nnx_loss_fn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _leaves_bits(tree):
    out = []
    for x in jax.tree.leaves(tree):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        out.append(np.asarray(x).reshape(-1).view(np.uint8).tobytes())
    return out


def test_resume_is_bit_identical(tmp_path):
    """2N steps straight == N steps, save, restore into a fresh state, N more steps:
    parameters, Adam moments, step and RNG key agree bit for bit, and so do the losses
    (the SR keys of the resumed steps are the same because the run key was restored)."""
    model = nnx.Linear(32, 16, rngs=nnx.Rngs(0))
    fp4jax.flax.nnx.quantize(model)
    loss_fn, params = nnx_loss_fn(model, lambda m, b: jnp.mean((m(b[0]) - b[1]) ** 2))
    data = np.random.default_rng(0).standard_normal((6, 2, 32, 32)).astype(np.float32)
    batch = lambda i: (jnp.asarray(data[i, 0]), jnp.asarray(data[i, 1, :, :16]))  # noqa: E731
    tx = optax.adamw(1e-2)
    step = TrainStep(loss_fn, tx, max_grad_norm=1.0)
    n = 3

    straight, losses = init_state(params, tx, 42), []
    for i in range(2 * n):
        straight, m = step(straight, batch(i), step=i)
        losses.append(np.asarray(m["loss"]))

    half = init_state(params, tx, 42)
    for i in range(n):
        half, _ = step(half, batch(i), step=i)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(half, metadata={"data_position": n})
    with Checkpointer(tmp_path / "ckpt") as ckpt:  # a new manager, as after a restart
        template = init_state(params, tx, 7)  # another run key: it must be overwritten
        resumed = ckpt.restore(template)
        start = ckpt.metadata()["data_position"]
    resumed_losses = []
    for i in range(start, 2 * n):
        resumed, m = step(resumed, batch(i), step=i)
        resumed_losses.append(np.asarray(m["loss"]))

    assert _leaves_bits(resumed) == _leaves_bits(straight)
    assert [x.tobytes() for x in resumed_losses] == [x.tobytes() for x in losses[n:]]


_CRASH = textwrap.dedent(
    """
    import os, signal, sys
    import jax.numpy as jnp, optax
    from orbax.checkpoint._src.path import atomicity
    from fp4jax.checkpoint import Checkpointer
    from fp4jax.train import init_state

    state = init_state({"w": jnp.arange(4096.0)}, optax.adam(1e-3), 0)
    ckpt = Checkpointer(sys.argv[1])
    ckpt.save(state._replace(step=jnp.int32(1)))  # the last good checkpoint

    async def crash(self, *args, **kwargs):  # all data written, commit not yet done
        os.kill(os.getpid(), signal.SIGKILL)

    atomicity.AtomicRenameTemporaryPath.finalize = crash
    ckpt.save(state._replace(step=jnp.int32(2), params={"w": jnp.zeros(4096)}))
    print("save returned: the crash did not happen", flush=True)
    """
)


def test_interrupted_save_leaves_the_last_checkpoint_readable(tmp_path):
    """A process killed (SIGKILL) in the middle of saving step 2 leaves a temporary
    directory behind, but the checkpoint of step 1 is still the latest and restores
    intact, and saving again works."""
    d = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _CRASH, str(d)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    leftovers = [p for p in os.listdir(d) if "tmp" in p]
    assert leftovers, os.listdir(d)  # the interrupted save really had started

    template = init_state({"w": jnp.zeros(4096)}, optax.adam(1e-3), 0)
    with Checkpointer(d) as ckpt:
        assert ckpt.latest_step() == 1 and ckpt.all_steps() == [1]
        restored = ckpt.restore(template)
        np.testing.assert_array_equal(restored.params["w"], np.arange(4096.0))
        assert int(restored.step) == 1
        ckpt.save(restored._replace(step=jnp.int32(2)))
        assert ckpt.latest_step() == 2


def test_restore_without_checkpoint_and_bad_input_are_clear_errors(tmp_path):
    with Checkpointer(tmp_path / "empty") as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            ckpt.restore(init_state({"w": jnp.zeros(2)}, optax.sgd(1.0), 0))
        with pytest.raises(TypeError, match="TrainState"):
            ckpt.save({"w": jnp.zeros(2)})
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer(tmp_path / "x", max_to_keep=0)


def test_async_saves_and_retention(tmp_path):
    """Asynchronous saves commit on wait; only the newest max_to_keep remain."""
    state = init_state({"w": jnp.arange(8.0)}, optax.sgd(1.0), 0)
    with Checkpointer(tmp_path / "a", max_to_keep=2, async_save=True) as ckpt:
        for s in range(1, 4):
            ckpt.save(state._replace(step=jnp.int32(s)))
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [2, 3]


def _corrupt_largest_array_file(step_dir):
    """Flips one byte in the middle of the largest data file of a saved step (the
    random parameters): orbax alone restores such a file without complaint."""
    files = [p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"]
    f = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def test_corrupted_array_is_detected_and_fallback_restores_the_previous_step(tmp_path):
    """A checksum per array is stored at save time and verified on restore: a corrupted
    array file is an error naming the step and the leaf; with fallback=True the newest
    checkpoint that verifies is restored instead (with a warning)."""
    w = np.random.default_rng(0).standard_normal(2048).astype(np.float32)
    state = init_state({"w": jnp.asarray(w)}, optax.sgd(1.0), 0)
    with Checkpointer(tmp_path / "c") as ckpt:
        ckpt.save(state._replace(step=jnp.int32(1)))
        ckpt.save(state._replace(step=jnp.int32(2), params={"w": jnp.asarray(w + 1)}))
    _corrupt_largest_array_file(tmp_path / "c" / "2")
    with Checkpointer(tmp_path / "c") as ckpt:
        with pytest.raises(ValueError, match=r"step 2.*params/w.*checksum"):
            ckpt.restore(state)
        with pytest.warns(UserWarning, match="step 2"):
            restored = ckpt.restore(state, fallback=True)
    assert int(restored.step) == 1 and np.array_equal(restored.params["w"], w)


def test_restoring_into_another_model_or_precision_says_which_leaf(tmp_path):
    """Another shape, another optimizer or a bfloat16 template are refused in our words:
    the leaf, the stored and the expected shape/dtype (never a silent downcast of the
    float32 masters)."""
    state = init_state({"w": jnp.zeros((4, 8))}, optax.adam(1e-3), 0)
    with Checkpointer(tmp_path / "c") as ckpt:
        ckpt.save(state)
        with pytest.raises(ValueError, match=r"params/w: stored float32\[4,8\], template "
                                             r"float32\[4,16\]"):
            ckpt.restore(init_state({"w": jnp.zeros((4, 16))}, optax.adam(1e-3), 0))
        with pytest.raises(ValueError, match="another optimizer or model"):
            ckpt.restore(init_state({"w": jnp.zeros((4, 8))}, optax.sgd(1e-3), 0))
        bf16 = state._replace(params={"w": jnp.zeros((4, 8), jnp.bfloat16)})
        with pytest.raises(ValueError, match=r"params/w: stored float32\[4,8\], template "
                                             r"bfloat16\[4,8\]"):
            ckpt.restore(bf16)
