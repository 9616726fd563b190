"""The contract of `transposed_grouped_matmul` (tgmm): one signature, its meaning, its checks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Integer, Real

from kernelhub._core.define import define_op
from kernelhub._core.errors import ShapeError
from kernelhub._core.dispatch import note_values_read
from kernelhub._grouped_matmul import names
from kernelhub._grouped_matmul.measured import measured_seconds
from kernelhub._grouped_matmul.tables import active as active_tuning
from kernelhub.ops import _checks
from kernelhub.ops._group_values import value_hooks
from kernelhub._qwix import QwixQArray
from kernelhub.quantization import QuantizedArray

NAME = names.TRANSPOSED_GROUPED_MATMUL

ArrayIn = jax.Array | np.ndarray


def _prepare(arguments: dict[str, Any]) -> dict[str, Any]:
    lhs = _checks.operand("lhs", arguments["lhs"], 2, "[k, m]", 1)
    rhs = _checks.operand("rhs", arguments["rhs"], 2, "[m, n]", 0)
    k, m = lhs.shape
    if rhs.shape[0] != m:
        raise ShapeError(
            f"rhs must have lhs's m={m} rows (lhs is [k, m] = {lhs.shape}), got shape {rhs.shape}"
        )
    n = rhs.shape[1]
    group_sizes = _checks.group_sizes(arguments["group_sizes"])
    num_groups = group_sizes.shape[0]
    actual = arguments["num_actual_groups"]
    offset_value = arguments["group_offset"]
    if actual is None:
        if offset_value is not None and not _checks.is_concrete(offset_value):
            raise ValueError(
                "num_actual_groups must be given when group_offset is traced (e.g. inside "
                "shard_map): the output's group count has to be static"
            )
        if isinstance(offset_value, jax.Array):  # the output's shape depends on its value
            note_values_read()
        offset = 0 if offset_value is None else int(np.asarray(offset_value))
        if not 0 <= offset < num_groups:
            raise ValueError(f"group_offset={offset} must lie in [0, {num_groups - 1}] (num_groups - 1)")
        actual = num_groups - offset
    if isinstance(actual, bool) or not isinstance(actual, (int, np.integer)):
        raise TypeError(f"num_actual_groups must be an int or None, got {type(actual).__name__}")
    actual = int(actual)
    if not 1 <= actual <= num_groups:
        raise ValueError(f"num_actual_groups={actual} must lie in [1, {num_groups}] (num_groups)")
    out_dtype = _checks.element_type(arguments["preferred_element_type"], lhs, rhs)
    return dict(
        lhs=lhs,
        rhs=rhs,
        group_sizes=group_sizes,
        preferred_element_type=out_dtype,
        tiling=_checks.tiling(arguments["tiling"]),
        group_offset=_checks.group_offset(offset_value),
        num_actual_groups=actual,
        existing_out=_checks.existing_out(arguments["existing_out"], (actual, k, n), out_dtype),
    )


# lhs [k, m] holds the rows along its second axis; None local groups: all from the offset on.
_check_values, _runtime_check = value_hooks(
    NAME, lambda arguments: arguments["lhs"].shape[1],
    lambda arguments: arguments["num_actual_groups"])


@define_op(validate=_prepare, runtime_check=_runtime_check, features=_checks.features,
           check_values=_check_values, validate_reads_values=False, context=active_tuning,
           measured=measured_seconds)
def transposed_grouped_matmul(
    lhs: Real[ArrayIn, "k m"] | QuantizedArray | QwixQArray,
    rhs: Real[ArrayIn, "m n"] | QuantizedArray | QwixQArray,
    group_sizes: Integer[ArrayIn, "num_groups"],
    preferred_element_type: Any = jnp.float32,
    tiling: _checks.Tiling = None,
    group_offset: int | Integer[ArrayIn, ""] | None = None,
    num_actual_groups: int | None = None,
    existing_out: Real[ArrayIn, "actual_groups k n"] | None = None,
) -> Real[jax.Array, "actual_groups k n"]:
    """Per-group products over the rows of each group: the weight gradient of grouped_matmul.

    Args:
      lhs: [k, m], columns sorted by group (group g owns columns
        [sum(group_sizes[:g]), sum(group_sizes[:g + 1]))); typically the transposed gmm input.
        Float, raw int8 or fp8 (as for grouped_matmul), or a QuantizedArray quantized along m
        (axis 1).
      rhs: [m, n], rows sorted the same way; typically gmm's output cotangent. Float, raw int8
        or fp8, or a QuantizedArray quantized along m (axis 0).
      group_sizes: [num_groups] integers >= 0 with sum <= m.
      preferred_element_type: dtype of the output (float32, bfloat16 or float16, or int32 for
        two integer operands); products are accumulated as for grouped_matmul and cast once.
      tiling: implementation-specific block sizes, as for grouped_matmul; never affects results.
      group_offset: first group computed (an int or int32 scalar, may be traced); 0 when None.
      num_actual_groups: how many groups to compute (static int). Defaults to
        num_groups - group_offset, which needs a concrete group_offset; inside shard_map pass it.
        Requires group_offset + num_actual_groups <= num_groups.
      existing_out: [num_actual_groups, k, n] of preferred_element_type, added to the result.

    Returns:
      [num_actual_groups, k, n] of preferred_element_type with
      out[j] = lhs[:, rows(g)] @ rhs[rows(g), :] (+ existing_out[j]) for g = group_offset + j,
      quantized operands counting as their dequantized values (as for grouped_matmul);
      an empty group gives exactly 0 (or existing_out[j]). Rows past sum(group_sizes) are read
      by no group, so a NaN there reaches no output.

    Gradients: exact VJPs for lhs, rhs and existing_out (whose cotangent is the output's);
    quantized operands as for grouped_matmul.

    Raises:
      TypeError or ValueError naming the argument, as for grouped_matmul, and for
      num_actual_groups out of range.
    """
