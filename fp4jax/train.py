"""An Optax-compatible, jit-compiled NVFP4 training step with a precision schedule.

* **State**: `TrainState` — FP32 master parameters, the optax state, the step count,
  the run's ``jax.random`` key and the model's non-parameter state (batch
  statistics, ...). Every step uses the step key ``fold_in(rng, step)``; each fp4jax
  layer folds in its own name (`fp4jax.layer_key`), and the model's own randomness
  (dropout) uses `fp4jax.keys.model_key` of it, so keys differ per layer and per
  step and depend only on the run key — a resumed run draws the same bits as an
  uninterrupted one.
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
* **Mesh**: with ``mesh_rules=`` (a `fp4jax.parallel.MeshRules`: a device mesh and
  logical-axis rules) `init_state` places the state and `TrainStep` compiles the step
  with in/out shardings: data parallel, FSDP, tensor parallel or products of them
  (`state_shardings`). SR keys do not depend on the mesh, so a run's result does not
  depend on its device count beyond floating-point summation order. Under FSDP the
  NVFP4 layers' weights are gathered as NVFP4 codes and scales
  (`fp4jax.parallel.MeshRules.fp4_gather`; `TrainStep.fp4_gathered` names them). The
  step is traced under the mesh, so ``impl="auto"`` keeps the single-device Pallas
  kernels out of it (`fp4jax.implementation.mesh_reason`). `make_eval_step` and
  `make_diagnostics_step` take the same ``mesh_rules`` and follow their inputs'
  shardings (the state's parameters, a batch placed with ``mesh_rules.batch_sharding()``).

The model enters through ``loss_fn(params, batch) -> loss`` (or ``(loss, aux)``
with ``has_aux=True``): for nnx use `nnx_loss_fn`; for linen
``lambda p, b: loss(model.apply({"params": p}, b["x"]), b)``. A model with state
that changes while training (BatchNorm statistics, dropout) uses
``has_state=True``: ``loss_fn(params, model_state, batch, key) -> (out,
new_model_state)``, where ``key`` is the step's `fp4jax.keys.model_key` (for linen:
``rngs={"dropout": key}``); `nnx_loss_fn` with ``has_state=True`` builds it for nnx.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import zlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fp4jax import keys
from fp4jax.flax import scope as scope_lib
from fp4jax.flax.policy import ROOT_NAME
from fp4jax.flax.scope import Mode
from fp4jax.parallel import MeshRules, path_name
from fp4jax.weight_gather import FP4Gather

LossFn = Callable[..., Any]
"""``loss_fn(params, batch) -> loss`` or ``-> (loss, aux: dict)``; with ``has_state``:
``loss_fn(params, model_state, batch, key) -> (that, new_model_state)``."""


class TrainState(NamedTuple):
    """Everything a training run needs to continue bit-exactly.

    Attributes:
      step: int32 scalar, the number of steps taken.
      params: float32 master parameters (a pytree).
      opt_state: the optax state for ``params``.
      rng: the run's typed ``jax.random`` key; step ``s`` uses ``fold_in(rng, s)``.
      model_state: the model's non-parameter state (BatchNorm statistics, RNG
        streams, ...), updated by each step of a ``has_state`` `TrainStep`; None
        for a stateless model.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    model_state: Any = None


def _as_key(key: Any) -> jax.Array:
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    try:
        return keys.typed_key(key, "key")
    except TypeError:
        raise TypeError(
            "key must be an int seed or a jax.random key (jax.random.key(seed) or "
            f"jax.random.PRNGKey(seed)), got {type(key).__name__} {key!r}"
        ) from None


def init_state(
    params: Any,
    optimizer: optax.GradientTransformation,
    key: jax.Array | int,
    *,
    model_state: Any = None,
    mesh_rules: MeshRules | None = None,
) -> TrainState:
    """Creates a `TrainState`: floating parameters become float32 masters (copies).

    Args:
      params: the model parameters (e.g. ``nnx.state(model, nnx.Param)``).
      optimizer: any ``optax.GradientTransformation``.
      key: the run key: an int seed, a typed ``jax.random.key`` or a raw
        ``jax.random.PRNGKey`` (stored typed).
      model_state: the model's non-parameter state (from ``nnx_loss_fn(...,
        has_state=True)``, or linen's non-``params`` collections); copied as is.
      mesh_rules: place the state on this mesh (`state_shardings`): parameters as
        the rules say, the optimizer state like its parameters (created sharded,
        never whole on one device), the rest replicated.

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
    _check_mesh_rules(mesh_rules)
    # Copies, so that a step with donated buffers never invalidates the caller's arrays.
    params = jax.tree.map(
        lambda p: jnp.array(p, dtype=jnp.float32 if jnp.issubdtype(p.dtype, jnp.floating) else None,
                            copy=True),
        params,
    )
    if model_state is not None:
        model_state = jax.tree.map(lambda x: jnp.array(x, copy=True), model_state)
    if mesh_rules is not None:
        shardings = _state_shardings(mesh_rules, optimizer, params, model_state)
        params = jax.device_put(params, shardings.params)
        return TrainState(
            step=jax.device_put(jnp.zeros((), jnp.int32), shardings.step),
            params=params,
            opt_state=jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params),
            rng=jax.device_put(_as_key(key), shardings.rng),
            model_state=jax.device_put(model_state, shardings.model_state),
        )
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=_as_key(key),
        model_state=model_state,
    )
    # Committed to their current devices, like the arrays a checkpoint restores: a
    # resumed run then reuses the compiled step instead of compiling it again.
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding), state)


def _check_mesh_rules(mesh_rules: Any) -> None:
    if mesh_rules is not None and not isinstance(mesh_rules, MeshRules):
        raise TypeError(
            f"mesh_rules must be a fp4jax.parallel.MeshRules, got {type(mesh_rules).__name__}"
        )


def _state_shardings(
    mesh_rules: MeshRules, optimizer: optax.GradientTransformation, params: Any, model_state: Any
) -> TrainState:
    param_shardings = mesh_rules.param_shardings(params)
    return TrainState(
        step=mesh_rules.replicated(),
        params=param_shardings,
        opt_state=mesh_rules.optimizer_shardings(optimizer, params, param_shardings),
        rng=mesh_rules.replicated(),
        model_state=None if model_state is None else mesh_rules.annotated_shardings(model_state),
    )


def state_shardings(
    state: TrainState, optimizer: optax.GradientTransformation, mesh_rules: MeshRules
) -> TrainState:
    """The `NamedSharding` of every array of ``state`` on ``mesh_rules``' mesh.

    Parameters as the rules say (`fp4jax.parallel.MeshRules.param_shardings`), each
    optimizer-state leaf like the parameter it belongs to, the model state as annotated
    (else replicated), the step and the run key replicated. ``jax.device_put(state,
    state_shardings(...))`` moves a state onto another mesh; a `fp4jax.checkpoint`
    template so placed restores onto that mesh.

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> from fp4jax.parallel import MeshRules
      >>> from fp4jax.train import init_state, state_shardings
      >>> rules = MeshRules(mesh=jax.make_mesh((1,), ("fsdp",)), param_rules=((".*", ("embed",)),))
      >>> state = init_state({"w": jnp.ones(4)}, optax.adam(1e-3), 0)
      >>> state_shardings(state, optax.adam(1e-3), rules).opt_state[0].mu["w"].spec
      P('fsdp',)
    """
    if not isinstance(state, TrainState):
        raise TypeError(f"state must be a TrainState, got {type(state).__name__}")
    _check_mesh_rules(mesh_rules)
    if mesh_rules is None:
        raise TypeError("mesh_rules must be a fp4jax.parallel.MeshRules, got None")
    return _state_shardings(mesh_rules, optimizer, state.params, state.model_state)


def _traced_under(mesh_rules: MeshRules | None) -> contextlib.AbstractContextManager:
    """The context a step is traced in: the rules' mesh (abstract, usable inside a trace),
    where `fp4jax.FP4Gather` finds its axes and the kernel choice sees the device count."""
    if mesh_rules is None:
        return contextlib.nullcontext()
    return jax.sharding.use_abstract_mesh(mesh_rules.auto_mesh.abstract_mesh)


def _weight_gathers(mesh_rules: MeshRules | None, params: Any) -> dict:
    return {} if mesh_rules is None else mesh_rules.fp4_gathers(params)


def layer_names(params: Any) -> tuple[str, ...]:
    """The names of the layers that may hold ``params``' matrices, for the step scope.

    A Flax matmul layer named ``N`` (its module path) holds its weight as parameter
    ``N.kernel`` (a model that is one layer: ``kernel``, the layer being named
    `fp4jax.flax.policy.ROOT_NAME`); a layer may also be named after its weight
    (``N``). The step scope derives these names' SR keys on entry, all at once
    (`fp4jax.flax.step_scope`'s ``layer_names``): the names are guesses that cost
    nothing when wrong, since a layer not listed derives its own key, the same one.

    Returns:
      The dotted path of every parameter of two or more dimensions, without its
      trailing ``.value`` (nnx variables, linen boxes) and ``.kernel``, in order.

    Example:
      >>> import jax.numpy as jnp
      >>> from fp4jax.train import layer_names
      >>> layer_names({"up": {"kernel": jnp.ones((4, 8)), "bias": jnp.ones(8)},
      ...              "w": jnp.ones((8, 2))})
      ('up', 'w')
    """
    out = []
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        if np.ndim(x) < 2:
            continue
        name = path_name(path)
        name = name.removesuffix(".value")
        name = ROOT_NAME if name == "kernel" else name.removesuffix(".kernel")
        out.append(name)
    return tuple(dict.fromkeys(out))


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
    def bf16_forward_tail(cls, *, total_steps: int, fraction: float) -> PrecisionSchedule:
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
    int equal to ``state.step``) selects the schedule's mode. This object keeps the
    host copy of the step count of the state it returned last, so calls on that
    state never wait for the device: omitted, ``step`` is that copy; passed, it is
    checked against it (a mismatch is a `ValueError`). Only the first call on a state
    from elsewhere (a fresh or restored one) reads ``state.step``, which waits for
    the device.

    Args:
      loss_fn: ``loss_fn(params, batch) -> loss`` (or ``(loss, aux)``); with
        ``has_state``, ``loss_fn(params, model_state, batch, key) -> (that,
        new_model_state)``.
      optimizer: any ``optax.GradientTransformation`` (the one `init_state` used).
      has_aux: ``loss_fn`` returns ``(loss, aux_dict)``; aux values become metrics.
      has_state: the model has non-parameter state (``TrainState.model_state``) that
        the loss function updates; ``key`` is the step's `fp4jax.keys.model_key`
        (dropout masks: fresh each step, the same on resume).
      max_grad_norm: clip the gradient to this global norm (None: no clipping).
        Stateless, so the optimizer state does not depend on it.
      schedule: the `PrecisionSchedule` (default: the layers' recipes throughout).
      donate: donate the input state's buffers (saves memory; the old state is
        invalid afterwards).
      mesh_rules: run on this mesh (`fp4jax.parallel.MeshRules`): the step is
        compiled with in/out shardings, the state's from `state_shardings` (a state
        placed otherwise, e.g. a plain `init_state`, is moved there on its first
        step) and the batch split over the rules' batch axes along every leaf's
        leading dimension (pass host arrays, or arrays placed with
        ``mesh_rules.batch_sharding()``). Metrics come back replicated. Under FSDP the
        NVFP4 layers gather their weights in NVFP4 unless ``mesh_rules.fp4_gather`` is
        False (`fp4_gathered`).

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
        has_state: bool = False,
        max_grad_norm: float | None = None,
        schedule: PrecisionSchedule | None = None,
        donate: bool = False,
        mesh_rules: MeshRules | None = None,
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
        self.has_state = bool(has_state)
        self.max_grad_norm = max_grad_norm
        self.schedule = schedule
        _check_mesh_rules(mesh_rules)
        self.mesh_rules = mesh_rules
        self.traces = 0
        """How many times the step was traced (≈ compiled): one per mode used."""
        self.fp4_gathered: dict[str, FP4Gather] = {}
        """``{layer name: fp4jax.FP4Gather}``: the layers whose FSDP-sharded weights the
        compiled steps gather as NVFP4 codes and scales (filled when a step is traced)."""
        donate_argnums = (0,) if donate else ()
        if mesh_rules is None:
            self.jitted = jax.jit(self._step, static_argnames=("mode",),
                                  donate_argnums=donate_argnums)
        else:
            self.jitted = _ShardedStep(self._step, optimizer, mesh_rules, donate_argnums)
        self._last_step: tuple[jax.Array, int] | None = None  # (state.step returned, value)
        self._donate_argnums = donate_argnums
        self._vmapped: Callable | None = None

    def vmapped(self) -> Callable[..., tuple[TrainState, dict]]:
        """This step over a stack of independent states: ``fn(states, batches, mode=...)
        -> (states, metrics)``, jitted (one program per mode, this step's donation).

        Every leaf of ``states`` and ``batches`` carries a leading axis of the same size:
        entry ``i`` is a run of its own (its parameters, optimizer state, run key and
        data), e.g. several seeds of one model trained as one program. Each run follows
        the recipe as in a single-run step; the batched GEMMs may sum in another order,
        so a run's results are not bitwise those of the single-run step.

        Raises:
          ValueError: for a step on a mesh (``mesh_rules``): the stack would need its
            own sharding.

        Example:
          >>> import jax, jax.numpy as jnp, optax
          >>> from fp4jax.train import TrainStep, init_state
          >>> step = TrainStep(lambda p, b: jnp.sum((p * b) ** 2), optax.sgd(0.1))
          >>> runs = [init_state(jnp.ones(3), optax.sgd(0.1), seed) for seed in (0, 1)]
          >>> states = jax.tree.map(lambda *x: jnp.stack(x), *runs)
          >>> states, metrics = step.vmapped()(states, jnp.ones((2, 3)), mode="recipe")
          >>> metrics["loss"].shape
          (2,)
        """
        if self.mesh_rules is not None:
            raise ValueError("TrainStep.vmapped: a step on a mesh (mesh_rules) cannot be "
                             "vmapped over runs; train the runs one at a time")
        if self._vmapped is None:
            def batched(states, batches, mode: Mode):
                return jax.vmap(lambda s, b: self._step(s, b, mode))(states, batches)

            self._vmapped = jax.jit(batched, static_argnames=("mode",),
                                    donate_argnums=self._donate_argnums)
        return self._vmapped

    def _step(self, state: TrainState, batch: Any, mode: Mode) -> tuple[TrainState, dict]:
        with _traced_under(self.mesh_rules):
            return self._traced_step(state, batch, mode)

    def _traced_step(self, state: TrainState, batch: Any, mode: Mode) -> tuple[TrainState, dict]:
        self.traces += 1
        key = step_key(state.rng, state.step)
        # FSDP: the parameters enter the loss sharded as the rules say. A weight that an
        # NVFP4 layer quantizes is quantized per shard and gathered as codes and scales
        # (the scope's weight_gathers); XLA gathers the others where they are used.
        gathers = _weight_gathers(self.mesh_rules, state.params)
        names = layer_names(state.params)  # their SR keys: two hashes on entry for all

        def wrapped(params):
            with scope_lib.step_scope(key, mode=mode, weight_gathers=gathers,
                                      layer_names=names) as scope:
                out, model_state = call_loss(
                    self.loss_fn, params, batch, has_state=self.has_state,
                    model_state=state.model_state, key=keys.model_key(key),
                )
                loss, aux = _split_loss(out, self.has_aux)
            self.fp4_gathered.update(scope.fp4_gathered)
            return _check_loss(loss), (aux, model_state)

        (loss, (aux, model_state)), grads = jax.value_and_grad(wrapped, has_aux=True)(
            state.params
        )
        grad_norm = optax.tree.norm(grads)
        if self.max_grad_norm is not None:
            scale = jnp.minimum(1.0, self.max_grad_norm / jnp.maximum(grad_norm, 1e-30))
            grads = jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = TrainState(
            step=state.step + 1, params=params, opt_state=opt_state, rng=state.rng,
            model_state=model_state,
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
        if self.has_state and state.model_state is None:
            raise ValueError(
                "TrainStep(has_state=True) needs state.model_state: "
                "init_state(params, optimizer, key, model_state=...)"
            )
        if not self.has_state and state.model_state is not None:
            raise ValueError(
                "state.model_state is set but this TrainStep ignores it: pass "
                "has_state=True (with loss_fn(params, model_state, batch, key))"
            )
        step = self._check_step(state, step)
        if self.mesh_rules is not None:
            self.mesh_rules.check_batch(batch)
            if not self._returned(state):  # a fresh or restored state: put it on the mesh
                state = jax.device_put(state, self.jitted.shardings(state))
        new_state, metrics = self.jitted(state, batch, mode=self.schedule.mode(step))
        self._last_step = (new_state.step, step + 1)
        return new_state, metrics

    def _check_step(self, state: TrainState, step: Any) -> int:
        """The host step number: the host copy kept for the state this object returned
        last (no device sync), else read from ``state.step``; ``step`` is checked
        against it."""
        if step is not None and (isinstance(step, bool) or not hasattr(step, "__index__")):
            raise TypeError(f"step must be an int (the host copy of state.step), got {step!r}")
        last = self._last_step
        actual = last[1] if self._returned(state) else int(state.step)
        if step is None:
            return actual
        step = operator.index(step)
        if step != actual:
            raise ValueError(
                f"step={step} but state.step is {actual}: pass the step number of the state "
                "(it selects the precision mode), or omit step= to read it from the state"
            )
        return step

    def _returned(self, state: TrainState) -> bool:
        """Whether ``state`` is the one this object returned last."""
        return self._last_step is not None and state.step is self._last_step[0]

    def num_compiled(self) -> int:
        """Number of compiled programs in the jit cache (one per mode used)."""
        return self.jitted._cache_size()  # noqa: SLF001


class _ShardedStep:
    """``jax.jit`` of a step with the in/out shardings of each state structure it sees.

    The state's shardings depend on its structure (the parameters' annotations, the
    optimizer state), so the jitted function is built for a structure on first use.
    """

    def __init__(self, fn: Callable, optimizer: optax.GradientTransformation,
                 mesh_rules: MeshRules, donate_argnums: tuple[int, ...]):
        self.fn, self.optimizer, self.mesh_rules = fn, optimizer, mesh_rules
        self.donate_argnums = donate_argnums
        self._by_structure: dict[Any, tuple[TrainState, Any]] = {}

    def _entry(self, state: TrainState) -> tuple[TrainState, Any]:
        structure = jax.tree.structure(state)
        if structure not in self._by_structure:
            shardings = state_shardings(state, self.optimizer, self.mesh_rules)
            jitted = jax.jit(
                self.fn, static_argnums=(2,), donate_argnums=self.donate_argnums,
                in_shardings=(shardings, self.mesh_rules.batch_sharding()),
                out_shardings=(shardings, self.mesh_rules.replicated()),
            )
            self._by_structure[structure] = (shardings, jitted)
        return self._by_structure[structure]

    def shardings(self, state: TrainState) -> TrainState:
        """The in/out shardings of ``state`` (`state_shardings`)."""
        return self._entry(state)[0]

    def __call__(self, state: TrainState, batch: Any, *, mode: Mode) -> tuple[TrainState, dict]:
        return self._entry(state)[1](state, batch, mode)  # pjit: no kwargs with in_shardings

    def lower(self, state: TrainState, batch: Any, mode: Mode = "recipe") -> jax.stages.Lowered:
        """``jax.jit(...).lower`` for ``state``'s structure, as for the unsharded step's
        ``jitted``: compile ahead of time (``.compile()``) or read the HLO."""
        return self._entry(state)[1].lower(state, batch, mode)

    def _cache_size(self) -> int:
        return sum(j._cache_size() for _, j in self._by_structure.values())  # noqa: SLF001


_EVAL_KEY_SEED = 0  # forward passes never consume SR bits; any fixed key does


def make_eval_step(
    loss_fn: LossFn, *, has_aux: bool = False, has_state: bool = False,
    mesh_rules: MeshRules | None = None,
) -> Callable[..., dict[str, jax.Array]]:
    """A jitted forward pass: ``eval_step(params, batch, mode="recipe") -> metrics``.

    Runs ``loss_fn`` inside a `fp4jax.flax.step_scope` with a fixed key (the forward
    GEMMs round to nearest; the key only feeds backward passes, which do not run).
    With ``has_state``, pass ``model_state=`` (its updates are dropped); build the
    loss function from the model in eval mode (``model.eval()`` before `nnx_loss_fn`).
    With ``mesh_rules`` (the `TrainStep`'s) it is traced under that mesh and gathers
    FSDP-sharded NVFP4 weights like the training step.

    Example:
      >>> import jax.numpy as jnp
      >>> from fp4jax.train import make_eval_step
      >>> make_eval_step(lambda p, b: jnp.sum(p * b))(jnp.ones(3), jnp.ones(3))["loss"]
      Array(3., dtype=float32)
    """

    _check_mesh_rules(mesh_rules)

    @functools.partial(jax.jit, static_argnames=("mode",))
    def eval_step(params, batch, mode: Mode = "recipe", model_state=None):
        key = jax.random.key(_EVAL_KEY_SEED)
        with (_traced_under(mesh_rules),
              scope_lib.step_scope(key, mode=mode,
                                   weight_gathers=_weight_gathers(mesh_rules, params))):
            out, _ = call_loss(loss_fn, params, batch, has_state=has_state,
                               model_state=model_state, key=keys.model_key(key))
            loss, aux = _split_loss(out, has_aux)
        return {"loss": _check_loss(loss), **aux}

    return eval_step


def make_diagnostics_step(
    loss_fn: LossFn, *, has_aux: bool = False, has_state: bool = False,
    mesh_rules: MeshRules | None = None,
) -> Callable[..., tuple[dict[str, jax.Array], dict[str, Any]]]:
    """A jitted forward pass that records per-layer quantization statistics.

    ``diag_step(params, batch, mode="recipe") -> (metrics, stats)`` where ``stats``
    maps each quantized layer's name to ``{"x": ..., "w": ...}`` statistics of its
    forward-GEMM operands (`fp4jax.diagnostics.tensor_stats`). Layers whose forward
    GEMM is not quantized under ``mode`` are absent, and so are stacked layers (run
    inside ``scan``/``vmap``). Use `fp4jax.diagnostics.flatten` to log them. With
    ``has_state``, pass ``model_state=``; ``mesh_rules`` as for `make_eval_step`.

    Example:
      >>> import jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.train import make_diagnostics_step
      >>> dg = fp4jax.flax.DotGeneral(name="w")
      >>> loss = lambda p, b: jnp.sum(dg(b, p, (((1,), (0,)), ((), ()))))
      >>> _, stats = make_diagnostics_step(loss)(jnp.ones((32, 16)), jnp.ones((4, 32)))
      >>> sorted(stats["w"]["x"])
      ['amax', 'flush_to_zero', 'rel_error', 'saturated_blocks', 'underflow_blocks']
    """

    _check_mesh_rules(mesh_rules)

    @functools.partial(jax.jit, static_argnames=("mode",))
    def diag_step(params, batch, mode: Mode = "recipe", model_state=None):
        key = jax.random.key(_EVAL_KEY_SEED)
        with (_traced_under(mesh_rules),
              scope_lib.step_scope(key, mode=mode, diagnostics=True,
                                   weight_gathers=_weight_gathers(mesh_rules, params)) as scope):
            out, _ = call_loss(loss_fn, params, batch, has_state=has_state,
                               model_state=model_state, key=keys.model_key(key))
            loss, aux = _split_loss(out, has_aux)
        return {"loss": _check_loss(loss), **aux}, dict(scope.stats)

    return diag_step


def call_loss(
    loss_fn: LossFn, params: Any, batch: Any, *, has_state: bool, model_state: Any,
    key: jax.Array,
) -> tuple[Any, Any]:
    """``(loss_fn's output, new model_state)`` for either calling convention."""
    if not has_state:
        return loss_fn(params, batch), model_state
    res = loss_fn(params, model_state, batch, key)
    if not (isinstance(res, tuple) and len(res) == 2):
        raise TypeError(
            "with has_state=True, loss_fn(params, model_state, batch, key) must return "
            "(loss or (loss, aux), new_model_state)"
        )
    return res


def _stream_key(key: jax.Array, path: tuple, shape: tuple[int, ...]) -> jax.Array:
    """The step's key for the RNG stream at ``path`` (one per stacked copy)."""
    k = jax.random.fold_in(key, zlib.crc32(".".join(map(str, path)).encode()) & 0x7FFFFFFF)
    return jax.random.split(k, shape) if shape else k


def reseed_nnx(model: Any, key: jax.Array) -> None:
    """Reseeds every RNG stream of an nnx model from ``key``, by the stream's path.

    Each ``nnx.RngStream`` (e.g. the one an ``nnx.Dropout(rngs=...)`` forks) gets the
    key ``fold_in(key, crc32(path))`` (split over its stack axes for stacked layers)
    and a zero count: its draws are a pure function of the step key, fresh every step,
    identical on resume, and two streams never share keys.
    """
    from flax import nnx

    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.RngStream):
            shape = tuple(node.key.shape)
            node.key.set_value(_stream_key(key, path, shape))
            node.count.set_value(jnp.zeros(shape, jnp.uint32))


def nnx_loss_fn(
    model: Any, loss: Callable[[Any, Any], Any], *, has_state: bool = False
) -> tuple[Any, ...]:
    """Turns ``loss(model, batch)`` on an nnx model into a loss function over its parameters.

    The model is split into its graph, its ``nnx.Param`` state (the trained
    parameters) and the rest (the model state: batch statistics, RNG streams, the
    SR indices of stacked layers); ``loss_fn`` merges them back inside the trace.

    * ``has_state=False`` returns ``(loss_fn(params, batch), params)``; the rest is
      held constant. A model whose state changes while training (an RNG stream, e.g.
      of ``nnx.Dropout(rngs=...)``, or a ``nnx.BatchNorm`` in training mode) is
      refused: its updates would be lost silently.
    * ``has_state=True`` returns ``(loss_fn(params, model_state, batch, key),
      params, model_state)`` for ``TrainStep(..., has_state=True)`` and
      ``init_state(..., model_state=model_state)``. Each call reseeds the model's RNG
      streams from ``key`` (`reseed_nnx`) and returns the updated state (the RNG
      streams as they came in: they carry nothing from step to step).

    The graph (e.g. BatchNorm's training/eval mode) is fixed when this is called:
    call ``model.eval()`` first for an evaluation loss. Write trained values back
    with ``nnx.update(model, state.params)`` (and ``state.model_state``).

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

    if has_state:
        def stateful_loss_fn(p, model_state, batch, key):
            # Fresh Variables in this trace (the caller's may belong to an outer one).
            m = nnx.merge(graphdef, p, jax.tree.map(lambda x: x, model_state))
            rngs = jax.tree.map(lambda x: x, nnx.state(m, nnx.RngState))  # a snapshot
            reseed_nnx(m, keys.typed_key(key, "key"))
            out = loss(m, batch)
            nnx.update(m, rngs)
            return out, nnx.split(m, nnx.Param, ...)[2]

        return stateful_loss_fn, params, rest

    from fp4jax.flax.nnx import path_name

    changing = [
        path_name(path) for path, node in nnx.iter_graph(model)
        if isinstance(node, nnx.RngStream)
        or (isinstance(node, nnx.BatchNorm) and not node.use_running_average)
    ]
    if changing:
        raise ValueError(
            f"the model has state that changes while training ({', '.join(changing)}: RNG "
            "streams or BatchNorm in training mode); use nnx_loss_fn(model, loss, "
            "has_state=True) with init_state(..., model_state=...) and "
            "TrainStep(..., has_state=True)"
        )

    def loss_fn(p, batch):
        # Fresh Variables inside the trace (the model's own live outside it), so that
        # nnx.scan/vmap can read the constant state.
        return loss(nnx.merge(graphdef, p, jax.tree.map(lambda x: x, rest)), batch)

    return loss_fn, params
