"""The step scope: how a training step hands SR keys and the precision mode to layers.

A quantized layer needs, at every step, a fresh stochastic-rounding key of its own
(RECIPE.md §5), and the training step may switch the forward GEMMs to BF16 near the
end of training (RECIPE.md §8). Neither should be threaded through the user's model
code, and neither may live in hidden global state. fp4jax uses a *dynamic scope*:

.. code-block:: python

    def loss_fn(params, batch, step_key):      # the function you jit / differentiate
        with fp4jax.flax.step_scope(step_key):  # entered *inside* the trace
            return model_loss(params, batch)

While the scope is open, each fp4jax layer (`fp4jax.flax.DotGeneral`, the nnx/linen
adapters) derives its key as ``fp4jax.layer_key(step_key, layer_name)`` — different
per layer and per step, and a pure function of the step key, so runs are
reproducible. A layer called ``i > 0`` times more within one scope (weight sharing)
folds ``i`` in again, and each of several stacked copies of a layer (``nnx.scan``,
``nnx.vmap``, linen ``nn.scan``) folds in its own index (see `fp4jax.flax.nnx` and
`fp4jax.flax.linen`). The scope is a `contextvars.ContextVar` set on entry and reset
on exit: it carries nothing across ``jit`` boundaries and nothing from one step to
the next. `fp4jax.train` opens it for you.

Each key derivation (``fold_in``) is a threefry hash that the compiler handles as a
unit of its own, and every quantized layer needs two (its layer key, then its
operands' keys, `fp4jax.quantized_dot.role_key_table`). Given the layers' names up
front (``layer_names``; `fp4jax.train` passes its parameters' paths), the scope derives
all those layers' keys on entry with two batched hashes, and each layer's first call
looks its keys up: the same bits, O(1) hashes per step instead of O(layers). Other
calls (repeated calls ``name#i``, stacked copies, names not listed) derive theirs as
above.

Outside a scope a layer has no key: its forward pass (which rounds to nearest) works,
and only a backward pass that rounds stochastically raises.

Under FSDP the scope also says which weights to gather in NVFP4 (``weight_gathers``,
filled by `fp4jax.train` from `fp4jax.parallel.MeshRules.fp4_gathers`): a layer without
its own ``rhs_gather`` asks `Scope.rhs_gather` for the `fp4jax.FP4Gather` of its weight.

Rule: open the scope **inside** the jitted function, so the key is a traced value.
A scope opened outside a ``jit`` around a jitted model would bake the key into the
compiled program as a constant.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, get_args

import jax
from jax.sharding import PartitionSpec

from fp4jax import keys, quantized_dot, weight_gather
from fp4jax.recipe import Recipe
from fp4jax.weight_gather import FP4Gather

WeightGathers = Mapping[str, tuple[tuple[int, ...], FP4Gather]]
"""``{parameter path: (its shape, its FP4Gather)}`` (`fp4jax.parallel.MeshRules.fp4_gathers`)."""

Mode = Literal["recipe", "bf16_forward", "bf16_backward", "bf16"]
"""How the precision schedule modifies every layer's recipe:

* ``"recipe"``: as configured;
* ``"bf16_forward"``: the fprop GEMM in BF16 (`Recipe.with_bf16_forward`, RECIPE.md §8);
* ``"bf16_backward"``: the dgrad and wgrad GEMMs in BF16;
* ``"bf16"``: no quantization at all.
"""

MODES: tuple[str, ...] = get_args(Mode)


def check_mode(mode: Any) -> str:
    """Returns ``mode`` or raises `ValueError` if it is not a `Mode`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def apply_mode(recipe: Recipe, mode: Mode) -> Recipe:
    """The recipe a layer uses under a precision ``mode``.

    Example:
      >>> import fp4jax
      >>> from fp4jax.flax import apply_mode
      >>> apply_mode(fp4jax.Recipe.nvfp4(), "bf16_forward").fprop_lhs.format
      'unquantized'
      >>> apply_mode(fp4jax.Recipe.nvfp4(), "bf16").is_bf16
      True
    """
    check_mode(mode)
    if mode == "recipe" or recipe.is_bf16:
        return recipe
    if mode == "bf16_forward":
        return recipe.with_bf16_forward()
    if mode == "bf16_backward":
        return recipe.with_bf16_backward()
    return Recipe.bf16()


def _check_layer_names(names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of distinct str (first occurrence kept), or a TypeError."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"layer_names must be an iterable of str (layer names), got "
                        f"{type(names).__name__} {names!r}"[:200])
    names = list(names)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"layer_names must hold str, got {type(name).__name__} {name!r}")
    return tuple(dict.fromkeys(names))


def _check_key(key: Any) -> jax.Array | None:
    if key is None:
        return None
    try:
        return keys.check_key(key, "step_scope key")
    except TypeError as e:
        raise TypeError(
            f"{e}; step_scope needs a jax.random key (e.g. jax.random.fold_in(run_key, step))"
        ) from None


@dataclasses.dataclass(kw_only=True, eq=False)
class Scope:
    """The state of one open `step_scope` (trace-time only).

    Attributes:
      key: the step key, or None (then a backward pass that rounds stochastically
        raises).
      mode: the precision `Mode` applied to every layer's recipe.
      diagnostics: whether layers record quantization statistics (`fp4jax.diagnostics`).
      stats: per-layer statistics recorded while ``diagnostics`` is on, keyed by
        layer name (``name#i`` for the ``i``-th repeated call).
      weight_gathers: the FSDP-sharded parameters to gather in NVFP4 (`WeightGathers`).
      fp4_gathered: the layers that gathered NVFP4 copies of their weight, by name
        (recorded by the layers).
      layer_names: layers whose keys are derived on creation, all at once (`layer_key`,
        `role_table`); any other name derives its own when asked.
    """

    key: jax.Array | None
    mode: Mode = "recipe"
    diagnostics: bool = False
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    weight_gathers: WeightGathers = dataclasses.field(default_factory=dict)
    fp4_gathered: dict[str, FP4Gather] = dataclasses.field(default_factory=dict)
    layer_names: tuple[str, ...] = ()
    _calls: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
    _rows: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
    _layer_keys: jax.Array | None = dataclasses.field(default=None, repr=False)
    _role_tables: jax.Array | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        self.layer_names = _check_layer_names(self.layer_names)
        if self.key is not None and self.layer_names:
            # Two batched hashes for all listed layers: their layer keys, then the six
            # operand keys of each (bit for bit the per-call derivations).
            self._rows = {name: i for i, name in enumerate(self.layer_names)}
            self._layer_keys = keys.layer_keys(self.key, self.layer_names)
            self._role_tables = jax.vmap(quantized_dot.role_key_table)(self._layer_keys)

    def next_call(self, name: str) -> str:
        """Counts a call of layer ``name``; returns its call id (``name`` or ``name#i``)."""
        i = self._calls.get(name, 0)
        self._calls[name] = i + 1
        return name if i == 0 else f"{name}#{i}"

    def layer_key(self, call_id: str, salt: jax.Array | None = None) -> jax.Array | None:
        """``fp4jax.layer_key(key, name)``, folded with ``i`` for call ``name#i``, then
        with ``salt`` if given (a stacked layer's index, see `fp4jax.flax.nnx.SRIndex`)."""
        if self.key is None:
            return None
        name, _, i = call_id.partition("#")
        row = self._rows.get(name)
        k = keys.layer_key(self.key, name) if row is None else self._layer_keys[row]
        k = jax.random.fold_in(k, int(i)) if i else k
        return k if salt is None else jax.random.fold_in(k, salt)

    def role_table(self, call_id: str, salt: jax.Array | None = None) -> jax.Array | None:
        """The operand keys of call ``call_id`` derived on entry
        (``quantized_dot.role_key_table(self.layer_key(call_id))``, for
        ``dot_general(role_table=)``), or None: no key, a name not in ``layer_names``, a
        repeated call (``name#i``) or a ``salt`` (derive from `layer_key` instead)."""
        row = self._rows.get(call_id)
        if self.key is None or salt is not None or row is None:
            return None
        return self._role_tables[row]

    def rhs_gather(self, name: str, rhs_shape: tuple[int, ...],
                   dimension_numbers: Any) -> FP4Gather | None:
        """The `fp4jax.FP4Gather` for layer ``name``'s right operand (its weight), or None.

        The weight is parameter ``name + ".kernel"`` (Flax's matmul layers) or ``name``
        of `weight_gathers`, of shape ``rhs_shape`` (a stacked layer's parameter has
        extra leading axes, unsharded, which its scan/vmap slices off). None when there
        is no such parameter, its shape differs (the layer reshaped it), or a shard
        would not hold whole 16-blocks (`fp4jax.weight_gather.holds_whole_blocks`): XLA
        then gathers the weight itself.
        """
        entry = self.weight_gathers.get(f"{name}.kernel") or self.weight_gathers.get(name)
        if entry is None:
            return None
        shape, gather = entry
        lead = len(shape) - len(rhs_shape)
        if lead < 0 or tuple(shape[lead:]) != tuple(rhs_shape) or any(gather.spec[:lead]):
            return None
        spec = PartitionSpec(*gather.spec[lead:])
        mesh = jax.sharding.get_abstract_mesh()
        used = {a for e in spec for a in weight_gather.mesh_axes(e)}
        if mesh.empty or not used <= set(mesh.axis_names) or not used & set(gather.axes):
            return None
        ndim = len(rhs_shape)
        (_, contracting), (_, batch) = ((tuple(d % ndim for d in dims) for dims in pair)
                                        for pair in dimension_numbers)
        if not weight_gather.holds_whole_blocks(spec, tuple(rhs_shape), contracting, batch,
                                                mesh.shape):
            return None
        return FP4Gather(axes=gather.axes, spec=spec)


_CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "fp4jax_step_scope", default=None
)


@contextlib.contextmanager
def step_scope(
    key: jax.Array | None, *, mode: Mode = "recipe", diagnostics: bool = False,
    weight_gathers: WeightGathers | None = None, layer_names: Iterable[str] = (),
) -> Iterator[Scope]:
    """Opens the scope in which fp4jax layers find their SR keys and precision mode.

    Args:
      key: the step key (``jax.random.fold_in(run_key, step)``; typed or raw); each
        layer uses ``fp4jax.layer_key(key, its_name)``. None for forward passes and
        recipes without stochastic rounding.
      mode: a `Mode` applied to every layer's recipe (the precision schedule).
      diagnostics: record per-layer quantization statistics into ``Scope.stats``.
      weight_gathers: FSDP-sharded parameters whose layers gather them in NVFP4
        (`WeightGathers`; `fp4jax.train` passes them under a mesh). Trace under that
        mesh (``jax.sharding.use_abstract_mesh``).
      layer_names: names of layers the scope derives keys for on entry, all at once (two
        hashes in the program instead of two per layer; the keys are the same). Names no
        layer uses cost a few bytes; a layer not listed derives its keys when called.

    Yields:
      The open `Scope`.

    Example:
      >>> import functools, jax, jax.numpy as jnp, fp4jax
      >>> from fp4jax.flax import DotGeneral, step_scope
      >>> dg = DotGeneral(name="mlp.up")
      >>> x, w = jnp.ones((4, 32)), jnp.ones((32, 16))
      >>> @jax.jit
      ... def f(x, w, step_key):
      ...   with step_scope(step_key):
      ...     return dg(x, w, (((1,), (0,)), ((), ())))
      >>> f(x, w, jax.random.key(0)).shape
      (4, 16)
    """
    scope = Scope(key=_check_key(key), mode=check_mode(mode), diagnostics=bool(diagnostics),
                  weight_gathers=dict(weight_gathers or {}), layer_names=layer_names)
    token = _CURRENT.set(scope)
    try:
        yield scope
    finally:
        _CURRENT.reset(token)


def current_scope() -> Scope | None:
    """The innermost open `Scope`, or None."""
    return _CURRENT.get()
