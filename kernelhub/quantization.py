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

import dataclasses
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
# 4-bit values (a QuantizedArray's only: raw 4-bit integers are widened to int8 by the
# contracts). jax stores them packed where its backends pack them.
FOUR_BIT_DTYPES = (jnp.dtype(jnp.int4), jnp.dtype(jnp.float4_e2m1fn))
_LARGEST.update({jnp.dtype(jnp.int4): 7.0, jnp.dtype(jnp.float4_e2m1fn): 6.0})
VALUE_DTYPES = tuple(_LARGEST)
# The 8-bit dtype that holds every value of a 4-bit one exactly: what the Triton kernels unpack
# 4-bit tiles to (kernelhub/_pallas/gpu/_four_bit.py).
EXACT_IN_8_BITS = {jnp.dtype(jnp.int4): jnp.dtype(jnp.int8),
                   jnp.dtype(jnp.float4_e2m1fn): jnp.dtype(jnp.float8_e4m3fn)}
# Every value of these dtypes is a bfloat16 exactly, so kernels may widen quantized tiles to
# bfloat16 (and multiply on bf16 units, summing in float32) without changing a product.
EXACT_IN_BFLOAT16 = (jnp.dtype(jnp.bfloat16), *VALUE_DTYPES)
# Scale dtypes: float32; OCP microscaling's power-of-two float8_e8m0fnu; NVFP4's
# float8_e4m3fn, under one float32 scale for the whole tensor (`tensor_scale`).
SCALE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float8_e8m0fnu),
                jnp.dtype(jnp.float8_e4m3fn))
# int8 x int8 sums stay exact in int32 while terms * 128 * 128 < 2**31 (-128 is a valid value):
# a longer contraction sums shorter runs exactly and adds them in float32, in every kernel.
MAX_EXACT_INT32_TERMS = 2**31 // (128 * 128) - 1
_DTYPE_NAMES = "int8, float8_e4m3fn, float8_e5m2, int4 or float4_e2m1fn"
_SCALE_NAMES = "float32, float8_e8m0fnu or float8_e4m3fn"
_SOURCE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _check_parts(values: Any, scale: Any, axis: int, block_size: int | None,
                 source: Any, tensor_scale: Any = None) -> None:
    """The rules a QuantizedArray's parts follow (types and shapes only)."""
    if jnp.dtype(values.dtype) not in _LARGEST:
        raise TypeError(f"values must have dtype {_DTYPE_NAMES}, got {values.dtype}")
    if jnp.dtype(scale.dtype) not in SCALE_DTYPES:
        raise TypeError(f"scale must have dtype {_SCALE_NAMES}, got {scale.dtype}")
    if tensor_scale is not None and (tuple(tensor_scale.shape) != ()
                                     or jnp.dtype(tensor_scale.dtype) != jnp.float32):
        raise TypeError(f"tensor_scale must be a float32 scalar, got {tensor_scale.dtype} "
                        f"{tuple(tensor_scale.shape)}")
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
      values: int8, float8_e4m3fn, float8_e5m2, int4 or float4_e2m1fn array.
      scale: float32, float8_e8m0fnu (OCP MX: powers of two) or float8_e4m3fn (NVFP4), the
        shape of `values` but along `axis`: ceil(size / block_size) entries, or 1 when
        `block_size` is None.
      axis: the axis the scales are blocked along (negative counts from the end).
      block_size: elements per block along `axis`, or None for one scale over the whole axis.
      source: the float array this was quantized from, for straight-through gradients (set by
        `quantize` when tracing), or None.
      tensor_scale: a float32 scalar multiplying every scale (NVFP4's second level), or None.

    A pytree (leaves values, scale, source and tensor_scale; axis and block_size are static),
    so it passes through jit, vmap, shard_map and donation.
    """

    __slots__ = ("values", "scale", "axis", "block_size", "source", "tensor_scale")

    def __init__(self, values: Any, scale: Any, *, axis: int, block_size: int | None = None,
                 source: Any = None, tensor_scale: Any = None):
        values = _as_array(values)
        scale = _as_array(scale)
        source = None if source is None else _as_array(source)
        tensor_scale = None if tensor_scale is None else _as_array(tensor_scale)
        axis = _axis(axis, values.ndim)
        block_size = _block_size(block_size)
        _check_parts(values, scale, axis, block_size, source, tensor_scale)
        self._set(values, scale, axis, block_size, source, tensor_scale)

    def check(self, name: str = "QuantizedArray") -> None:
        """Raises what the constructor raises for parts that break its rules: for one rebuilt
        from leaves (`jax.tree.unflatten`, as optimizers and checkpointers do), which skips it.
        Reads only shapes and dtypes, so it costs nothing at trace time."""
        try:
            _check_parts(self.values, self.scale, self.axis, self.block_size, self.source,
                         self.tensor_scale)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {error}") from None

    def _set(self, values, scale, axis, block_size, source, tensor_scale=None) -> None:
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "axis", axis)
        object.__setattr__(self, "block_size", block_size)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "tensor_scale", tensor_scale)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("QuantizedArray is immutable")

    @classmethod
    def _unchecked(cls, values, scale, axis, block_size, source=None,
                   tensor_scale=None) -> QuantizedArray:
        # jax rebuilds pytrees with placeholders for leaves (in_axes, cotangents, shardings):
        # nothing may be checked here.
        made = object.__new__(cls)
        made._set(values, scale, axis, block_size, source, tensor_scale)
        return made

    # The static axis is kept counted from the end of `values`: jax.vmap and lax.scan take or
    # add leading axes of the leaves without telling the pytree, and an axis counted from the
    # end stays on the same logical axis through them (a stack of layers' weights quantized
    # along k, mapped over its layers, is still quantized along k). Mapping over an axis after
    # the quantized one is the exception: the array then names the axis before it.
    def tree_flatten(self):
        return ((self.values, self.scale, self.source, self.tensor_scale),
                (_from_end(self.axis, self.values), self.block_size))

    @classmethod
    def tree_unflatten(cls, aux, children):
        values, scale, source, tensor_scale = children
        from_end, block_size = aux
        rank = len(getattr(values, "shape", ()))
        # placeholders for leaves (in_axes, shardings) have no shape: keep the count from the end
        axis = from_end + rank if rank + from_end >= 0 and hasattr(values, "shape") else from_end
        return cls._unchecked(values, scale, axis, block_size, source, tensor_scale)

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
        """float32 `values * scale (* tensor_scale)`, each scale repeated over its block. With a
        source, its gradient goes to the source unchanged (straight-through, as in the ops)."""
        value = self.values.astype(jnp.float32) * expand_scale(
            self.scale.astype(jnp.float32), self.axis, self.block_size, self.shape[self.axis])
        if self.tensor_scale is not None:
            value = value * self.tensor_scale
        return value if self.source is None else _straight_through(value, self.source)

    def with_float32_scale(self) -> QuantizedArray:
        """The same array with one float32 scale per block (tensor_scale folded in): the form
        the kernels take. Exact for float32 and e8m0 scales; for NVFP4's e4m3 block scale times
        its float32 tensor scale, one float32 rounding of their product."""
        if jnp.dtype(self.scale.dtype) == jnp.float32 and self.tensor_scale is None:
            return self
        scale = self.scale.astype(jnp.float32)
        if self.tensor_scale is not None:
            scale = scale * self.tensor_scale
        return QuantizedArray._unchecked(self.values, scale, self.axis, self.block_size,
                                         self.source)

    @property
    def format(self) -> str:
        """The format's name: "mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4", or the values' dtype
        with its scale's ("int8", "int4 with float8_e8m0fnu scales", ...)."""
        for name, spec in FORMATS.items():
            if spec.matches(self):
                return name
        values = jnp.dtype(self.values.dtype).name
        scale = jnp.dtype(self.scale.dtype)
        return values if scale == jnp.float32 else f"{values} with {scale.name} scales"

    def without_source(self) -> QuantizedArray:
        """The same values and scale, with no float source (nothing to differentiate)."""
        return QuantizedArray._unchecked(self.values, self.scale, self.axis, self.block_size,
                                         None, self.tensor_scale)

    def __repr__(self) -> str:
        blocks = "one scale" if self.block_size is None else f"blocks of {self.block_size}"
        # jax rebuilds this pytree around placeholders (jaxpr printing does), which have no
        # dtype or shape: say what there is.
        values = self.values
        if hasattr(values, "dtype") and hasattr(values, "shape"):
            values = f"{jnp.dtype(values.dtype)}{list(values.shape)}"
            if hasattr(self.scale, "dtype"):
                values = f"{self.format}: {values}"
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
    # Without total_repeat_length: a scalar count is then a broadcast, where with it jnp.repeat
    # takes a running sum, which jax 0.11 lowers for cuda to a composite whose fallback loops.
    repeated = jnp.repeat(scale, block_size, axis=axis)
    return jax.lax.slice_in_dim(repeated, 0, size, axis=axis)


@dataclasses.dataclass(frozen=True)
class Format:
    """A named format: its values' dtype, block size and scale dtype (NVFP4 adds a float32
    scale for the whole tensor)."""

    values: Any
    block_size: int
    scale: Any
    tensor_scale: bool = False

    def matches(self, array: QuantizedArray) -> bool:
        return (jnp.dtype(array.values.dtype) == jnp.dtype(self.values)
                and array.block_size == self.block_size
                and jnp.dtype(array.scale.dtype) == jnp.dtype(self.scale)
                and (array.tensor_scale is not None) == self.tensor_scale)


FORMATS = {
    "mxfp8": Format(jnp.float8_e4m3fn, 32, jnp.float8_e8m0fnu),
    "mxfp8_e5m2": Format(jnp.float8_e5m2, 32, jnp.float8_e8m0fnu),
    "mxfp4": Format(jnp.float4_e2m1fn, 32, jnp.float8_e8m0fnu),
    "nvfp4": Format(jnp.float4_e2m1fn, 16, jnp.float8_e4m3fn, tensor_scale=True),
}
# Block sizes the microscaling formats (e8m0 scales) and NVFP4's e4m3 scales take.
SCALE_BLOCK_SIZES = (16, 32)
# NVFP4's block scales are float8_e4m3fn: the tensor scale maps the tensor's absolute maximum
# onto the largest block scale times the largest value.
_E4M3_LARGEST = float(jnp.finfo(jnp.float8_e4m3fn).max)


def quantize(x: Any, dtype: Any, *, axis: int, block_size: int | None = None,
             scale_dtype: Any = jnp.float32) -> QuantizedArray:
    """Symmetric quantization of `x` to `dtype` (int8, float8_e4m3fn, float8_e5m2, int4 or
    float4_e2m1fn), or to a named format: "mxfp8" (e4m3 values, blocks of 32, e8m0 scales),
    "mxfp8_e5m2", "mxfp4" (e2m1, 32, e8m0) or "nvfp4" (e2m1, 16, e4m3 scales under one float32
    tensor scale); a name sets block_size and scale_dtype.

    Each block of `block_size` elements along `axis` (the whole axis when None; the last block
    may be shorter) gets a scale from its absolute maximum amax, and values = x / scale rounded
    to `dtype` (integers to the nearest, clipped to the largest magnitude: 127, or 7 for int4;
    floats saturate at their largest). The scale, by scale_dtype:
    - float32: amax / largest(dtype);
    - float8_e8m0fnu (OCP microscaling, float values only, blocks of 16 or 32): the power of two
      2**(floor(log2(amax)) - emax(dtype)), emax being the element type's largest exponent;
    - float8_e4m3fn (NVFP4, float4_e2m1fn values, blocks of 16): tensor_scale = max|x| /
      (448 * 6), and each block's scale amax / 6 / tensor_scale rounded to e4m3.
    A block of zeros gets scale 1 (values 0). NaN or Inf in a block make its scale NaN or Inf.

    Straight-through under autodiff (module docstring). Returns a QuantizedArray.
    """
    x = _as_array(x)
    if x.dtype not in _SOURCE_DTYPES:
        raise TypeError(f"x must have dtype float32, bfloat16 or float16, got {x.dtype}")
    if isinstance(dtype, str) and dtype.strip().lower() in FORMATS:
        key = dtype.strip().lower()
        spec = FORMATS[key]
        if block_size is not None and block_size != spec.block_size:
            raise ValueError(f"block_size: {key} has blocks of {spec.block_size}, got "
                             f"{block_size}")
        dtype, block_size, scale_dtype = spec.values, spec.block_size, spec.scale
    target = dtype_among("dtype", dtype, _LARGEST,
                         f"{_DTYPE_NAMES}, or a format: {', '.join(map(repr, FORMATS))}")
    scale_target = dtype_among("scale_dtype", scale_dtype, SCALE_DTYPES, _SCALE_NAMES)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis to quantize along, got a scalar")
    axis = _axis(axis, x.ndim)
    block_size = _block_size(block_size)
    _check_scheme(target, block_size, scale_target)
    values, scale, tensor_scale = _quantized_parts(jax.lax.stop_gradient(x), target, axis,
                                                   block_size, scale_target)
    source = x if isinstance(x, jax.core.Tracer) else None
    return QuantizedArray._unchecked(values, scale, axis, block_size, source, tensor_scale)


def _check_scheme(target: np.dtype, block_size: int | None, scale: np.dtype) -> None:
    """The rules of the scale dtypes other than float32, as one-line ValueErrors."""
    if scale == jnp.float32:
        return
    if block_size not in SCALE_BLOCK_SIZES:
        raise ValueError(f"block_size must be 16 or 32 with {scale.name} scales (the MX and "
                         f"NVFP4 formats), got {block_size}")
    if scale == jnp.float8_e8m0fnu and not jnp.issubdtype(target, jnp.floating):
        raise ValueError(f"scale_dtype float8_e8m0fnu (OCP microscaling) needs float values "
                         f"(float8_e4m3fn, float8_e5m2, float4_e2m1fn), got {target.name}: use "
                         f"float32 scales for integers")
    if scale == jnp.float8_e4m3fn and (target != jnp.float4_e2m1fn or block_size != 16):
        raise ValueError(f"scale_dtype float8_e4m3fn is NVFP4's: float4_e2m1fn values in blocks "
                         f"of 16, got {target.name} in blocks of {block_size}")


def _block_amax(x: jax.Array, axis: int, block_size: int | None) -> jax.Array:
    """max|x| over each block along `axis` (the scale's shape)."""
    if block_size is None:
        return jnp.max(jnp.abs(x), axis=axis, keepdims=True)
    size = x.shape[axis]
    blocks = max(1, math.ceil(size / block_size))
    padding = [(0, 0)] * x.ndim
    padding[axis] = (0, blocks * block_size - size)
    padded = jnp.pad(jnp.abs(x), padding)
    split = x.shape[:axis] + (blocks, block_size) + x.shape[axis + 1:]
    return jnp.max(padded.reshape(split), axis=axis + 1)


def _power_of_two_scale(amax: jax.Array, target: np.dtype) -> jax.Array:
    """OCP MX's shared scale 2**(floor(log2(amax)) - emax(target)), exactly; 1 for amax 0."""
    emax = jnp.finfo(target).maxexp - 1
    _, exponent = jnp.frexp(amax)  # amax = mantissa * 2**exponent, mantissa in [0.5, 1)
    shared = jnp.clip(exponent - 1 - emax, -127, 127)
    scale = jnp.ldexp(jnp.ones_like(amax), shared)
    scale = jnp.where(amax == 0, 1.0, scale)
    return jnp.where(jnp.isfinite(amax), scale, amax)


def _quantized_parts(x: jax.Array, target: np.dtype, axis: int, block_size: int | None,
                     scale_dtype: np.dtype) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    x = x.astype(jnp.float32)
    size = x.shape[axis]
    amax = _block_amax(x, axis, block_size)
    largest = _LARGEST[target]
    tensor_scale = None
    if scale_dtype == jnp.float8_e8m0fnu:
        scale = _power_of_two_scale(amax, target)
        stored = scale.astype(scale_dtype)
    elif scale_dtype == jnp.float8_e4m3fn:
        tensor_amax = jnp.max(jnp.abs(x))
        tensor_scale = jnp.where(tensor_amax == 0, 1.0,
                                 tensor_amax / (_E4M3_LARGEST * largest)).astype(jnp.float32)
        block = jnp.clip(amax / largest / tensor_scale, 0.0, _E4M3_LARGEST)
        stored = jnp.where(amax == 0, 1.0, block).astype(scale_dtype)
        scale = stored.astype(jnp.float32) * tensor_scale
    else:
        # A block of zeros keeps scale 1: values 0, and no 0/0.
        scale = jnp.where(amax == 0, 1.0, amax / largest).astype(jnp.float32)
        stored = scale
    divisor = expand_scale(scale, axis, block_size, size)
    # A block whose e4m3 scale rounded to 0 (far below the tensor's maximum) holds zeros.
    scaled = jnp.where(divisor == 0, 0.0, x / jnp.where(divisor == 0, 1.0, divisor))
    if jnp.issubdtype(target, jnp.integer):
        values = jnp.clip(jnp.round(scaled), -largest, largest).astype(target)
    else:
        # float8_e4m3fn has no Inf: a value past its largest would become NaN, not saturate.
        values = jnp.clip(scaled, -largest, largest).astype(target)
    return values, stored, tensor_scale


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
