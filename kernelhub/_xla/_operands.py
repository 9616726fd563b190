"""Reading parts of an operand, float or quantized, in the dtype the XLA loops compute in.

Float operands are sliced through their bits (`_row_chunks.pinned_bits`: XLA:CPU has no bf16
dynamic slice). A QuantizedArray (kernelhub/quantization.py) is read as its values and the
scales of the same elements, and dequantized part by part: no float copy of a whole quantized
operand is made. Quantized operands compute in float32, the contract's "float32 product of the
dequantized operands".
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._core.dtypes import promoted
from kernelhub._core.shapes import is_static
from kernelhub._xla import _row_chunks
from kernelhub import quantization
from kernelhub.quantization import EXACT_IN_BFLOAT16, QuantizedArray, expand_scale


_INT8 = jnp.dtype(jnp.int8)
_FLOAT32 = jnp.dtype(jnp.float32)


def _raw_carrier(dtypes: set[Any]) -> Any:
    """The dtype raw operands of `dtypes`, some int8 or fp8, are multiplied in: int8 for two
    int8 arrays (int32 sums), bfloat16 where it holds every value exactly, else the float
    operand's own dtype (float32 or float16, which hold every int8 and fp8 value too)."""
    if dtypes == {_INT8}:
        return _INT8
    if all(dtype in EXACT_IN_BFLOAT16 for dtype in dtypes):
        return jnp.dtype(jnp.bfloat16)
    wide = {dtype for dtype in dtypes if dtype not in quantization.QUANTIZED_DTYPES}
    return wide.pop() if len(wide) == 1 else _FLOAT32


def compute_dtype(*operands: Any) -> Any:
    """The dtype the products run in: float32 with any quantized operand; raw int8 and fp8
    arrays as `_raw_carrier` says; else the promotion."""
    if any(isinstance(operand, QuantizedArray) for operand in operands):
        return _FLOAT32
    dtypes = {jnp.dtype(operand.dtype) for operand in operands}
    if dtypes & set(quantization.QUANTIZED_DTYPES):
        return _raw_carrier(dtypes)
    return promoted(*dtypes)


def sum_dtype(compute: Any, out_dtype: Any, contraction: int) -> Any:
    """What products of `compute` values are summed in: int32 for int8 values when the output
    is int32 (exact, wrapping past 2**31 as lax's) or the sum cannot reach 2**31; else float32."""
    if jnp.dtype(compute) != _INT8:
        return _FLOAT32
    exact = (jnp.issubdtype(out_dtype, jnp.integer)
             # A symbolic contraction (shape-polymorphic export) may pass any bound.
             or is_static(contraction) and contraction <= quantization.MAX_EXACT_INT32_TERMS)
    return jnp.dtype(jnp.int32) if exact else _FLOAT32


def _slice(array: jax.Array, axis: int, start: jax.Array, size: int,
           loop_index: jax.Array) -> jax.Array:
    """array[..., start:start + size, ...] along `axis`, in its own dtype, read through its bits
    (`loop_index`: the index of the loop whose body this is, see `_row_chunks.pinned_bits`)."""
    part = lax.dynamic_slice_in_dim(_row_chunks.pinned_bits(array, loop_index), start, size, axis)
    return _row_chunks.from_bits(part, array.dtype)


def _index(array: jax.Array, index: jax.Array) -> jax.Array:
    """array[index] along the leading axis (dropped), read through its bits."""
    part = lax.dynamic_index_in_dim(_row_chunks.pinned_bits(array, index), index, 0,
                                    keepdims=False)
    return _row_chunks.from_bits(part, array.dtype)


def sliced(operand: Any, axis: int, start: jax.Array, size: int, loop_index: jax.Array,
           dtype: Any) -> jax.Array:
    """operand[..., start:start + size, ...] along `axis`, dequantized, in `dtype`."""
    if not isinstance(operand, QuantizedArray):
        return _slice(operand, axis, start, size, loop_index).astype(dtype)
    values = _slice(operand.values, axis, start, size, loop_index)
    if axis == operand.axis:
        blocks = _block_of(operand, start + jnp.arange(size, dtype=jnp.int32))
        scale = jnp.take(operand.scale, blocks, axis=axis)
    else:
        scale = lax.dynamic_slice_in_dim(operand.scale, start, size, axis)
        scale = expand_scale(scale, operand.axis, operand.block_size, operand.shape[operand.axis])
    return (values.astype(jnp.float32) * scale).astype(dtype)


def indexed(operand: Any, index: jax.Array, dtype: Any) -> jax.Array:
    """operand[index] (along the leading axis, dropped), dequantized, in `dtype`."""
    if not isinstance(operand, QuantizedArray):
        return _index(operand, index).astype(dtype)
    if operand.axis == 0:
        raise ValueError("a QuantizedArray cannot be indexed along the axis it is quantized along")
    values = _index(operand.values, index)
    scale = lax.dynamic_index_in_dim(operand.scale, index, 0, keepdims=False)
    scale = expand_scale(scale, operand.axis - 1, operand.block_size, operand.shape[operand.axis])
    return (values.astype(jnp.float32) * scale).astype(dtype)


def taken(operand: Any, axis: int, index: jax.Array) -> jax.Array:
    """jnp.take(operand, index, axis) (index in bounds): float operands in their own dtype,
    quantized ones dequantized to float32."""
    if not isinstance(operand, QuantizedArray):
        return _row_chunks.from_bits(jnp.take(_row_chunks.as_bits(operand), index, axis=axis),
                                     operand.dtype)
    values = jnp.take(operand.values, index, axis=axis).astype(jnp.float32)
    if axis == operand.axis:
        scale = jnp.take(operand.scale, _block_of(operand, index), axis=axis)
    else:
        scale = jnp.take(operand.scale, index, axis=axis)
        # take put index's axes where `axis` was, moving the quantized axis if it came after.
        moved = operand.axis + index.ndim - 1 if operand.axis > axis else operand.axis
        scale = expand_scale(scale, moved, operand.block_size, operand.shape[operand.axis])
    return values * scale


def _block_of(operand: QuantizedArray, position: jax.Array) -> jax.Array:
    """The scale block of each `position` along the operand's quantized axis."""
    if operand.block_size is None:
        return jnp.zeros_like(position)
    return position // operand.block_size


# Products whose scales factor out of the sum: when no quantized operand has more than one
# scale block along the contraction, out = (values @ values) * row scales * column scales, and
# the values can be multiplied in a narrow dtype that holds them exactly (int8 x int8 with int32
# sums; otherwise bfloat16, which holds every int8 and fp8 value, with float32 sums), at the
# speed of that dtype's matmul rather than float32's.


def scales_factor_out(*operands: tuple[Any, int]) -> bool:
    """Whether every quantized one of the (operand, contraction axis) pairs is quantized along
    its contraction axis with one scale block there."""
    return all(operand.axis == axis and operand.num_blocks == 1
               for operand, axis in operands if isinstance(operand, QuantizedArray))


def carrier_dtype(*operands: Any, contraction: int) -> tuple[Any, Any]:
    """(the dtype the values are multiplied in, the dtype their products are summed in), for a
    product summing `contraction` terms."""
    if not any(isinstance(operand, QuantizedArray) for operand in operands):
        compute = compute_dtype(*operands)
        if compute == _INT8 and contraction > quantization.MAX_EXACT_INT32_TERMS:
            compute = jnp.dtype(jnp.bfloat16)
        return compute, jnp.dtype(jnp.int32 if compute == _INT8 else jnp.float32)
    dtypes = {jnp.dtype(operand.dtype) for operand in operands}
    if dtypes == {jnp.dtype(jnp.int8)} and contraction <= quantization.MAX_EXACT_INT32_TERMS:
        return jnp.dtype(jnp.int8), jnp.dtype(jnp.int32)
    exact_in_bf16 = all(jnp.dtype(operand.dtype) in EXACT_IN_BFLOAT16 for operand in operands)
    return jnp.dtype(jnp.bfloat16 if exact_in_bf16 else jnp.float32), jnp.dtype(jnp.float32)


def sliced_values(operand: Any, axis: int, start: jax.Array, size: int, loop_index: jax.Array,
                  dtype: Any) -> tuple[jax.Array, jax.Array | None]:
    """(the slice's values in `dtype`, its scales with the contraction axis dropped, or None
    for a float operand), for an operand whose scales factor out (`scales_factor_out`)."""
    array = operand.values if isinstance(operand, QuantizedArray) else operand
    part = _slice(array, axis, start, size, loop_index).astype(dtype)
    if not isinstance(operand, QuantizedArray):
        return part, None
    scale = lax.dynamic_slice_in_dim(operand.scale, start, size, axis)
    return part, jnp.squeeze(scale, operand.axis)


def indexed_values(operand: Any, index: jax.Array,
                   dtype: Any) -> tuple[jax.Array, jax.Array | None]:
    """`sliced_values` for operand[index] along the leading axis (dropped)."""
    array = operand.values if isinstance(operand, QuantizedArray) else operand
    part = _index(array, index).astype(dtype)
    if not isinstance(operand, QuantizedArray):
        return part, None
    scale = lax.dynamic_index_in_dim(operand.scale, index, 0, keepdims=False)
    return part, jnp.squeeze(scale, operand.axis - 1)
