"""fp4jax: train JAX models in NVFP4 with NVIDIA's recipe, bit for bit."""

from fp4jax.dot_general import dot_general as dot_general
from fp4jax.formats import NVFP4Array as NVFP4Array
from fp4jax.hadamard import DEFAULT_SIGNS as DEFAULT_HADAMARD_SIGNS
from fp4jax.hadamard import rht as rht
from fp4jax.keys import layer_key as layer_key
from fp4jax.matmul import matmul as matmul
from fp4jax.quantize import dequantize as dequantize
from fp4jax.quantize import global_decode_scale as global_decode_scale
from fp4jax.quantize import global_encode_scale as global_encode_scale
from fp4jax.quantize import quantize as quantize
from fp4jax.recipe import BF16 as BF16
from fp4jax.recipe import Operand as Operand
from fp4jax.recipe import Recipe as Recipe

__version__ = "0.1.0"
from fp4jax import flax as flax  # noqa: E402  (nnx/linen adapters, policies, step_scope)
from fp4jax import diagnostics as diagnostics  # noqa: E402
from fp4jax import train as train  # noqa: E402  (fp4jax.checkpoint: import it explicitly; orbax)
