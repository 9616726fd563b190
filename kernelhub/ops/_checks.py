"""Argument checks shared by the grouped-matmul contracts.

Each raises a TypeError (wrong kind of thing) or ValueError (right kind, wrong value) whose
message starts with the argument's name, and returns the argument normalised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernelhub import _qwix
from kernelhub._core.dtypes import dtype_among
from kernelhub._core.errors import ShapeError
from kernelhub._core.shapes import is_static, symbolic_shapes
from kernelhub._grouped_matmul.contraction_scales import fits_kernels
from kernelhub._grouped_matmul.epilogue import (
    ACTIVATIONS, CONCATENATED, GLU_LAYOUTS, GLUS, Epilogue)
from kernelhub._grouped_matmul.groups import NO_OFFSET
from kernelhub._grouped_matmul.problem import require_static
from kernelhub._grouped_matmul.names import (
    QUANTIZED, QUANTIZED_4BIT, QUANTIZED_BLOCKS, QUANTIZED_ODD_BLOCKS, SYMBOLIC_SHAPES)
from kernelhub._grouped_matmul.tables import active as active_tuning
from kernelhub._grouped_matmul.tilings import SingleTiling, Tilings, as_tilings
from kernelhub.quantization import FOUR_BIT_DTYPES, QUANTIZED_DTYPES, QuantizedArray

FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_FLOAT_NAMES = "float32, bfloat16 or float16"
# Raw 8-bit operands, without scales, as lax's ragged_dot takes them (qwix and AQT apply their
# scales themselves): the kernels multiply them on their int8 and fp8 paths. Integers narrower
# than int8 (int4, uint4, int2, ...) are widened to int8, exactly.
RAW_DTYPES = QUANTIZED_DTYPES
OPERAND_DTYPES = FLOAT_DTYPES + RAW_DTYPES
_OPERAND_NAMES = ("float32, bfloat16, float16, int8 (or a narrower integer such as int4), "
                  "float8_e4m3fn or float8_e5m2")
INT32 = jnp.dtype(jnp.int32)
# What the kernels write: a float dtype, or int32 for integer operands (exact sums).
OUTPUT_DTYPES = FLOAT_DTYPES + (INT32,)
_OUTPUT_NAMES = "float32, bfloat16, float16 or int32 (for integer operands)"

Tiling = SingleTiling | Tilings | Mapping[str, SingleTiling]


def is_concrete(value: Any) -> bool:
    """Whether `value` holds known numbers (not a tracer inside jit, vmap or grad)."""
    return not isinstance(value, jax.core.Tracer)


def as_array(value: Any) -> jax.Array:
    """`value` as a jax array; one already is passes through (jnp.asarray would cost an op)."""
    return value if isinstance(value, jax.Array) else jnp.asarray(value)


_INT32 = np.iinfo(np.int32)


def as_int32(array: jax.Array) -> jax.Array:
    """`array` as int32, saturating: a value int32 cannot hold becomes its nearest int32 (the
    value checks report it; unchecked, the kernels then clamp it like any size past the rows),
    never one that wrapped around (2**32 + 5 read as 5)."""
    if array.dtype == jnp.int32:
        return array
    info = np.iinfo(array.dtype)
    if info.min < _INT32.min or info.max > _INT32.max:
        array = jnp.clip(array, max(info.min, _INT32.min), min(info.max, _INT32.max))
    return array.astype(jnp.int32)


def _fits_int8(dtype: np.dtype) -> bool:
    info = jnp.iinfo(dtype)
    return info.min >= -128 and info.max <= 127


def operand_array(name: str, value: Any) -> jax.Array:
    """A float or raw 8-bit operand (OPERAND_DTYPES); a narrower integer widened to int8."""
    array = as_array(value)
    dtype = jnp.dtype(array.dtype)
    if dtype in OPERAND_DTYPES:
        return array
    if jnp.issubdtype(dtype, jnp.integer) and _fits_int8(dtype):
        return array.astype(jnp.int8)
    raise TypeError(f"{name} must have dtype {_OPERAND_NAMES}, got {dtype}; cast it: "
                    f"x.astype(jnp.float32) (or bfloat16)")


def is_integer(operand: Any) -> bool:
    """Whether `operand` is a raw integer array (a QuantizedArray stands for floats)."""
    return (not isinstance(operand, QuantizedArray)
            and jnp.issubdtype(jnp.dtype(operand.dtype), jnp.integer))


def accumulation_dtype(lhs: Any, rhs: Any) -> np.dtype:
    """What products of these operands are summed in: int32 for two integer arrays (exact, as
    lax), float32 otherwise (fp8 included)."""
    return INT32 if is_integer(lhs) and is_integer(rhs) else jnp.dtype(jnp.float32)


def float_matrix(name: str, value: Any, rank: int, layout: str) -> jax.Array:
    array = as_array(value)
    if array.ndim != rank:
        raise ShapeError(f"{name} must have rank {rank} ({layout}), got shape {array.shape}")
    return operand_array(name, array)


def operand(name: str, value: Any, rank: int, layout: str, contraction_axis: int) -> Any:
    """A float or raw 8-bit array of `rank`, or a QuantizedArray quantized along `contraction_axis` (the axis
    the product sums over, where its scales can be applied to each block's partial sums). A
    qwix QArray becomes one of the two (kernelhub/_qwix.py)."""
    if _qwix.is_qarray(value):
        if len(value.shape) != rank:
            raise ShapeError(f"{name} must have rank {rank} ({layout}), got a qwix QArray of "
                             f"shape {tuple(value.shape)}")
        value = _qwix.converted(value, contraction_axis)
    if not isinstance(value, QuantizedArray):
        return float_matrix(name, value, rank, layout)
    value.check(name)  # one rebuilt from leaves skipped the constructor's checks
    # MX (e8m0) and NVFP4 (e4m3 under a tensor scale) scales reach the kernels as float32.
    value = value.with_float32_scale()
    if value.ndim != rank:
        raise ShapeError(f"{name} must have rank {rank} ({layout}), got a QuantizedArray of shape "
                         f"{value.shape}")
    if value.axis != contraction_axis:
        axis_names = layout.strip("[]").split(", ")
        raise ValueError(
            f"{name} is quantized along axis {value.axis} ({axis_names[value.axis]}) but must be "
            f"quantized along its contraction axis {contraction_axis} "
            f"({axis_names[contraction_axis]}): quantize it with axis={contraction_axis}")
    return value


def features(arguments: dict[str, Any]) -> frozenset[str]:
    """The optional features a grouped-matmul call uses."""
    operands = [arguments.get(name) for name in ("lhs", "rhs")]
    symbolic = bool(symbolic_shapes(operands))
    used = set(Epilogue(arguments.get("bias") is not None, arguments.get("activation"),
                        arguments.get("glu")).features())
    if symbolic:
        used.add(SYMBOLIC_SHAPES)
    quantized = [operand for operand in operands if isinstance(operand, QuantizedArray)]
    if not quantized:
        return frozenset(used)
    used.add(QUANTIZED)
    if any(jnp.dtype(operand.values.dtype) in FOUR_BIT_DTYPES for operand in quantized):
        used.add(QUANTIZED_4BIT)
    blocked = [operand for operand in quantized if operand.num_blocks > 1]
    if blocked:
        used.add(QUANTIZED_BLOCKS)
    if any(not fits_kernels(operand.block_size) for operand in blocked):
        used.add(QUANTIZED_ODD_BLOCKS)
    return frozenset(used)


def epilogue(arguments: dict[str, Any], local_groups: int, rhs_columns: int,
             out_dtype: np.dtype) -> tuple[Epilogue, jax.Array | None]:
    """(the Epilogue, the bias array or None) of grouped_matmul's bias, activation, glu and
    glu_layout (kernelhub/_grouped_matmul/epilogue.py)."""
    activation, glu = arguments.get("activation"), arguments.get("glu")
    layout = arguments.get("glu_layout", CONCATENATED)
    if not isinstance(layout, str) or layout.strip().lower() not in GLU_LAYOUTS:
        raise ValueError(f"glu_layout must be one of {', '.join(map(repr, GLU_LAYOUTS))}, got "
                         f"{layout!r}")
    layout = layout.strip().lower()
    if activation is not None and glu is not None:
        raise ValueError(f"activation and glu cannot both be given (got activation="
                         f"{activation!r}, glu={glu!r}): glu applies its own activation to the "
                         f"gate half")
    activation = activation_function(activation)
    if glu is not None:
        if not isinstance(glu, str):
            raise TypeError(f"glu must be a name ({', '.join(GLUS)}), got "
                            f"{type(glu).__name__}")
        glu = _name_among("glu", glu, GLUS)
        if is_static(rhs_columns) and rhs_columns % 2:
            raise ShapeError(f"glu needs rhs to hold an even number of columns (gate and up "
                             f"halves), got {rhs_columns}")
    bias = arguments.get("bias")
    if bias is not None:
        bias = as_array(bias)
        if jnp.dtype(bias.dtype) not in FLOAT_DTYPES:
            raise TypeError(f"bias must have dtype {_FLOAT_NAMES}, got {bias.dtype}")
        if bias.shape != (local_groups, rhs_columns):
            raise ShapeError(f"bias must have shape {(local_groups, rhs_columns)} ([local_groups, "
                             f"n_rhs]: one row per group of rhs, one entry per rhs column), got "
                             f"{bias.shape}")
    spec = Epilogue(bias is not None, activation, glu, layout if glu is not None else CONCATENATED)
    if not spec.is_identity and jnp.issubdtype(out_dtype, jnp.integer):
        raise TypeError("bias, activation and glu need a float preferred_element_type (they act "
                        "on float32 sums), got int32")
    return spec, bias


def activation_function(value: Any) -> str | Any:
    """`activation` as a name of ACTIVATIONS (normalised) or a callable, or None."""
    if isinstance(value, str):
        return _name_among("activation", value, ACTIVATIONS)
    if value is not None and not callable(value):
        raise TypeError(f"activation must be a name ({', '.join(ACTIVATIONS)}) or a callable, "
                        f"got {type(value).__name__}")
    return value


def _name_among(argument: str, name: str, names: Mapping[str, Any]) -> str:
    key = name.strip().lower()
    if key not in names:
        raise ValueError(f"{argument} must be one of {', '.join(map(repr, names))}, got {name!r}")
    return key


def element_type(value: Any, lhs: Any, rhs: Any) -> np.dtype:
    """The grouped matmuls' output dtype: a float one, or int32 for two integer operands."""
    dtype = dtype_among("preferred_element_type", value, OUTPUT_DTYPES, _OUTPUT_NAMES)
    if dtype == INT32 and accumulation_dtype(lhs, rhs) != INT32:
        raise TypeError(
            f"preferred_element_type int32 needs two integer operands (int8 arrays, summed "
            f"exactly in int32), got {_kind(lhs)} and {_kind(rhs)}: ask for float32")
    return dtype


def _kind(operand: Any) -> str:
    if isinstance(operand, QuantizedArray):
        return "a QuantizedArray"
    return f"{jnp.dtype(operand.dtype)}"


def group_sizes(value: Any) -> jax.Array:
    """group_sizes as int32 [G] (their values are the contracts' `check_values`' business:
    kernelhub/ops/_group_values.py)."""
    array = as_array(value)
    if not jnp.issubdtype(array.dtype, jnp.integer):
        raise TypeError(f"group_sizes must have an integer dtype (int32), got {array.dtype}")
    if array.ndim != 1:
        raise ShapeError(f"group_sizes must have rank 1 ([num_groups]), got shape {array.shape}")
    require_static(array.shape[0], "the group count (group_sizes' last dimension)")
    if array.shape[0] == 0:
        raise ShapeError("group_sizes must hold at least one group, got shape (0,)")
    return as_int32(array)


def tiling(value: Any) -> Tilings:
    """`tiling` as per-pass Tilings (kernelhub/_grouped_matmul/tilings.py), carrying the tuning table in
    force where the call is made (kernelhub/tuning)."""
    return as_tilings(value, active_tuning())


def group_offset(value: Any) -> jax.Array:
    """group_offset as an int32 scalar (0 when None); its value is checked by the contracts'
    `check_values` (kernelhub/ops/_group_values.py)."""
    if value is None:
        return NO_OFFSET
    if isinstance(value, bool):
        raise TypeError("group_offset must be an int or an int32 scalar array, got bool")
    array = as_array(value)
    if not jnp.issubdtype(array.dtype, jnp.integer) or array.ndim > 1 or array.size != 1:
        raise TypeError(
            f"group_offset must be an int or an integer scalar array, got {getattr(array, 'dtype', type(value))} "
            f"of shape {array.shape}"
        )
    return as_int32(array if array.ndim == 0 else array.reshape(()))


def existing_out(value: Any, shape: tuple[int, ...], dtype: np.dtype) -> jax.Array | None:
    if value is None:
        return None
    array = as_array(value)
    if array.shape != shape:
        raise ShapeError(f"existing_out must have shape {shape} (the output's), got {array.shape}")
    if array.dtype != dtype:
        raise TypeError(
            f"existing_out must have dtype {dtype} (preferred_element_type), got {array.dtype}"
        )
    return array


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)
