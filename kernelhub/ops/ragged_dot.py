"""The contract of `ragged_dot_general` and `ragged_dot`: jax.lax's, on kernelhub's kernels.

The names, argument order, defaults, dimension numbers and result dtypes of
`jax.lax.ragged_dot_general` and `jax.lax.ragged_dot`, so that `from kernelhub import ragged_dot`
is the whole migration, plus what lax lacks: `group_offset` in every mode, gradients in every
mode, and rows outside the computed groups exactly 0. The implementations map each mode onto the
grouped matmuls of one backend (kernelhub/_grouped_matmul/ragged_modes.py; registered in
kernelhub/_composite), so forcing a platform forces their kernels too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Integer, Shaped

from kernelhub._core import runtime_checks as _runtime_checks
from kernelhub._core.define import define_op
from kernelhub._core.errors import ShapeError
from kernelhub.ops import _checks
from kernelhub.ops._group_values import check_call, group_check
from kernelhub._grouped_matmul.groups import NO_OFFSET
from kernelhub._grouped_matmul.measured import measured_seconds
from kernelhub._grouped_matmul.problem import require_static
from kernelhub._grouped_matmul.ragged_modes import Mode, contraction_group, plan
from kernelhub import _qwix
from kernelhub._qwix import QwixQArray
from kernelhub.quantization import QuantizedArray

NAME = "ragged_dot_general"
SIMPLE_NAME = "ragged_dot"

ArrayIn = jax.Array | np.ndarray
DimensionNumbers = jax.lax.RaggedDotDimensionNumbers

# lax.ragged_dot's layout: lhs [m, k] ragged in m, rhs [g, k, n].
BASIC_DIMENSION_NUMBERS = DimensionNumbers((([1], [1]), ([], [])), [0], [0])

_ARGUMENT = "ragged_dot_dimension_numbers"


def _axes(name: str, axes: Any, rank: int, operand: str) -> tuple[int, ...]:
    axes = tuple(axes)
    if any(not isinstance(a, (int, np.integer)) or isinstance(a, bool) for a in axes):
        raise TypeError(f"{_ARGUMENT}: {name} must be ints, got {axes}")
    if any(not 0 <= a < rank for a in axes):
        raise ShapeError(f"{_ARGUMENT}: {name} {axes} must be axes of {operand}, which has rank {rank}")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{_ARGUMENT}: {name} {axes} repeats an axis")
    return tuple(int(a) for a in axes)


def check_dimension_numbers(numbers: Any, lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...],
                            num_groups: int, has_offset: bool = False) -> Mode:
    """Raises a TypeError or ShapeError naming the rule `numbers` break; returns the mode."""
    if not isinstance(numbers, DimensionNumbers):
        raise TypeError(f"{_ARGUMENT} must be a jax.lax.RaggedDotDimensionNumbers, got "
                        f"{type(numbers).__name__}")
    try:
        (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = numbers.dot_dimension_numbers
    except (TypeError, ValueError):
        raise TypeError(f"{_ARGUMENT}.dot_dimension_numbers must be ((lhs_contracting, "
                        f"rhs_contracting), (lhs_batch, rhs_batch))") from None
    lhs_rank, rhs_rank = len(lhs_shape), len(rhs_shape)
    lhs_contract = _axes("lhs contracting dims", lhs_contract, lhs_rank, "lhs")
    rhs_contract = _axes("rhs contracting dims", rhs_contract, rhs_rank, "rhs")
    lhs_batch = _axes("lhs batch dims", lhs_batch, lhs_rank, "lhs")
    rhs_batch = _axes("rhs batch dims", rhs_batch, rhs_rank, "rhs")
    for kind, lhs_axes, rhs_axes in (("contracting", lhs_contract, rhs_contract),
                                     ("batch", lhs_batch, rhs_batch)):
        if len(lhs_axes) != len(rhs_axes):
            raise ShapeError(f"{_ARGUMENT}: lhs and rhs must have as many {kind} dims, got "
                             f"{lhs_axes} and {rhs_axes}")
        for a, b in zip(lhs_axes, rhs_axes):
            if lhs_shape[a] != rhs_shape[b]:
                raise ShapeError(f"{_ARGUMENT}: {kind} dims lhs {a} (size {lhs_shape[a]}) and rhs "
                                 f"{b} (size {rhs_shape[b]}) must have the same size")
    for operand, contract, batch in (("lhs", lhs_contract, lhs_batch), ("rhs", rhs_contract, rhs_batch)):
        if set(contract) & set(batch):
            raise ShapeError(f"{_ARGUMENT}: {operand} axes {sorted(set(contract) & set(batch))} are "
                             f"both contracting and batch dims")
    ragged = tuple(numbers.lhs_ragged_dimensions)
    if len(ragged) != 1:
        raise ShapeError(f"{_ARGUMENT}.lhs_ragged_dimensions must hold exactly one lhs axis, got {ragged}")
    ragged_axis, = _axes("lhs_ragged_dimensions", ragged, lhs_rank, "lhs")
    groups = _axes("rhs_group_dimensions", numbers.rhs_group_dimensions, rhs_rank, "rhs")
    if ragged_axis in lhs_contract:
        mode = Mode.RAGGED_CONTRACTING
    elif ragged_axis in lhs_batch:
        mode = Mode.RAGGED_BATCH
    else:
        mode = Mode.RAGGED_NONCONTRACTING
    if mode is Mode.RAGGED_NONCONTRACTING:
        if len(groups) != 1:
            raise ShapeError(f"{_ARGUMENT}.rhs_group_dimensions must hold one rhs axis when the "
                             f"ragged lhs axis is not contracting or batch (mode 1), got {groups}")
        if groups[0] in rhs_contract + rhs_batch:
            raise ShapeError(f"{_ARGUMENT}: the rhs group dim {groups[0]} must not be a contracting "
                             f"or batch dim")
        local = rhs_shape[groups[0]]
        if not has_offset and local != num_groups:
            # lax's rule; with group_offset, rhs holds only the local groups
            raise ShapeError(f"rhs must hold {num_groups} groups on its group dim {groups[0]}, as "
                             f"group_sizes has {num_groups} sizes (fewer only with group_offset), "
                             f"got {local}")
        if not 1 <= local <= num_groups:
            raise ShapeError(f"rhs must hold between 1 and {num_groups} groups on its group dim "
                             f"{groups[0]} (group_sizes has {num_groups} sizes), got {local}")
    elif groups:
        raise ShapeError(f"{_ARGUMENT}.rhs_group_dimensions must be empty when the ragged lhs axis "
                         f"is a {'contracting' if mode is Mode.RAGGED_CONTRACTING else 'batch'} dim "
                         f"(mode {mode.value}), got {groups}")
    return mode


def _static_groups(numbers: Any, lhs_shape: tuple[Any, ...], rhs_shape: tuple[Any, ...],
                   num_groups: Any) -> None:
    """Raises a ShapeError naming the size that shape-polymorphic export left symbolic where
    the kernels need it static: the group count, rhs's group dim (mode 1), or lhs's ragged axis
    in mode 3 (its entries are the kernels' groups). Other rules are check_dimension_numbers'."""
    require_static(num_groups, "the group count (group_sizes' last dimension)")
    if not isinstance(numbers, DimensionNumbers):
        return
    for axis in numbers.rhs_group_dimensions:
        if isinstance(axis, (int, np.integer)) and 0 <= axis < len(rhs_shape):
            require_static(rhs_shape[axis], f"rhs's group dim {axis}")
    try:
        (_, _), (lhs_batch, _) = numbers.dot_dimension_numbers
        ragged, = numbers.lhs_ragged_dimensions
    except (TypeError, ValueError):
        return
    if isinstance(ragged, (int, np.integer)) and ragged in tuple(lhs_batch) and (
            0 <= ragged < len(lhs_shape)):
        require_static(lhs_shape[ragged], f"lhs's ragged batch dim {ragged} (mode 3)")


def _precision_rank(dtype: np.dtype) -> tuple[int, ...]:
    # lax's (and XLA's) order of precision: range, then mantissa, then width, then sign.
    if jnp.issubdtype(dtype, jnp.floating):
        info = jnp.finfo(dtype)
        return (int(info.maxexp), int(info.nmant), int(info.bits), 1)
    return (-1, -1, int(jnp.iinfo(dtype).bits), int(jnp.issubdtype(dtype, jnp.signedinteger)))


def _logical_dtype(operand: Any) -> np.dtype:
    """The dtype an operand counts as in lax's result rule: a QuantizedArray its float32
    dequantization's, a qwix QArray its own (qwix's logical dtype), an array its dtype."""
    if isinstance(operand, QuantizedArray):
        return jnp.dtype(jnp.float32)
    return jnp.dtype(getattr(operand, "dtype", jnp.float32))


def _element_type(value: Any, lhs: Any, rhs: Any) -> np.dtype:
    """lax's result dtype: `value`, or without one the operand dtype of higher precision
    (float16 x bfloat16 gives bfloat16, int8 x fp8 fp8, int8 x int8 int8, as lax's)."""
    lhs_dtype, rhs_dtype = _logical_dtype(lhs), _logical_dtype(rhs)
    natural = max(lhs_dtype, rhs_dtype, key=_precision_rank)
    if value is None:
        return natural
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        raise TypeError(f"preferred_element_type must be a dtype or None, got {value!r}") from None
    if (not (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating))
            or dtype.itemsize > 4):
        raise TypeError(f"preferred_element_type must be an integer or float dtype of at most "
                        f"32 bits (float32, bfloat16, float16, int32, int8, fp8, ...) or None, "
                        f"got {dtype}")
    if (jnp.issubdtype(natural, jnp.integer)
            and _precision_rank(dtype)[2] < _precision_rank(natural)[2]):
        raise TypeError(f"preferred_element_type {dtype} must not be narrower than the "
                        f"operands' {natural} (as lax's)")
    return dtype


def _operand(name: str, value: Any) -> Any:
    """A float or raw 8-bit array, a QuantizedArray, or a qwix QArray (kept for `_quantized`,
    which needs the mode's contraction axis)."""
    if _qwix.is_qarray(value):
        return value
    if isinstance(value, QuantizedArray):
        value.check(name)  # one rebuilt from leaves skipped the constructor's checks
        return value
    return _checks.operand_array(name, value)


def _quantized(name: str, value: Any, p: Any) -> Any:
    """`value` with its quantization checked against the mode: scales apply to whole partial
    sums only along the axis the product sums over, the last of the axes the kernels' contraction
    axis merges (kernelhub/_grouped_matmul/ragged_modes.py); a qwix QArray is converted for
    that axis."""
    if not (_qwix.is_qarray(value) or isinstance(value, QuantizedArray)):
        return value
    group = contraction_group(p, name)
    where = ("its ragged contracting dim and the contracting dims after it (mode 2)"
             if p.mode is Mode.RAGGED_CONTRACTING else "its contracting dims")
    if not group:
        raise ValueError(f"{name} cannot be quantized here: its product sums over no axis of it")
    axis = group[-1]
    if _qwix.is_qarray(value):
        value = _qwix.converted(value, axis)
        if not isinstance(value, QuantizedArray):
            return value  # dequantized to float32
    if value.axis != axis:
        raise ValueError(
            f"{name} is quantized along axis {value.axis}, but a quantized {name} must be "
            f"quantized along the axis its product sums over, axis {axis} here (the last of "
            f"{where}, {group}): quantize it with axis={axis}")
    shape = p.lhs_shape if name == "lhs" else p.rhs_shape
    merged = math.prod(shape[a] for a in group[:-1])
    if merged > 1 and value.block_size is not None and shape[axis] % value.block_size:
        raise ValueError(
            f"{name}'s scale blocks of {value.block_size} must divide its axis {axis} "
            f"({shape[axis]}), which is merged with its axes {group[:-1]} into one contraction: "
            f"use a block size dividing {shape[axis]}, or None")
    return value.with_float32_scale()  # MX and NVFP4 scales reach the kernels as float32


def _precision(value: Any) -> Any:
    """lax's precision argument, checked and kept. The kernels accumulate in float32 from the
    inputs as given whatever it says, which is at least what any setting asks for."""
    def one(v: Any) -> bool:
        if v is None or isinstance(v, jax.lax.Precision):
            return True
        if isinstance(v, str):
            try:
                jax.lax.Precision(v.lower())
            except ValueError:
                return False
            return True
        return False

    if one(value) or isinstance(value, jax.lax.DotAlgorithmPreset):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(map(one, value)):
        return tuple(value)
    raise TypeError(f"precision must be None, a jax.lax.Precision (or its name), a pair of them, "
                    f"or a jax.lax.DotAlgorithmPreset, got {value!r}")


def _group_sizes(value: Any, prefix_shape: tuple[int, ...]) -> jax.Array:
    array = _checks.as_array(value)
    if not jnp.issubdtype(array.dtype, jnp.integer):
        raise TypeError(f"group_sizes must have an integer dtype, got {array.dtype}")
    if array.ndim != 1 and array.shape[:-1] != prefix_shape:
        if not prefix_shape:
            raise ShapeError(f"group_sizes must have shape (g,), got {array.shape}")
        prefixed = "(" + ", ".join(map(str, prefix_shape)) + ", g)"
        raise ShapeError(f"group_sizes must have shape (g,) or {prefixed} (the lhs dims before the "
                         f"ragged one, as lax allows), got {array.shape}")
    array = _checks.as_int32(array)
    if array.ndim == 1 and prefix_shape:
        array = jnp.broadcast_to(array, prefix_shape + array.shape)
    return array


def _group_offset(value: Any) -> jax.Array | None:
    if value is None:
        return None
    if isinstance(value, bool) or not hasattr(value, "shape") and not isinstance(value, (int, np.integer)):
        raise TypeError(f"group_offset must be an int or an integer array of shape (1,) or (), got "
                        f"{type(value).__name__}")
    if hasattr(value, "shape") and tuple(value.shape) not in ((), (1,)):
        raise TypeError(f"group_offset must have shape (1,) (as lax's) or (), got {tuple(value.shape)}")
    return _checks.group_offset(value)


def prepare(arguments: dict[str, Any], op: str = NAME) -> dict[str, Any]:
    lhs = _operand("lhs", arguments["lhs"])
    rhs = _operand("rhs", arguments["rhs"])
    numbers = arguments["ragged_dot_dimension_numbers"]
    sizes_shape = tuple(np.shape(arguments["group_sizes"]))
    if not sizes_shape or sizes_shape[-1] == 0:
        raise ShapeError(f"group_sizes must have a last axis of at least one group, got shape "
                         f"{sizes_shape}")
    num_groups = sizes_shape[-1]
    _static_groups(numbers, lhs.shape, rhs.shape, num_groups)
    check_dimension_numbers(numbers, lhs.shape, rhs.shape, num_groups,
                            arguments["group_offset"] is not None)
    p = plan(lhs.shape, rhs.shape, numbers, num_groups)
    prefix_shape = tuple(lhs.shape[a] for a in p.prefix)
    group_sizes = _group_sizes(arguments["group_sizes"], prefix_shape)
    out_dtype = _element_type(arguments["preferred_element_type"], lhs, rhs)
    activation = _checks.activation_function(arguments["activation"])
    if activation is not None and _checks.accumulation_dtype(lhs, rhs) == _checks.INT32:
        raise TypeError("activation needs float sums: two integer operands are summed exactly "
                        "in int32; quantize one or cast it to a float dtype")
    return dict(
        lhs=_quantized("lhs", lhs, p),
        rhs=_quantized("rhs", rhs, p),
        group_sizes=group_sizes,
        ragged_dot_dimension_numbers=numbers,
        precision=_precision(arguments["precision"]),
        preferred_element_type=out_dtype,
        group_offset=_group_offset(arguments["group_offset"]),
        out_sharding=arguments["out_sharding"],
        activation=activation,
    )


def _extent_and_local_groups(arguments: dict[str, Any]) -> tuple[int, int]:
    """The length of the ragged axis, and how many groups are local: in mode 1 the rhs group
    dim holds them; in modes 2 and 3, one offset's worth (group_offset .. the last)."""
    numbers = arguments["ragged_dot_dimension_numbers"]
    lhs_shape, rhs_shape = np.shape(arguments["lhs"]), np.shape(arguments["rhs"])
    p = plan(lhs_shape, rhs_shape, numbers, np.shape(arguments["group_sizes"])[-1])
    local = rhs_shape[p.rhs_group_axis] if p.mode is Mode.RAGGED_NONCONTRACTING else 1
    return lhs_shape[numbers.lhs_ragged_dimensions[0]], local


def _check_values(arguments: dict[str, Any], op: str = NAME) -> None:
    # Sizes summing past the ragged axis are lax-valid (the excess is dropped): not an error
    # here, only under kernelhub.runtime_checks() (_runtime_check), where the user asks for it.
    extent, local = _extent_and_local_groups(arguments)
    check_call(arguments["group_sizes"], arguments["group_offset"], extent, local, op,
               allow_excess=True)


def _runtime_check(arguments: dict[str, Any], op: str = NAME) -> None:
    extent, local = _extent_and_local_groups(arguments)
    offset = arguments["group_offset"]

    row_check = group_check(op, extent, local)

    def check(group_sizes: np.ndarray, group_offset: np.ndarray) -> None:
        for row in np.asarray(group_sizes).reshape(-1, group_sizes.shape[-1]):
            row_check(row, group_offset)

    _runtime_checks.host_check(check, arguments["group_sizes"],
                               NO_OFFSET if offset is None else offset)


@define_op(validate=prepare, runtime_check=_runtime_check, check_values=_check_values,
           validate_reads_values=False, features=_checks.features, measured=measured_seconds)
def ragged_dot_general(
    lhs: Shaped[ArrayIn, "..."] | QuantizedArray | QwixQArray,
    rhs: Shaped[ArrayIn, "..."] | QuantizedArray | QwixQArray,
    group_sizes: Integer[ArrayIn, "..."],
    ragged_dot_dimension_numbers: DimensionNumbers,
    precision: Any = None,
    preferred_element_type: Any = None,
    group_offset: int | Integer[ArrayIn, ""] | Integer[ArrayIn, "1"] | None = None,
    out_sharding: Any = None,
    activation: str | Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
    """Ragged matrix multiplication, as jax.lax.ragged_dot_general, on kernelhub's kernels.

    One lhs axis is ragged: split into g consecutive groups by group_sizes (group i owns the
    indices [sum(group_sizes[:i]), sum(group_sizes[:i + 1]))). Three modes, by the kind of that
    axis (b: batch, m: lhs free, k: contracting, n: rhs free dims, in any order and number):

      1. a free axis of lhs:  [b, m, k] x [g, b, k, n] -> [b, m, n], each group's rows times
         its own rhs (the MoE expert matmul; rhs has a group dim);
      2. a contracting axis:  [b, m, k] x [b, k, n] -> [g, b, m, n], one product per group over
         its indices only (the weight gradient of mode 1);
      3. a batch axis:        [b, m, k] x [b, k, n] -> [b, m, n], a batched product whose
         batch entries are grouped.

    Args:
      lhs, rhs: arrays laid out as `ragged_dot_dimension_numbers` say (any order of axes;
        transposed rhs layouts are read in place): float32, bfloat16, float16, or raw int8
        (narrower integers such as int4 are widened to it), float8_e4m3fn or float8_e5m2
        values without scales, as lax takes them; or a kernelhub.QuantizedArray or qwix.QArray
        quantized along the axis the product sums over (the last contracting dim in modes 1
        and 3, the last of the ragged contracting dim and those after it in mode 2), whose
        scales follow the values (docs/quantization.md).
      group_sizes: integers >= 0 of shape [g], or [*prefix, g] where prefix are lax's: the batch
        dims then the lhs free (mode 1) or contracting (mode 2) dims before the ragged one, or
        in mode 3 the batch dims before it. As in lax, their sum may differ from the ragged
        axis's length: indices past the sum belong to no group, and sizes that reach past the
        axis's end are cut there (the first groups own the indices that exist). Sums are exact
        (no int32 wrap). kernelhub.runtime_checks() reports a sum past the axis as an error.
      ragged_dot_dimension_numbers: a jax.lax.RaggedDotDimensionNumbers: lax's dot dimension
        numbers, the one lhs ragged axis, and the rhs group axis (mode 1 only).
      precision: as lax's (checked, and met: kernels accumulate in float32 from the inputs as
        given).
      preferred_element_type: the result dtype, any integer or float dtype of up to 32 bits;
        None gives lax's rule, the operand dtype of higher precision (int8 for int8 x int8,
        bfloat16 for float16 x bfloat16; a quantized operand counts as float32). Two integer
        operands are summed exactly in int32 (wrapping past 2**31, as lax's), any other pair
        in float32; the sum is cast once to the result dtype.
      group_offset: the first local group, as lax's (1,)-shaped array, a scalar or an int; may
        be traced (e.g. inside shard_map). Mode 1: rhs's group dim holds the local groups
        group_offset .. group_offset + L - 1, L its length (L may be less than g). Mode 2: the
        result's entry j is group group_offset + j, and the entries past the last group are 0.
        Mode 3: the groups from group_offset on are computed.
      out_sharding: as lax's: the result is resharded to it when given.
      activation: beyond lax: applied to the float32 sums before the cast (fused into the
        grouped-matmul kernel in modes 1 and 3), as grouped_matmul's `activation`: a name
        ("relu", "silu", "gelu", "gelu_tanh", "tanh", "sigmoid", "identity") or any elementwise,
        differentiable callable (tokamax's `activation=`). Entries that belong to no local
        group stay exactly 0. Not for two integer operands.

    Returns:
      lax's result shape (mode 2 with a leading g) and dtype. Rows (mode 1), products (mode 2)
      or batch entries (mode 3) that belong to no local group are exactly 0; lax computes mode 3
      batch entries past the groups, kernelhub gives 0 there, as in the other modes.

    Gradients: exact VJPs for lhs and rhs in every mode (lax differentiates mode 1 only). As in
    lax an integer operand takes none and a raw fp8 one takes an fp8 gradient; a quantized
    operand's is straight-through to what kernelhub.quantize quantized.

    Raises:
      TypeError or ValueError naming the argument and the rule, before anything is traced: the
      dimension numbers (axes out of range or repeated, contracting or batch sizes that differ,
      not exactly one ragged axis, a group dim where the mode has none or none where it needs
      one), dtypes, group_sizes' shape, group_offset's range, and (when concrete) negative sizes
      or sizes past int32.
    """


def _simple_prepare(arguments: dict[str, Any]) -> dict[str, Any]:
    # Ranks were checked against the annotations ([m, k], [g, k, n], [g]) before this runs.
    prepared = prepare({**arguments, "ragged_dot_dimension_numbers": BASIC_DIMENSION_NUMBERS},
                       SIMPLE_NAME)
    del prepared["ragged_dot_dimension_numbers"]
    return prepared


def _simple_runtime_check(arguments: dict[str, Any]) -> None:
    _runtime_check({**arguments, "ragged_dot_dimension_numbers": BASIC_DIMENSION_NUMBERS},
                   SIMPLE_NAME)


def _simple_check_values(arguments: dict[str, Any]) -> None:
    check_call(arguments["group_sizes"], arguments["group_offset"], np.shape(arguments["lhs"])[0],
               np.shape(arguments["rhs"])[0], SIMPLE_NAME, allow_excess=True)


@define_op(name=SIMPLE_NAME, validate=_simple_prepare, runtime_check=_simple_runtime_check,
           check_values=_simple_check_values, validate_reads_values=False,
           features=_checks.features, measured=measured_seconds)
def ragged_dot(
    lhs: Shaped[ArrayIn, "m k"] | QuantizedArray | QwixQArray,
    rhs: Shaped[ArrayIn, "local_groups k n"] | QuantizedArray | QwixQArray,
    group_sizes: Integer[ArrayIn, "num_groups"],
    precision: Any = None,
    preferred_element_type: Any = None,
    group_offset: int | Integer[ArrayIn, ""] | Integer[ArrayIn, "1"] | None = None,
    out_sharding: Any = None,
    activation: str | Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
    """[m, k] x [g, k, n] -> [m, n]: each group of lhs rows times its own rhs, as
    jax.lax.ragged_dot; ragged_dot_general's mode 1 with lhs [m, k] ragged in m (see
    kernelhub.ragged_dot_general for every argument).

    Rows past sum(group_sizes), and with group_offset the rows of groups outside
    group_offset .. group_offset + rhs.shape[0] - 1, are exactly 0.
    """

