"""Checkpoints of a `fp4jax.train.TrainState` with orbax.

A checkpoint holds the FP32 master parameters, the optimizer state, the step and
the run's RNG key (as raw key data plus the key implementation's name), plus an
optional JSON dict of user metadata (e.g. the data-loader position). Restoring and
continuing is bit-identical to never having stopped: the SR key of every step is
``fold_in(rng, step)``, so nothing else needs saving.

Crash safety comes from orbax: a step is written to a temporary directory and
renamed into place only when complete, so an interrupted save never replaces or
corrupts the last good checkpoint; leftover temporary directories are ignored by
`Checkpointer.latest_step` and removed when a `Checkpointer` is opened.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from fp4jax.train import TrainState


def _to_tree(state: TrainState) -> dict[str, Any]:
    return {
        "step": state.step,
        "params": state.params,
        "opt_state": state.opt_state,
        "rng": jax.random.key_data(state.rng),
    }


def _abstract(tree: Any) -> Any:
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


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
        return self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(_to_tree(state)), meta=ocp.args.JsonSave(meta)
            ),
            force=force,
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of all complete checkpoints, ascending."""
        return sorted(self._manager.all_steps())

    def restore(self, template: TrainState, *, step: int | None = None) -> TrainState:
        """Restores the checkpoint of ``step`` (default: the latest).

        Args:
          template: a `TrainState` with the same structure, shapes and dtypes (e.g.
            a freshly initialized one); its arrays' shardings are used.
          step: which checkpoint.

        Raises:
          FileNotFoundError: if there is no checkpoint.
        """
        if not isinstance(template, TrainState):
            raise TypeError(f"template must be a TrainState, got {type(template).__name__}")
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_abstract(_to_tree(template)))
            ),
        )
        tree = restored["state"]
        impl = jax.random.key_impl(template.rng)
        return TrainState(
            step=jnp.asarray(tree["step"]),
            params=tree["params"],
            opt_state=tree["opt_state"],
            rng=jax.random.wrap_key_data(tree["rng"], impl=impl),
        )

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

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
