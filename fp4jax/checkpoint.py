"""Checkpoints of a `fp4jax.train.TrainState` with orbax.

A checkpoint holds the FP32 master parameters, the optimizer state, the step, the
run's RNG key (as raw key data plus the key implementation's name) and the model's
non-parameter state (`TrainState.model_state`: batch statistics, ...), plus an
optional JSON dict of user metadata (e.g. the data-loader position). Restoring and
continuing is bit-identical to never having stopped: every key of a step derives
from ``fold_in(rng, step)``, so nothing else needs saving.

**Integrity.** Next to the arrays, a manifest records every leaf's path, shape, dtype
and CRC-32 (of its bytes on the host, at save time). `Checkpointer.restore`

* refuses a template that does not fit, in our words: the leaves only one side has
  (another optimizer or model), or a leaf's stored vs template shape and dtype (a
  bfloat16 template never silently downcasts the float32 masters);
* verifies every restored leaf's checksum: a mismatch (a corrupted file) raises
  `CorruptCheckpointError` naming the step and the leaf; with ``fallback=True`` it
  warns and restores the newest older step that verifies instead.

Checksums cover arrays this process can read whole (all of them on one host).

**Meshes.** A sharded state (`fp4jax.train.init_state(..., mesh_rules=...)`) is saved
shard by shard, and `Checkpointer.restore` reads every array straight into the
sharding of the template's array (orbax's sharding-aware restore): a template placed
on another mesh restores onto that mesh, bit for bit — 2 devices → 1, 1 → 2, 8 → 4×2
(``init_state(..., mesh_rules=other)`` or ``jax.device_put(state,
fp4jax.train.state_shardings(state, optimizer, other))`` builds it).

Crash safety comes from orbax: a step is written to a temporary directory and
renamed into place only when complete, so an interrupted save never replaces or
corrupts the last good checkpoint; leftover temporary directories are ignored by
`Checkpointer.latest_step` and removed when a `Checkpointer` is opened.
"""

from __future__ import annotations

import os
import warnings
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from fp4jax.train import TrainState

MANIFEST_VERSION = 1
"""Version of the manifest format (leaf path -> shape, dtype, CRC-32)."""


class CorruptCheckpointError(ValueError):
    """A checkpoint's data does not match the checksums stored with it."""


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _key_data(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _to_tree(state: TrainState) -> dict[str, Any]:
    tree = {
        "step": state.step,
        "params": state.params,
        "opt_state": state.opt_state,
        "rng": jax.random.key_data(state.rng),
    }
    if state.model_state is not None:
        tree["model_state"] = _key_data(state.model_state)
    return tree


def _abstract(tree: Any) -> Any:
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _key_name(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def leaves(tree: Any) -> dict[str, Any]:
    """``{"params/blocks/0/w": leaf, ...}``: every leaf by its slash-joined path."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(_key_name(k) for k in path): leaf for path, leaf in flat}


def _describe(shape: Any, dtype: Any) -> str:
    return f"{jnp.dtype(dtype).name}[{','.join(map(str, shape))}]"


def checksum(x: Any) -> int | None:
    """CRC-32 of an array's bytes (C order), or None if this process cannot read it whole."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return None
    a = np.ascontiguousarray(np.asarray(jax.device_get(x))).reshape(-1)
    return zlib.crc32(a.view(np.uint8).data)


def manifest(tree: Any) -> dict[str, Any]:
    """The JSON manifest of a checkpoint tree: shape, dtype and CRC-32 of every leaf."""
    return {
        "version": MANIFEST_VERSION,
        "leaves": {
            name: {"shape": list(np.shape(x)), "dtype": jnp.dtype(x.dtype).name,
                   "crc32": checksum(x)}
            for name, x in leaves(tree).items()
        },
    }


def _check_template(stored: dict[str, Any], template: dict[str, Any], step: int) -> None:
    only_stored = sorted(set(stored) - set(template))
    only_template = sorted(set(template) - set(stored))
    if only_stored or only_template:
        def show(names):
            return ", ".join(names[:6]) + (" ..." if len(names) > 6 else "")
        raise ValueError(
            f"checkpoint step {step} does not fit the template (another optimizer or model?): "
            f"only in the checkpoint: [{show(only_stored)}]; only in the template: "
            f"[{show(only_template)}]"
        )
    bad = []
    for name, x in template.items():
        s = stored[name]
        shape, dtype = tuple(np.shape(x)), jnp.dtype(x.dtype)
        if tuple(s["shape"]) != shape or jnp.dtype(s["dtype"]) != dtype:
            bad.append(f"{name}: stored {_describe(s['shape'], s['dtype'])}, "
                       f"template {_describe(shape, dtype)}")
    if bad:
        bad.sort(key=lambda b: (not b.startswith("params/"), b))  # the model's own first
        more = f"; and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise ValueError(
            f"checkpoint step {step} does not fit the template (another model size or "
            f"dtype? build the template like the saved state): {'; '.join(bad[:4])}{more}"
        )


def _verify(stored: dict[str, Any], restored: dict[str, Any], step: int) -> None:
    for name, x in restored.items():
        want = stored[name]["crc32"]
        got = checksum(x)
        if want is not None and got is not None and want != got:
            raise CorruptCheckpointError(
                f"checkpoint step {step} is corrupted: leaf {name} fails its checksum "
                f"(crc32 {got:#010x} read, {want:#010x} saved)"
            )


class Checkpointer:
    """Saves and restores `TrainState`\\ s in a directory (one subdirectory per step).

    Args:
      directory: where checkpoints live (created if missing).
      max_to_keep: keep only the newest this many (None: all).
      async_save: write in a background thread (`save` returns after copying the
        arrays off the device); call `wait_until_finished` or `close` before exit.

    Example:
      >>> import tempfile, jax.numpy as jnp, optax
      >>> from fp4jax.train import init_state
      >>> from fp4jax.checkpoint import Checkpointer
      >>> state = init_state({"w": jnp.arange(4.0)}, optax.adam(1e-3), 0)
      >>> with Checkpointer(tempfile.mkdtemp()) as ckpt:
      ...   _ = ckpt.save(state, metadata={"data_position": 0})
      ...   restored = ckpt.restore(state)
      ...   ckpt.latest_step(), restored.params["w"].tolist(), ckpt.metadata()["data_position"]
      (0, [0.0, 1.0, 2.0, 3.0], 0)
    """

    def __init__(
        self, directory: str | os.PathLike, *, max_to_keep: int | None = 3, async_save: bool = False
    ):
        if max_to_keep is not None and (not isinstance(max_to_keep, int) or max_to_keep < 1):
            raise ValueError(f"max_to_keep must be a positive int or None, got {max_to_keep!r}")
        self.directory = epath.Path(os.path.abspath(os.fspath(directory)))
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                enable_async_checkpointing=async_save,
                cleanup_tmp_directories=True,
                create=True,
            ),
        )

    def save(
        self, state: TrainState, *, metadata: dict[str, Any] | None = None, force: bool = True
    ) -> bool:
        """Saves ``state`` under its step number.

        Args:
          state: the `TrainState`.
          metadata: JSON-serializable extras (stored next to the arrays).
          force: save even if a checkpoint policy would skip this step.

        Returns:
          Whether a save was started.
        """
        if not isinstance(state, TrainState):
            raise TypeError(f"state must be a TrainState, got {type(state).__name__}")
        step = int(state.step)
        meta = {"step": step, "rng_impl": str(jax.random.key_impl(state.rng)), **(metadata or {})}
        tree = _to_tree(state)
        return self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta),
                manifest=ocp.args.JsonSave(manifest(tree)),
            ),
            force=force,
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of all complete checkpoints, ascending."""
        return sorted(self._manager.all_steps())

    def restore(
        self, template: TrainState, *, step: int | None = None, fallback: bool = False
    ) -> TrainState:
        """Restores the checkpoint of ``step`` (default: the latest), verified.

        Args:
          template: a `TrainState` with the same structure, shapes and dtypes (e.g.
            a freshly initialized one, with ``model_state`` if the saved one had it);
            each array is restored with the sharding of the template's (any mesh).
          step: which checkpoint.
          fallback: if that checkpoint is corrupted, warn and restore the newest
            older one that verifies.

        Raises:
          FileNotFoundError: if there is no checkpoint.
          ValueError: if the template does not fit (which leaf, stored vs template).
          CorruptCheckpointError: if a leaf fails its checksum (and no fallback).
        """
        if not isinstance(template, TrainState):
            raise TypeError(f"template must be a TrainState, got {type(template).__name__}")
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        candidates = [step] + (sorted((s for s in self.all_steps() if s < step), reverse=True)
                               if fallback else [])
        for i, s in enumerate(candidates):
            try:
                state = self._restore_verified(template, s)
            except CorruptCheckpointError as e:
                if i + 1 == len(candidates):
                    raise
                warnings.warn(f"{e}; restoring step {candidates[i + 1]} instead", stacklevel=2)
                continue
            return state
        raise AssertionError("unreachable")

    def _restore_verified(self, template: TrainState, step: int) -> TrainState:
        tree = _to_tree(template)
        stored = self._manifest(step)
        if stored is not None:
            _check_template(stored, leaves(tree), step)
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(tree)))
            )["state"]
        except (ValueError, KeyError, OSError) as e:
            if stored is None:
                raise
            raise CorruptCheckpointError(
                f"checkpoint step {step} is corrupted: orbax could not read it ({e})"
            ) from e
        if stored is not None:
            _verify(stored, leaves(restored), step)
        model_state = None
        if template.model_state is not None:
            model_state = jax.tree.map(
                lambda t, x: jax.random.wrap_key_data(x, impl=jax.random.key_impl(t))
                if _is_key(t) else x,
                template.model_state, restored["model_state"],
            )
        return TrainState(
            step=jnp.asarray(restored["step"]),
            params=restored["params"],
            opt_state=restored["opt_state"],
            rng=jax.random.wrap_key_data(restored["rng"], impl=jax.random.key_impl(template.rng)),
            model_state=model_state,
        )

    def _manifest(self, step: int) -> dict[str, Any] | None:
        """The manifest's leaves saved with ``step`` (None for a checkpoint without one)."""
        if not (self.directory / str(step) / "manifest").exists():
            return None
        args = ocp.args.Composite(manifest=ocp.args.JsonRestore())
        return dict(self._manager.restore(step, args=args)["manifest"])["leaves"]

    def metadata(self, step: int | None = None) -> dict[str, Any]:
        """The JSON metadata saved with ``step`` (default: the latest)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        args = ocp.args.Composite(meta=ocp.args.JsonRestore())
        return dict(self._manager.restore(step, args=args)["meta"])

    def wait_until_finished(self) -> None:
        """Blocks until an asynchronous save has been committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases resources."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
