"""An Optax-compatible, jit-compiled NVFP4 training step with a precision schedule.

* **State**: `TrainState` — FP32 master parameters, the optax state, the step count
  and the run's ``jax.random`` key. Every step uses the SR key
  ``fold_in(rng, step)``; each fp4jax layer folds in its own name
  (`fp4jax.layer_key`), so keys differ per layer and per step and depend only on
  the run key — a resumed run draws the same bits as an uninterrupted one.
* **Step**: `TrainStep` differentiates ``loss_fn(params, batch)`` inside
  `fp4jax.flax.step_scope`, clips the gradient by global norm, applies any
  ``optax.GradientTransformation`` and returns metrics (loss, gradient norm, the
  loss function's aux values) as device arrays.
* **Precision schedule** (RECIPE.md §8): a `PrecisionSchedule` picks the `Mode` for
  each step on the host; the mode is a static argument of the jitted step, so the
  step compiles once per mode — one recompilation at the switch, none per step.
* **Diagnostics**: `make_diagnostics_step` runs a forward pass that records
  per-layer quantization statistics (`fp4jax.diagnostics`); call it every N steps.
  The training step itself never computes them.

The model enters through ``loss_fn(params, batch) -> loss`` (or ``(loss, aux)``
with ``has_aux=True``): for nnx use `nnx_loss_fn`; for linen
``lambda p, b: loss(model.apply({"params": p}, b["x"]), b)``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fp4jax.flax import scope as scope_lib
from fp4jax.flax.scope import Mode

LossFn = Callable[[Any, Any], Any]
"""``loss_fn(params, batch) -> loss`` or ``-> (loss, aux: dict)``."""


class TrainState(NamedTuple):
    """Everything a training run needs to continue bit-exactly.

    Attributes:
      step: int32 scalar, the number of steps taken.
      params: float32 master parameters (a pytree).
      opt_state: the optax state for ``params``.
      rng: the run's ``jax.random`` key; step ``s`` uses ``fold_in(rng, s)``.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def _as_key(key: Any) -> jax.Array:
    if isinstance(key, int) and not isinstance(key, bool):
        return jax.random.key(key)
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"key must be a single key, got shape {key.shape}")
        return key
    raise TypeError(f"key must be an int seed or a typed jax.random.key, got {key!r}")


def init_state(
    params: Any, optimizer: optax.GradientTransformation, key: jax.Array | int
) -> TrainState:
    """Creates a `TrainState`: floating parameters become float32 masters (copies).

    Args:
      params: the model parameters (e.g. ``nnx.state(model, nnx.Param)``).
      optimizer: any ``optax.GradientTransformation``.
      key: the run key (a typed ``jax.random.key``) or an int seed.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from fp4jax.train import init_state
      >>> s = init_state({"w": jnp.ones((2,), jnp.bfloat16)}, optax.adam(1e-3), 0)
      >>> s.params["w"].dtype, int(s.step)
      (dtype('float32'), 0)
    """
    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(
            f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}"
        )
    # Copies, so that a step with donated buffers never invalidates the caller's arrays.
    params = jax.tree.map(
        lambda p: jnp.array(p, dtype=jnp.float32 if jnp.issubdtype(p.dtype, jnp.floating) else None,
                            copy=True),
        params,
    )
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=_as_key(key),
    )


def step_key(rng: jax.Array, step: jax.Array | int) -> jax.Array:
    """The SR key of one step: ``fold_in(rng, step)``."""
    return jax.random.fold_in(rng, step)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrecisionSchedule:
    """Which precision `Mode` each step uses (RECIPE.md §8).

    Steps ``< switch_step`` use ``before``, the others ``after``; no switch when
    ``switch_step`` is None.

    Attributes:
      switch_step: first step of the ``after`` mode, or None.
      before: the mode before the switch.
      after: the mode from the switch on.

    Example:
      >>> from fp4jax.train import PrecisionSchedule
      >>> s = PrecisionSchedule.bf16_forward_tail(total_steps=100, fraction=0.2)
      >>> s.switch_step, s.mode(79), s.mode(80)
      (80, 'recipe', 'bf16_forward')
    """

    switch_step: int | None = None
    before: Mode = "recipe"
    after: Mode = "bf16_forward"

    def __post_init__(self):
        scope_lib.check_mode(self.before)
        scope_lib.check_mode(self.after)
        s = self.switch_step
        if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
            raise ValueError(f"switch_step must be None or an int >= 0, got {s!r}")

    @classmethod
    def bf16_forward_tail(cls, *, total_steps: int, fraction: float) -> "PrecisionSchedule":
        """Forward GEMMs in BF16 for the last ``fraction`` of ``total_steps``."""
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
        tail = round(fraction * total_steps)
        return cls(switch_step=total_steps - tail if tail else None)

    def mode(self, step: int) -> Mode:
        """The mode of ``step`` (a host int)."""
        if self.switch_step is None or step < self.switch_step:
            return self.before
        return self.after


def _split_loss(out: Any, has_aux: bool) -> tuple[jax.Array, Mapping[str, Any]]:
    if not has_aux:
        return out, {}
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError("with has_aux=True, loss_fn must return (loss, aux_dict)")
    loss, aux = out
    if not isinstance(aux, Mapping):
        raise TypeError(f"aux must be a dict of metrics, got {type(aux).__name__}")
    return loss, aux


def _check_loss(loss: Any) -> jax.Array:
    if not hasattr(loss, "shape") or loss.shape != ():
        raise TypeError(f"loss_fn must return a scalar loss, got {getattr(loss, 'shape', loss)!r}")
    return loss


class TrainStep:
    """A jit-compiled training step; one compiled program per precision mode.

    Call it as ``state, metrics = step(state, batch, step=i)``. ``step`` (a host
    int equal to ``state.step``) selects the schedule's mode without a device sync;
    omitted, it is read from ``state.step`` (which waits for the previous step).

    Args:
      loss_fn: ``loss_fn(params, batch) -> loss`` (or ``(loss, aux)``).
      optimizer: any ``optax.GradientTransformation`` (the one `init_state` used).
      has_aux: ``loss_fn`` returns ``(loss, aux_dict)``; aux values become metrics.
      max_grad_norm: clip the gradient to this global norm (None: no clipping).
        Stateless, so the optimizer state does not depend on it.
      schedule: the `PrecisionSchedule` (default: the layers' recipes throughout).
      donate: donate the input state's buffers (saves memory; the old state is
        invalid afterwards).

    Metrics: ``loss``, ``grad_norm`` (before clipping) and the aux values.

    Example:
      >>> import jax, jax.numpy as jnp, optax, fp4jax
      >>> from fp4jax.train import TrainStep, init_state
      >>> dg = fp4jax.flax.DotGeneral(name="w")
      >>> def loss_fn(params, batch):
      ...   y = dg(batch["x"], params["w"], (((1,), (0,)), ((), ())))
      ...   return jnp.mean((y - batch["y"]) ** 2)
      >>> batch = {"x": jnp.ones((16, 32)), "y": jnp.zeros((16, 16))}
      >>> state = init_state({"w": jnp.ones((32, 16))}, optax.sgd(0.01), 0)
      >>> train_step = TrainStep(loss_fn, optax.sgd(0.01), max_grad_norm=1.0)
      >>> state, metrics = train_step(state, batch, step=0)
      >>> int(state.step), float(metrics["grad_norm"]) > 1.0
      (1, True)
    """

    def __init__(
        self,
        loss_fn: LossFn,
        optimizer: optax.GradientTransformation,
        *,
        has_aux: bool = False,
        max_grad_norm: float | None = None,
        schedule: PrecisionSchedule | None = None,
        donate: bool = False,
    ):
        if not callable(loss_fn):
            raise TypeError("loss_fn must be callable")
        if not isinstance(optimizer, optax.GradientTransformation):
            raise TypeError(
                f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}"
            )
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive or None, got {max_grad_norm!r}")
        schedule = PrecisionSchedule() if schedule is None else schedule
        if not isinstance(schedule, PrecisionSchedule):
            raise TypeError(f"schedule must be a PrecisionSchedule, got {type(schedule).__name__}")
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.has_aux = has_aux
        self.max_grad_norm = max_grad_norm
        self.schedule = schedule
        self.traces = 0
        """How many times the step was traced (≈ compiled): one per mode used."""
        self.jitted = jax.jit(
            self._step, static_argnames=("mode",), donate_argnums=(0,) if donate else ()
        )

    def _step(self, state: TrainState, batch: Any, mode: Mode) -> tuple[TrainState, dict]:
        self.traces += 1
        key = step_key(state.rng, state.step)

        def wrapped(params):
            with scope_lib.step_scope(key, mode=mode):
                loss, aux = _split_loss(self.loss_fn(params, batch), self.has_aux)
            return _check_loss(loss), aux

        (loss, aux), grads = jax.value_and_grad(wrapped, has_aux=True)(state.params)
        grad_norm = optax.tree.norm(grads)
        if self.max_grad_norm is not None:
            scale = jnp.minimum(1.0, self.max_grad_norm / jnp.maximum(grad_norm, 1e-30))
            grads = jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = TrainState(
            step=state.step + 1, params=params, opt_state=opt_state, rng=state.rng
        )
        metrics = {"loss": loss, "grad_norm": grad_norm, **aux}
        return new_state, metrics

    def mode(self, step: int) -> Mode:
        """The precision mode of ``step``."""
        return self.schedule.mode(step)

    def __call__(
        self, state: TrainState, batch: Any, *, step: int | None = None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        if not isinstance(state, TrainState):
            raise TypeError(f"state must be a TrainState, got {type(state).__name__}")
        step = int(state.step) if step is None else step
        return self.jitted(state, batch, mode=self.schedule.mode(step))

    def num_compiled(self) -> int:
        """Number of compiled programs in the jit cache (one per mode used)."""
        return self.jitted._cache_size()  # noqa: SLF001


_EVAL_KEY_SEED = 0  # forward passes never consume SR bits; any fixed key does


def make_eval_step(
    loss_fn: LossFn, *, has_aux: bool = False
) -> Callable[..., dict[str, jax.Array]]:
    """A jitted forward pass: ``eval_step(params, batch, mode="recipe") -> metrics``.

    Runs ``loss_fn`` inside a `fp4jax.flax.step_scope` with a fixed key (the forward
    GEMMs round to nearest; the key only feeds backward passes, which do not run).

    Example:
      >>> import jax.numpy as jnp
      >>> from fp4jax.train import make_eval_step
      >>> make_eval_step(lambda p, b: jnp.sum(p * b))(jnp.ones(3), jnp.ones(3))["loss"]
      Array(3., dtype=float32)
    """

    @functools.partial(jax.jit, static_argnames=("mode",))
    def eval_step(params, batch, mode: Mode = "recipe"):
        with scope_lib.step_scope(jax.random.key(_EVAL_KEY_SEED), mode=mode):
            loss, aux = _split_loss(loss_fn(params, batch), has_aux)
        return {"loss": _check_loss(loss), **aux}

    return eval_step


def make_diagnostics_step(
    loss_fn: LossFn, *, has_aux: bool = False
) -> Callable[..., tuple[dict[str, jax.Array], dict[str, Any]]]:
    """A jitted forward pass that records per-layer quantization statistics.

    ``diag_step(params, batch, mode="recipe") -> (metrics, stats)`` where ``stats``
    maps each quantized layer's name to ``{"x": ..., "w": ...}`` statistics of its
    forward-GEMM operands (`fp4jax.diagnostics.tensor_stats`). Layers whose forward
    GEMM is not quantized under ``mode`` are absent. Use
    `fp4jax.diagnostics.flatten` to log them.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.train import make_diagnostics_step
      >>> dg = fp4jax.flax.DotGeneral(name="w")
      >>> loss = lambda p, b: jnp.sum(dg(b, p, (((1,), (0,)), ((), ()))))
      >>> _, stats = make_diagnostics_step(loss)(jnp.ones((32, 16)), jnp.ones((4, 32)))
      >>> sorted(stats["w"]["x"])
      ['amax', 'flush_to_zero', 'rel_error', 'saturated_blocks', 'underflow_blocks']
    """

    @functools.partial(jax.jit, static_argnames=("mode",))
    def diag_step(params, batch, mode: Mode = "recipe"):
        with scope_lib.step_scope(
            jax.random.key(_EVAL_KEY_SEED), mode=mode, diagnostics=True
        ) as scope:
            loss, aux = _split_loss(loss_fn(params, batch), has_aux)
        return {"loss": _check_loss(loss), **aux}, dict(scope.stats)

    return diag_step


def nnx_loss_fn(model: Any, loss: Callable[[Any, Any], Any]) -> tuple[LossFn, Any]:
    """Turns ``loss(model, batch)`` on an nnx model into ``(loss_fn(params, batch), params)``.

    The model is split into its graph, its ``nnx.Param`` state (the trained
    parameters) and the rest; ``loss_fn`` merges them back inside the trace. The
    non-parameter state (e.g. batch-norm statistics, RNG counters) is held
    constant — models that update it during training need their own loop. Write
    trained parameters back with ``nnx.update(model, state.params)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from fp4jax.train import nnx_loss_fn
      >>> model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
      >>> loss_fn, params = nnx_loss_fn(model, lambda m, x: jnp.sum(m(x) ** 2))
      >>> float(loss_fn(params, jnp.zeros((1, 4))))
      0.0
    """
    from flax import nnx  # noqa: PLC0415 - keep fp4jax.train importable without nnx in use

    if not isinstance(model, nnx.Module):
        raise TypeError(f"model must be an nnx.Module, got {type(model).__name__}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_fn(p, batch):
        return loss(nnx.merge(graphdef, p, rest), batch)

    return loss_fn, params
