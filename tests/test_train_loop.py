"""The examples' training loop: device prefetch, deferred metrics, and the same run as before."""

import json
import os
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))

import data  # noqa: E402
import train_llama  # noqa: E402
from llama import LlamaConfig  # noqa: E402

STEPS = 5


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "DevicePrefetcher"]


@pytest.fixture(scope="module")
def setup():
    """A tiny Llama (compiled once for the module) and its data."""
    tokens = np.random.default_rng(0).integers(0, 256, 4000).astype(np.uint8)
    batches = data.Batches(tokens, batch=2, seq=8, seed=0)
    val = data.validation_batches(tokens, batch=2, seq=8, max_batches=1)
    cfg = train_llama.RunConfig(recipe="bf16", batch=2, seq=8, log_every=1, eval_every=2,
                                eval_batches=1, eval_bf16_forward=False)
    trainer = train_llama.Trainer(LlamaConfig(dim=16, layers=1, heads=2, dtype="float32"), cfg,
                                  STEPS)
    return trainer, batches, val


def _step_by_step(trainer, batch_fn, steps):
    """The loop as it was: host batches converted on the loop's thread, one at a time."""
    state = trainer.init(steps)
    losses = []
    for i in range(steps):
        x, y = batch_fn(i)
        state, metrics = trainer.step(state, (jnp.asarray(x), jnp.asarray(y)), step=i)
        losses.append(float(metrics["loss"]))
    return losses, state


def _leaves(tree):
    return [np.asarray(a) for a in jax.tree.leaves(tree)]


def test_loop_matches_the_step_by_step_loop_bit_for_bit(setup, tmp_path):
    """Prefetching, deferred metrics and flow control change no number: every step's loss
    and the final parameters equal the plain loop's bitwise. The losses tell batches apart
    (a swapped pair of batches gives other losses), so a reordered or dropped batch fails;
    records stay in step order (the training record before the validation one)."""
    trainer, batches, val = setup
    summary = train_llama.train(trainer, batches, val, steps=STEPS, out=str(tmp_path),
                                progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    ref_losses, ref_state = _step_by_step(trainer, batches, STEPS)
    assert losses == ref_losses and len(losses) == STEPS
    assert all(np.array_equal(a, b) for a, b in zip(_leaves(summary["final_state"].params),
                                                    _leaves(ref_state.params)))
    swapped = _step_by_step(trainer, lambda i: batches({1: 2, 2: 1}.get(i, i)), STEPS)[0]
    assert swapped[:1] == ref_losses[:1] and swapped[1] != ref_losses[1]
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)
    assert ["loss" in r for r in records if r["step"] == 2] == [True, False]  # then val
    assert summary["compilations"] == 1 and summary["tokens_seen"] == STEPS * 2 * 8
    assert summary["paused_s"] > 0 and summary["step_time_s"] > 0  # evaluations timed apart


def test_prefetcher_yields_every_batch_in_order_on_the_device_and_ends_cleanly():
    calls = []

    def batch_fn(i):
        calls.append(i)
        return np.full((2,), i), {"y": np.arange(3) + i}

    with data.DevicePrefetcher(batch_fn, 2, 9, depth=2) as feed:
        got = list(feed)
    assert [i for i, _ in got] == list(range(2, 9)) == calls
    assert all(isinstance(b[0], jax.Array) and int(b[0][0]) == i and int(b[1]["y"][0]) == i
               for i, b in got)
    assert list(feed) == [] and not _prefetch_threads()
    with pytest.raises(ValueError, match="depth"):
        data.DevicePrefetcher(batch_fn, 0, 1, depth=0)


def test_prefetcher_stops_on_errors_and_early_exits_without_leaking_its_thread():
    """An error in the batch function is raised at its place in the order; leaving the
    loop early (break, an exception in the loop body) stops the thread, even one blocked
    on a full queue."""

    def failing(i):
        if i == 3:
            raise KeyError("batch 3")
        return np.zeros(1)

    seen = []
    with pytest.raises(KeyError, match="batch 3"):
        for i, _ in data.DevicePrefetcher(failing, 0, 10):
            seen.append(i)
    assert seen == [0, 1, 2] and not _prefetch_threads()
    with data.DevicePrefetcher(lambda i: np.zeros(1), 0, 1000, depth=1) as feed:
        next(feed)
    assert not _prefetch_threads()
    with pytest.raises(RuntimeError, match="in the loop"):
        with data.DevicePrefetcher(lambda i: np.zeros(1), 0, 1000) as feed:
            for _ in feed:
                raise RuntimeError("in the loop")
    assert not _prefetch_threads()


def test_training_loop_that_fails_mid_run_leaves_no_prefetch_thread(setup):
    trainer, batches, val = setup

    def failing(i):
        if i == 2:
            raise OSError("disk gone")
        return batches(i)

    with pytest.raises(OSError, match="disk gone"):
        train_llama.train(trainer, failing, val, steps=STEPS, progress=False)
    assert not _prefetch_threads()


@pytest.mark.fresh_compilation
def test_the_first_step_in_a_later_precision_mode_is_timed_apart_from_the_steps(tmp_path):
    """The first step of the BF16-forward tail compiles the tail's program: its time is
    ``mode_switch_s``, not spread over ``step_time_s`` (a tiny step takes milliseconds,
    a compilation far longer)."""
    tokens = np.random.default_rng(0).integers(0, 256, 4000).astype(np.uint8)
    batches = data.Batches(tokens, batch=2, seq=16, seed=0)
    val = data.validation_batches(tokens, batch=2, seq=16, max_batches=1)
    # Every layer kept in BF16: the two modes' programs compile in a second or so each,
    # and the switch still compiles the second.
    cfg = train_llama.RunConfig(recipe="nvfp4", batch=2, seq=16, log_every=1, eval_every=0,
                                eval_batches=1, eval_bf16_forward=False, bf16_forward_tail=0.5,
                                keep_patterns=(r".*",))
    trainer = train_llama.Trainer(LlamaConfig(dim=32, layers=1, heads=2), cfg, 8)
    summary = train_llama.train(trainer, batches, val, steps=8, progress=False)
    assert summary["compilations"] == 2  # the recipe's step and the tail's
    assert summary["mode_switch_s"] > 10 * summary["step_time_s"] > 0
