"""Quantized operands: what a quantized array is and what it means, once for every backend.

A `QuantizedArray` stands for the float32 array `values * scale`, where `values` are int8 or
fp8 (float8_e4m3fn, float8_e5m2) and `scale` is float32, constant over blocks of `block_size`
elements along one `axis` (one scale for the whole axis when `block_size` is None):

    x ≈ dequantize(q)[..., i, ...] = float32(q.values[..., i, ...]) * q.scale[..., i // block, ...]

`scale` has the shape of `values` except along `axis`, where it holds ceil(size / block_size)
entries (1 without blocks); the last block may be partial. The grouped matmuls take a
QuantizedArray for an operand quantized along its contraction axis (k for gmm, m for tgmm) and
compute the float32-accumulated product of the dequantized operands (docs/quantization.md).

`quantize(x, dtype, axis=..., block_size=...)` makes one symmetrically, each block's scale from
its absolute maximum. Under `jax.grad` it is straight-through: the gradient reaches `x` as if
quantization were the identity, and the scale is not differentiated. For that, a QuantizedArray
made from a traced `x` (inside jit, grad, vmap, ...) keeps `x` as `source`; the kernels never
read it, and jit drops it when nothing differentiates. One made eagerly keeps only values and
scale, so quantized weights do not hold on to their float originals.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernelhub._core.dtypes import dtype_among

# The largest magnitude of each quantized dtype: a block's absolute maximum maps onto it.
_LARGEST = {
    jnp.dtype(jnp.int8): 127.0,
    jnp.dtype(jnp.float8_e4m3fn): float(jnp.finfo(jnp.float8_e4m3fn).max),
    jnp.dtype(jnp.float8_e5m2): float(jnp.finfo(jnp.float8_e5m2).max),
}
QUANTIZED_DTYPES = tuple(_LARGEST)
# Every value of these dtypes is a bfloat16 exactly, so kernels may widen quantized tiles to
# bfloat16 (and multiply on bf16 units, summing in float32) without changing a product.
EXACT_IN_BFLOAT16 = (jnp.dtype(jnp.bfloat16), *QUANTIZED_DTYPES)
# int8 x int8 sums stay exact in int32 while terms * 128 * 128 < 2**31 (-128 is a valid value):
# a longer contraction sums shorter runs exactly and adds them in float32, in every kernel.
MAX_EXACT_INT32_TERMS = 2**31 // (128 * 128) - 1
_DTYPE_NAMES = "int8, float8_e4m3fn or float8_e5m2"
_SOURCE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _check_parts(values: Any, scale: Any, axis: int, block_size: int | None,
                 source: Any) -> None:
    """The rules a QuantizedArray's parts follow (types and shapes only)."""
    if jnp.dtype(values.dtype) not in _LARGEST:
        raise TypeError(f"values must have dtype {_DTYPE_NAMES}, got {values.dtype}")
    if jnp.dtype(scale.dtype) != jnp.float32:
        raise TypeError(f"scale must have dtype float32, got {scale.dtype}")
    if not (isinstance(axis, int) and 0 <= axis < len(values.shape)):
        raise ValueError(f"axis must lie in [0, {len(values.shape)}), got {axis!r}")
    expected = scale_shape(tuple(values.shape), axis, block_size)
    if tuple(scale.shape) != expected:
        raise ValueError(
            f"scale must have shape {expected} (values' shape {tuple(values.shape)} with "
            f"{_blocks_phrase(values.shape[axis], block_size)} along axis {axis}), got "
            f"{tuple(scale.shape)}")
    if source is not None and (tuple(source.shape) != tuple(values.shape)
                               or jnp.dtype(source.dtype) not in _SOURCE_DTYPES):
        raise ValueError(
            f"source must be a float32, bfloat16 or float16 array of values' shape "
            f"{tuple(values.shape)}, got {source.dtype} {tuple(source.shape)}")


@jax.tree_util.register_pytree_node_class
class QuantizedArray:
    """`values * scale` with one scale per block along `axis` (module docstring).

    Args:
      values: int8, float8_e4m3fn or float8_e5m2 array.
      scale: float32, the shape of `values` but along `axis`: ceil(size / block_size) entries,
        or 1 when `block_size` is None.
      axis: the axis the scales are blocked along (negative counts from the end).
      block_size: elements per block along `axis`, or None for one scale over the whole axis.
      source: the float array this was quantized from, for straight-through gradients (set by
        `quantize` when tracing), or None.

    A pytree (leaves values, scale and source; axis and block_size are static), so it passes
    through jit, vmap, shard_map and donation.
    """

    __slots__ = ("values", "scale", "axis", "block_size", "source")

    def __init__(self, values: Any, scale: Any, *, axis: int, block_size: int | None = None,
                 source: Any = None):
        values = _as_array(values)
        scale = _as_array(scale)
        source = None if source is None else _as_array(source)
        axis = _axis(axis, values.ndim)
        block_size = _block_size(block_size)
        _check_parts(values, scale, axis, block_size, source)
        self._set(values, scale, axis, block_size, source)

    def check(self, name: str = "QuantizedArray") -> None:
        """Raises what the constructor raises for parts that break its rules: for one rebuilt
        from leaves (`jax.tree.unflatten`, as optimizers and checkpointers do), which skips it.
        Reads only shapes and dtypes, so it costs nothing at trace time."""
        try:
            _check_parts(self.values, self.scale, self.axis, self.block_size, self.source)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {error}") from None

    def _set(self, values, scale, axis, block_size, source) -> None:
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "axis", axis)
        object.__setattr__(self, "block_size", block_size)
        object.__setattr__(self, "source", source)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("QuantizedArray is immutable")

    @classmethod
    def _unchecked(cls, values, scale, axis, block_size, source=None) -> QuantizedArray:
        # jax rebuilds pytrees with placeholders for leaves (in_axes, cotangents, shardings):
        # nothing may be checked here.
        made = object.__new__(cls)
        made._set(values, scale, axis, block_size, source)
        return made

    # The static axis is kept counted from the end of `values`: jax.vmap and lax.scan take or
    # add leading axes of the leaves without telling the pytree, and an axis counted from the
    # end stays on the same logical axis through them (a stack of layers' weights quantized
    # along k, mapped over its layers, is still quantized along k). Mapping over an axis after
    # the quantized one is the exception: the array then names the axis before it.
    def tree_flatten(self):
        return (self.values, self.scale, self.source), (_from_end(self.axis, self.values),
                                                         self.block_size)

    @classmethod
    def tree_unflatten(cls, aux, children):
        values, scale, source = children
        from_end, block_size = aux
        rank = len(getattr(values, "shape", ()))
        # placeholders for leaves (in_axes, shardings) have no shape: keep the count from the end
        axis = from_end + rank if rank + from_end >= 0 and hasattr(values, "shape") else from_end
        return cls._unchecked(values, scale, axis, block_size, source)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def ndim(self) -> int:
        return len(self.values.shape)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of `values` (the stored, quantized one)."""
        return jnp.dtype(self.values.dtype)

    @property
    def num_blocks(self) -> int:
        return self.scale.shape[self.axis]

    def dequantize(self) -> jax.Array:
        """float32 `values * scale`, each scale repeated over its block. With a source, its
        gradient goes to the source unchanged (straight-through, as in the ops)."""
        value = self.values.astype(jnp.float32) * expand_scale(
            self.scale, self.axis, self.block_size, self.shape[self.axis])
        return value if self.source is None else _straight_through(value, self.source)

    def without_source(self) -> QuantizedArray:
        """The same values and scale, with no float source (nothing to differentiate)."""
        return QuantizedArray._unchecked(self.values, self.scale, self.axis, self.block_size)

    def __repr__(self) -> str:
        blocks = "one scale" if self.block_size is None else f"blocks of {self.block_size}"
        # jax rebuilds this pytree around placeholders (jaxpr printing does), which have no
        # dtype or shape: say what there is.
        values = self.values
        if hasattr(values, "dtype") and hasattr(values, "shape"):
            values = f"{jnp.dtype(values.dtype)}{list(values.shape)}"
        return f"QuantizedArray({values}, {blocks} along axis {self.axis})"


def _from_end(axis: int, values: Any) -> int:
    """`axis` counted from the end of `values` (negative), or as it is when already negative
    (a QuantizedArray around placeholders) or when `values` has no shape."""
    if axis < 0 or not hasattr(values, "shape"):
        return axis
    return axis - len(values.shape)


@jax.custom_jvp
def _straight_through(value: jax.Array, source: jax.Array) -> jax.Array:
    """`value`, differentiated as if it were `source` (an identity for gradients)."""
    del source
    return value


@_straight_through.defjvp
def _straight_through_jvp(primals, tangents):
    value, _ = primals
    _, d_source = tangents
    return value, d_source.astype(value.dtype)


def scale_shape(shape: tuple[int, ...], axis: int, block_size: int | None) -> tuple[int, ...]:
    """The shape of the scale of an array of `shape` blocked along `axis`."""
    blocks = 1 if block_size is None else max(1, math.ceil(shape[axis] / block_size))
    return tuple(blocks if d == axis else size for d, size in enumerate(shape))


def expand_scale(scale: jax.Array, axis: int, block_size: int | None, size: int) -> jax.Array:
    """`scale` repeated over its blocks along `axis`, cut to `size`: broadcastable to values."""
    if block_size is None:
        return scale
    repeated = jnp.repeat(scale, block_size, axis=axis, total_repeat_length=scale.shape[axis] * block_size)
    return jax.lax.slice_in_dim(repeated, 0, size, axis=axis)


def quantize(x: Any, dtype: Any, *, axis: int, block_size: int | None = None) -> QuantizedArray:
    """Symmetric quantization of `x` to `dtype` (int8, float8_e4m3fn or float8_e5m2).

    Each block of `block_size` elements along `axis` (the whole axis when None; the last block
    may be shorter) gets scale = max|x| / largest(dtype), and values = x / scale rounded to
    `dtype` (to the nearest integer, clipped to ±127, for int8). A block of zeros gets scale 1.
    NaN or Inf in a block make that block's scale NaN or Inf.

    Straight-through under autodiff (module docstring). Returns a QuantizedArray.
    """
    x = _as_array(x)
    if x.dtype not in _SOURCE_DTYPES:
        raise TypeError(f"x must have dtype float32, bfloat16 or float16, got {x.dtype}")
    target = dtype_among("dtype", dtype, _LARGEST, _DTYPE_NAMES)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis to quantize along, got a scalar")
    axis = _axis(axis, x.ndim)
    block_size = _block_size(block_size)
    values, scale = _quantized_parts(jax.lax.stop_gradient(x), target, axis, block_size)
    source = x if isinstance(x, jax.core.Tracer) else None
    return QuantizedArray._unchecked(values, scale, axis, block_size, source)


def _quantized_parts(x: jax.Array, target: np.dtype, axis: int,
                     block_size: int | None) -> tuple[jax.Array, jax.Array]:
    x = x.astype(jnp.float32)
    size = x.shape[axis]
    if block_size is None:
        amax = jnp.max(jnp.abs(x), axis=axis, keepdims=True)
    else:
        blocks = max(1, math.ceil(size / block_size))
        padding = [(0, 0)] * x.ndim
        padding[axis] = (0, blocks * block_size - size)
        padded = jnp.pad(jnp.abs(x), padding)
        split = x.shape[:axis] + (blocks, block_size) + x.shape[axis + 1:]
        amax = jnp.max(padded.reshape(split), axis=axis + 1)
    # A block of zeros keeps scale 1: values 0, and no 0/0.
    scale = jnp.where(amax == 0, 1.0, amax / _LARGEST[target]).astype(jnp.float32)
    scaled = x / expand_scale(scale, axis, block_size, size)
    largest = _LARGEST[target]
    if target == jnp.int8:
        values = jnp.clip(jnp.round(scaled), -largest, largest).astype(jnp.int8)
    else:
        # float8_e4m3fn has no Inf: a value past its largest would become NaN, not saturate.
        values = jnp.clip(scaled, -largest, largest).astype(target)
    return values, scale


def dequantize(value: Any) -> Any:
    """`value.dequantize()` for a QuantizedArray; anything else as it is."""
    return value.dequantize() if isinstance(value, QuantizedArray) else value


def _as_array(value: Any) -> Any:
    if isinstance(value, (jax.Array, np.ndarray)) or hasattr(value, "shape") and hasattr(value, "dtype"):
        return value
    return jnp.asarray(value)


def _axis(axis: Any, ndim: int) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis} is out of range for an array of rank {ndim}")
    return int(axis) % ndim


def _block_size(block_size: Any) -> int | None:
    if block_size is None:
        return None
    if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool):
        raise TypeError(f"block_size must be a positive int or None, got {type(block_size).__name__}")
    if block_size <= 0:
        raise ValueError(f"block_size must be a positive int or None, got {block_size}")
    return int(block_size)


def _blocks_phrase(size: int, block_size: int | None) -> str:
    if block_size is None:
        return "one scale"
    return f"ceil({size} / {block_size}) = {max(1, math.ceil(size / block_size))} blocks"
