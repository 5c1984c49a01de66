"""Flax adapters: train an existing nnx or linen model in NVFP4.

* One layer: ``nnx.Linear(..., dot_general=fp4jax.flax.DotGeneral(name="mlp.up"))``,
  ``nnx.Einsum(..., einsum_op=fp4jax.flax.Einsum(name=...))``, linen
  ``nn.Dense(..., dot_general_cls=fp4jax.flax.linen.dot_general_cls())``.
* A whole model: `fp4jax.flax.nnx.quantize` (in place) or `fp4jax.flax.linen.quantize`
  (a context manager), with a `Policy` of regex `Rule`\\ s over module paths and the
  presets `paper_policy`, `keep_blocks`, `high_precision_rules`.
* Keys and precision mode: layers read them from `step_scope`, which the
  `fp4jax.train` step opens inside its jitted function (see `fp4jax.flax.scope`).
"""

from fp4jax.flax import einsum as einsum
from fp4jax.flax import linen as linen
from fp4jax.flax import nnx as nnx
from fp4jax.flax.ops import DotGeneral as DotGeneral
from fp4jax.flax.ops import Einsum as Einsum
from fp4jax.flax.policy import Decision as Decision
from fp4jax.flax.policy import Policy as Policy
from fp4jax.flax.policy import Report as Report
from fp4jax.flax.policy import Rule as Rule
from fp4jax.flax.policy import high_precision_rules as high_precision_rules
from fp4jax.flax.policy import keep_blocks as keep_blocks
from fp4jax.flax.policy import paper_policy as paper_policy
from fp4jax.flax.policy import recipe_name as recipe_name
from fp4jax.flax.scope import MODES as MODES
from fp4jax.flax.scope import Mode as Mode
from fp4jax.flax.scope import Scope as Scope
from fp4jax.flax.scope import apply_mode as apply_mode
from fp4jax.flax.scope import current_scope as current_scope
from fp4jax.flax.scope import step_scope as step_scope
