"""fp4jax: train JAX models in NVFP4 with NVIDIA's recipe, bit for bit.

The public API is loaded on first use, so that ``import fp4jax`` (and importing a
Pallas kernel, which builds on `fp4jax.numerics`) loads neither the dispatch layers
nor flax, optax or orbax. The layers are described in docs/ARCHITECTURE.md.

Example:
  >>> import jax, jax.numpy as jnp, fp4jax
  >>> q = fp4jax.quantize(jax.random.normal(jax.random.key(0), (4, 32)))
  >>> fp4jax.dequantize(q).shape
  (4, 32)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> (module, attribute). One name per line, as optax's __init__ does.
_EXPORTS: dict[str, tuple[str, str]] = {
    "quantize": ("fp4jax.implementation", "quantize"),
    "dequantize": ("fp4jax.implementation", "dequantize"),
    "matmul": ("fp4jax.implementation", "matmul"),
    "dot_general": ("fp4jax.quantized_dot", "dot_general"),
    "FP4Gather": ("fp4jax.weight_gather", "FP4Gather"),
    "NVFP4Array": ("fp4jax.numerics.nvfp4_array", "NVFP4Array"),
    "DecodedNVFP4": ("fp4jax.numerics.nvfp4_array", "DecodedNVFP4"),
    "Recipe": ("fp4jax.recipe", "Recipe"),
    "Operand": ("fp4jax.recipe", "Operand"),
    "UNQUANTIZED": ("fp4jax.recipe", "UNQUANTIZED"),
    "BF16": ("fp4jax.recipe", "BF16"),
    "layer_key": ("fp4jax.keys", "layer_key"),
    "rht": ("fp4jax.numerics.hadamard", "rht"),
    "DEFAULT_HADAMARD_SIGNS": ("fp4jax.numerics.hadamard", "DEFAULT_SIGNS"),
    "global_encode_scale": ("fp4jax.numerics.scales", "global_encode_scale"),
    "global_decode_scale": ("fp4jax.numerics.scales", "global_decode_scale"),
}

# Subpackages reachable as attributes; imported on first access.
_SUBMODULES = ("diagnostics", "flax", "train", "checkpoint", "metrics_log", "testing", "parallel")

__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'fp4jax' has no attribute {name!r}")
    globals()[name] = value  # later accesses skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from fp4jax import checkpoint, diagnostics, flax, metrics_log, parallel, testing, train
    from fp4jax.implementation import dequantize, matmul, quantize
    from fp4jax.keys import layer_key
    from fp4jax.numerics.hadamard import DEFAULT_SIGNS as DEFAULT_HADAMARD_SIGNS
    from fp4jax.numerics.hadamard import rht
    from fp4jax.numerics.nvfp4_array import DecodedNVFP4, NVFP4Array
    from fp4jax.numerics.scales import global_decode_scale, global_encode_scale
    from fp4jax.quantized_dot import dot_general
    from fp4jax.recipe import BF16, UNQUANTIZED, Operand, Recipe
    from fp4jax.weight_gather import FP4Gather
