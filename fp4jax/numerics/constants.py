"""The NVFP4 constants, in one place (docs/docs/RECIPE.md §1–§2).

Every module that needs a block size, a format bound or a scale constant imports it
from here: no literal 16, 6.0, 448.0 or 2688.0 is re-derived elsewhere.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

BLOCK = 16
"""Elements per NVFP4 block (and the side of a 2D weight tile)."""

E2M1_MAX = 6.0
"""Largest E2M1 magnitude."""

E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` magnitude."""

GLOBAL_SCALE_NUMERATOR = E4M3_MAX * E2M1_MAX
"""2688 = 448 · 6: the global encode scale is ``fl(2688 / amax)``."""

FLT_MAX = float(np.finfo(np.float32).max)
"""Largest finite float32."""

INV_E2M1_MAX = np.float32(1.0) / np.float32(E2M1_MAX)
"""``fl(1/6)``, the factor in the block decode scale ``bamax · fl(ges · fl(1/6))``."""

INV_GLOBAL_SCALE_NUMERATOR = np.float32(1.0) / np.float32(GLOBAL_SCALE_NUMERATOR)
"""``fl(1/2688)``, the factor in the dequantization ``fl(fl(s · amax) · fl(1/2688))``."""

E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)
"""Value of each 4-bit E2M1 code ``s e1 e0 m`` (code 8 is −0)."""

SUPPORTED_INPUT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
"""Input dtypes that NVFP4 quantization takes."""
