"""qwix's quantized arrays (`qwix.QArray`) as grouped-matmul operands.

qwix is not imported here: a QArray is recognised by its type's module and name, so kernelhub
runs without qwix installed. A QArray holds `qvalue` (its logical type `qtype`), a `scale` of
the same rank whose every dimension divides the value's (one scale per tile), and an optional
`zero_point`. It becomes:

- a kernelhub QuantizedArray when its layout is one the kernels take as is: symmetric, a
  qtype kernelhub quantizes to (int8, float8, int4 and float4_e2m1fn stay as they are; the
  other narrow integers widen to int8, which holds them exactly),
  and scale tiles along the operand's contraction axis of at least MIN_NATIVE_BLOCK elements
  (or one tile for the whole axis). Tiles along the other axes are spread to one scale per
  element there (the scale stays a fraction of the values' size);
- otherwise its exact float32 dequantization (asymmetric, non-uniform qtypes such as nf4,
  scales varying inside a contraction block), a float operand.

qwix's own dequantization gives the scale's dtype; here it is float32, as for QuantizedArray.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import jax
import jax.numpy as jnp

from kernelhub.quantization import VALUE_DTYPES, QuantizedArray

# Scale tiles shorter than this along the contraction axis are dequantized first: their scale
# would be as large as the values, and no tiled kernel can apply it per block.
MIN_NATIVE_BLOCK = 16


class _QArrayMeta(type):
    def __instancecheck__(cls, value: Any) -> bool:
        return is_qarray(value)


class QwixQArray(metaclass=_QArrayMeta):
    """Matches a qwix.QArray in isinstance checks (and so in the ops' annotations)."""

    described = "a qwix.QArray"  # how argument errors name it


def is_qarray(value: Any) -> bool:
    kind = type(value)
    return kind.__name__ == "QArray" and kind.__module__.split(".")[0] == "qwix"


def converted(value: Any, contraction_axis: int) -> QuantizedArray | jax.Array:
    """A QArray as a QuantizedArray quantized along `contraction_axis`, or as float32."""
    qvalue, scale = value.qvalue, value.scale
    if scale.ndim != qvalue.ndim or any(v % s for v, s in zip(qvalue.shape, scale.shape)):
        raise ValueError(f"a qwix QArray's scale {scale.shape} must tile its values "
                         f"{qvalue.shape}")
    tiles = [v // s for v, s in zip(qvalue.shape, scale.shape)]
    along = tiles[contraction_axis]
    one_scale = scale.shape[contraction_axis] == 1
    values = _native_values(value)
    if (values is None or value.zero_point is not None
            or (not one_scale and along < MIN_NATIVE_BLOCK)):
        return dequantized(value)
    spread = scale.astype(jnp.float32)
    for axis, tile in enumerate(tiles):
        if axis != contraction_axis and tile > 1:
            spread = jnp.repeat(spread, tile, axis=axis)
    return QuantizedArray(values, spread, axis=contraction_axis,
                          block_size=None if one_scale else along)


def _native_values(value: Any) -> jax.Array | None:
    """The values in a QuantizedArray's value dtype, exactly (int4 stays int4), or None when
    they cannot be."""
    try:
        qtype = jnp.dtype(value.qtype)
    except TypeError:
        return None  # a non-uniform type such as nf4: values are indices into a table
    if qtype in VALUE_DTYPES:
        return value.qvalue.astype(qtype)
    if jnp.issubdtype(qtype, jnp.integer) and _fits_int8(qtype):
        return value.qvalue.astype(jnp.int8)
    return None


def _fits_int8(dtype: Any) -> bool:
    info = jnp.iinfo(dtype)
    return info.min >= -128 and info.max <= 127


def dequantized(value: Any) -> jax.Array:
    """The QArray dequantized by qwix, in float32 (its scale widened first)."""
    qwix = importlib.import_module("qwix")
    return qwix.dequantize(dataclasses.replace(value, scale=value.scale.astype(jnp.float32)))
