"""NVFP4 storage: E2M1 code packing and decoding, and the `NVFP4Array` pytree.

An NVFP4 tensor is stored in three parts (docs/docs/RECIPE.md §1):

* ``data``: two 4-bit E2M1 codes per byte, even element in the low nibble, laid out
  like the input with the quantized axis halved (after zero-padding that axis to a
  multiple of 16);
* ``scales``: one ``float8_e4m3fn`` block decode scale per 16 consecutive elements
  along the quantized axis (1D blocks), or one per 16×16 tile (2D blocks);
* ``amax``: the float32 global amax of the (possibly rotated) tensor.

Everything else (logical shape, input dtype, quantized axis, 2D flag, whether the
random Hadamard transform was applied) is static pytree metadata.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from fp4jax.numerics.constants import BLOCK
from fp4jax.numerics.layout import num_blocks, repeat_each, tile_axis_for


def pack_codes(codes: jax.Array, axis: int) -> jax.Array:
    """Packs 4-bit codes two per byte along ``axis`` (even element in the low nibble).

    Args:
      codes: uint8 array of codes in ``[0, 16)``; ``codes.shape[axis]`` must be even.
      axis: the axis to pack along.

    Returns:
      uint8 array with ``shape[axis]`` halved.
    """
    codes = jnp.moveaxis(codes.astype(jnp.uint8), axis, -1)
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    packed = pairs[..., 0] | (pairs[..., 1] << 4)
    return jnp.moveaxis(packed, -1, axis)


def unpack_codes(data: jax.Array, axis: int) -> jax.Array:
    """Inverse of `pack_codes`: returns uint8 codes with ``shape[axis]`` doubled."""
    data = jnp.moveaxis(data, axis, -1)
    codes = jnp.stack([data & 0xF, data >> 4], axis=-1)
    codes = codes.reshape(*data.shape[:-1], data.shape[-1] * 2)
    return jnp.moveaxis(codes, -1, axis)


def e2m1_to_bf16(codes: jax.Array) -> jax.Array:
    """Decodes E2M1 codes to bfloat16 with integer ops only (exact).

    Magnitude index ``m = c & 7`` maps to BF16 bits ``(m << 6) + 0x3F00`` for the normal
    values (m >= 2: exponent ``(m >> 1) + 126`` and mantissa bit ``m & 1`` are ``m`` shifted
    into place) and ``m * 0x3F00`` for 0 and 0.5 (m = 0, 1); the sign bit is
    ``(c & 8) << 12``. One select: the decode is in every emulated GEMM's program.
    """
    c = codes.astype(jnp.uint16)
    m = c & 7
    mag = jnp.where(m >= 2, (m << 6) + jnp.uint16(0x3F00), m * jnp.uint16(0x3F00))
    bits = mag | ((c & 8) << 12)
    return jax.lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.bfloat16)


def e2m1_to_f32(codes: jax.Array) -> jax.Array:
    """Decodes E2M1 codes to float32 (exact; goes through the BF16 bit pattern)."""
    bf = e2m1_to_bf16(codes)
    bits = jax.lax.bitcast_convert_type(bf, jnp.uint16).astype(jnp.uint32) << 16
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def e4m3_to_f32(scales: jax.Array) -> jax.Array:
    """Converts ``float8_e4m3fn`` scales to float32 (an exact widening)."""
    return scales.astype(jnp.float32)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["data", "scales", "amax"],
    meta_fields=["shape", "dtype", "axis", "block_2d", "hadamard"],
)
@dataclasses.dataclass(frozen=True)
class NVFP4Array:
    """A tensor quantized to NVFP4 (a JAX pytree).

    Attributes:
      data: uint8 packed E2M1 codes: the input's layout with the quantized axis
        zero-padded to a multiple of 16 and then halved; byte ``j`` along that axis
        holds element ``2j`` in its low nibble and ``2j+1`` in its high nibble.
      scales: ``float8_e4m3fn`` block decode scales. 1D blocks: the logical shape
        with the quantized axis replaced by its number of 16-blocks. 2D blocks:
        additionally the tile axis (the other of the last two axes) replaced by its
        number of 16-blocks; one scale per 16×16 tile.
      amax: float32 scalar, the global amax the scales were computed from (after the
        Hadamard transform when ``hadamard`` is set). NaN when the input held a
        non-finite value: every dequantized value is then NaN.
      shape: logical shape of the quantized tensor.
      dtype: dtype of the tensor that was quantized.
      axis: the quantized (block) axis, non-negative.
      block_2d: whether scales are per 16×16 tile.
      hadamard: whether the 16×16 random Hadamard transform was applied along
        ``axis`` before quantizing (`dequantize` then returns rotated values).

    Example:
      >>> import jax.numpy as jnp, fp4jax
      >>> q = fp4jax.quantize(jnp.linspace(-6.0, 6.0, 32).reshape(2, 16))
      >>> q.data.shape, q.scales.shape, q.nbytes
      ((2, 8), (2, 1), 22)
    """

    data: jax.Array
    scales: jax.Array
    amax: jax.Array
    shape: tuple[int, ...]
    dtype: Any
    axis: int
    block_2d: bool = False
    hadamard: bool = False

    @property
    def ndim(self) -> int:
        """Rank of the logical tensor."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of logical elements."""
        return math.prod(self.shape)

    @property
    def tile_axis(self) -> int | None:
        """Second axis of the 2D tiles, or None for 1D blocks."""
        return tile_axis_for(self.axis, self.ndim) if self.block_2d else None

    @property
    def padded_length(self) -> int:
        """Length of the quantized axis after zero-padding to a multiple of 16."""
        return num_blocks(self.shape[self.axis]) * BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes actually stored: packed codes + E4M3 scales + the float32 amax."""
        return int(self.data.size + self.scales.size + 4)

    def codes(self) -> jax.Array:
        """The unpacked E2M1 codes (uint8 in ``[0, 16)``) in the logical shape."""
        codes = unpack_codes(self.data, self.axis)
        return jax.lax.slice_in_dim(codes, 0, self.shape[self.axis], axis=self.axis)

    def per_element(self, per_block: jax.Array) -> jax.Array:
        """Broadcasts an array shaped like ``scales`` to one value per element.

        The result is in the padded layout (the quantized axis a multiple of 16); a 2D
        tile's value is repeated over its 16 rows, cut to the logical tile axis.
        """
        out = repeat_each(per_block, BLOCK, self.axis)
        if self.block_2d:
            t = self.tile_axis
            out = jax.lax.slice_in_dim(repeat_each(out, BLOCK, t), 0, self.shape[t], axis=t)
        return out

    def block_scales(self, dtype: Any = jnp.float32) -> jax.Array:
        """Block decode scales broadcast to one per element, in the padded layout."""
        return self.per_element(e4m3_to_f32(self.scales).astype(dtype))

    def transpose(self, axes: tuple[int, ...] | None = None) -> NVFP4Array:
        """Permutes the logical axes without requantizing (a layout change only).

        2D-tiled arrays must keep the tile on their last two axes.
        """
        axes = tuple(reversed(range(self.ndim))) if axes is None else tuple(axes)
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"axes {axes} is not a permutation of range({self.ndim})")
        new_axis = axes.index(self.axis)
        if self.block_2d:
            tile_axis_for(new_axis, self.ndim)  # validates
            if axes.index(self.tile_axis) not in (self.ndim - 2, self.ndim - 1):
                raise ValueError(
                    f"transpose {axes} moves the 2D tile of an array of shape {self.shape} "
                    "off its last two axes"
                )
        return NVFP4Array(
            data=jnp.transpose(self.data, axes),
            scales=jnp.transpose(self.scales, axes),
            amax=self.amax,
            shape=tuple(self.shape[a] for a in axes),
            dtype=self.dtype,
            axis=new_axis,
            block_2d=self.block_2d,
            hadamard=self.hadamard,
        )

    def take_leading(self, n: int) -> NVFP4Array:
        """The first ``n`` entries along axis 0, which must not be a block or tile axis.

        The amax is kept: this equals quantizing the first ``n`` entries with the same
        global amax given.
        """
        if self.axis == 0 or self.block_2d and self.tile_axis == 0:
            raise ValueError(f"axis 0 of an array blocked along axis {self.axis} cannot be cut")
        if not 0 < n <= self.shape[0]:
            raise ValueError(f"cannot take {n} of {self.shape[0]} entries along axis 0")
        return dataclasses.replace(
            self, data=self.data[:n], scales=self.scales[:n], shape=(n,) + self.shape[1:])

    def expand_leading(self) -> NVFP4Array:
        """The array viewed with a new leading axis of length 1 (a layout change only)."""
        return dataclasses.replace(
            self, data=self.data[None], scales=self.scales[None], shape=(1,) + self.shape,
            axis=self.axis + 1)

    @property
    def T(self) -> NVFP4Array:  # noqa: N802 - mirrors jax.Array.T
        """All axes reversed (see `transpose`)."""
        return self.transpose()

    @property
    def mT(self) -> NVFP4Array:  # noqa: N802 - mirrors jax.Array.mT
        """The last two axes swapped (see `transpose`)."""
        perm = list(range(self.ndim))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return self.transpose(tuple(perm))


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["values", "amax"],
    meta_fields=["axis", "hadamard"],
)
@dataclasses.dataclass(frozen=True)
class DecodedNVFP4:
    """An NVFP4 tensor held decoded, as the emulated GEMM multiplies it (a JAX pytree).

    ``values`` are ``code · s`` per element in bfloat16 (exact: E2M1 × E4M3), without
    the global decode scale: bit for bit `fp4jax.reference.quantization.scaled_codes_bf16`
    of the `NVFP4Array` it stands for. A quantize kernel writes this form instead of codes
    and scales for an operand that one XLA GEMM consumes right away (docs/RECIPE.md §9):
    the GEMM then skips its decode pass. 1D blocks only; never saved for the backward
    pass (4× the bytes of codes and scales).

    Attributes:
      values: bfloat16, the logical shape.
      amax: float32 scalar, as `NVFP4Array.amax` (NaN when poisoned: the values are then NaN).
      axis: the quantized (block) axis, non-negative.
      hadamard: whether the values are of the Hadamard-rotated tensor.

    Example:
      >>> import jax.numpy as jnp, fp4jax
      >>> from fp4jax.reference.quantization import scaled_codes_bf16
      >>> q = fp4jax.quantize(jnp.linspace(-6.0, 6.0, 64).reshape(4, 16))
      >>> d = fp4jax.DecodedNVFP4(values=scaled_codes_bf16(q), amax=q.amax, axis=1)
      >>> w = fp4jax.quantize(jnp.ones((16, 8)), axis=0)
      >>> bool((fp4jax.matmul(d, w) == fp4jax.matmul(q, w)).all())
      True
    """

    values: jax.Array
    amax: jax.Array
    axis: int
    hadamard: bool = False

    block_2d = False  # 1D blocks only

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def take_leading(self, n: int) -> DecodedNVFP4:
        """The first ``n`` entries along axis 0 (axis 0 must not be the block axis)."""
        if not 0 < n <= self.shape[0] or self.axis == 0:
            raise ValueError(f"cannot take {n} of {self.shape[0]} entries along axis 0 of a "
                             f"tensor blocked along axis {self.axis}")
        return dataclasses.replace(self, values=self.values[:n])

    def expand_leading(self) -> DecodedNVFP4:
        """The array viewed with a new leading axis of length 1."""
        return dataclasses.replace(self, values=self.values[None], axis=self.axis + 1)
