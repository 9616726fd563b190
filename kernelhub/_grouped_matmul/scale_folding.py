"""Quantized operands for kernels that multiply int8 and fp8 arrays: where their scales go.

The Pallas kernels take int8 and fp8 arrays as operands (multiplied as stored or widened per
tile) and apply scale blocks along the contraction themselves (`scales=`,
kernelhub/_grouped_matmul/contraction_scales.py). A QuantizedArray (kernelhub/quantization.py) with one
scale along its quantized axis has a scale that varies along one axis of the product only:
where that axis is an output axis, the scale multiplies grouped_matmul's float32 tile in the
kernel, before its store and ahead of any bias or activation (`KernelEpilogue`'s row_scale and
column_scale; tgmm's result is scaled after its kernel); where it is the contraction axis (the backward products, whose other
operand is a float cotangent), it is folded into the other operand first. An operand with
several scale blocks along an output axis (again only in backward products, where the quantized
operand is the gradient's other factor) has scales varying along both axes: the kernels take it
as `output_blocks=` (OutputBlockScales) and dequantize it tile by tile. In every case the
result is the float32 product of the dequantized operands, cast once.

`folded(raw_gmm, raw_tgmm)` wraps such kernels into raw kernels with the contracts' arguments
(kernelhub/_grouped_matmul/registration.py does, for the backends that ask for it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kernelhub._grouped_matmul.contraction_scales import ContractionScales, OutputBlockScales
from kernelhub._grouped_matmul.epilogue import NO_EPILOGUE, KernelEpilogue
from kernelhub._grouped_matmul.groups import row_groups
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub.quantization import QuantizedArray

RawKernel = Any


class Folded(NamedTuple):
    grouped_matmul: RawKernel
    transposed_grouped_matmul: RawKernel


def _is_quantized(*operands: Any) -> bool:
    return any(isinstance(operand, QuantizedArray) for operand in operands)


def _scales(operand: QuantizedArray) -> jax.Array:
    """The scale of a one-block QuantizedArray with its quantized axis dropped: a vector for a
    matrix, [G, the other axis] for experts' weights."""
    if operand.num_blocks != 1:
        raise ValueError("scale folding needs one scale block along the quantized axis; "
                         f"got {operand!r}")
    return jnp.squeeze(operand.scale, operand.axis)


def _blocked_along(operand: Any, contraction_axis: int) -> bool:
    """Whether `operand` is quantized with several scale blocks along the contraction."""
    return (isinstance(operand, QuantizedArray) and operand.axis == contraction_axis
            and operand.num_blocks > 1)


def _blocked_across(operand: Any, contraction_axis: int) -> bool:
    """Whether `operand` is quantized with several scale blocks along an output axis."""
    return (isinstance(operand, QuantizedArray) and operand.axis != contraction_axis
            and operand.num_blocks > 1)


def _take_blocked(lhs: Any, rhs: Any, lhs_blocked: bool, rhs_blocked: bool, kind: Any
                  ) -> tuple[Any, Any, Any]:
    """(lhs, rhs, `kind` (ContractionScales or OutputBlockScales) of the blocked ones' scales,
    or None when neither is): a blocked operand becomes its values."""
    if not (lhs_blocked or rhs_blocked):
        return lhs, rhs, None
    lhs_scale = rhs_scale = None
    lhs_block = rhs_block = 0
    if lhs_blocked:
        lhs_scale, lhs_block, lhs = lhs.scale, lhs.block_size, lhs.values
    if rhs_blocked:
        rhs_scale, rhs_block, rhs = rhs.scale, rhs.block_size, rhs.values
    return lhs, rhs, kind(lhs_scale, lhs_block, rhs_scale, rhs_block)


def _kernel_scales(lhs: Any, lhs_axis: int, rhs: Any, rhs_axis: int
                   ) -> tuple[Any, Any, dict[str, Any]]:
    """(lhs, rhs, the kernel's keywords for their scale blocks along and across the
    contraction): blocked operands become their values."""
    lhs, rhs, output_blocks = _take_blocked(lhs, rhs, _blocked_across(lhs, lhs_axis),
                                            _blocked_across(rhs, rhs_axis), OutputBlockScales)
    lhs, rhs, scales = _take_blocked(lhs, rhs, _blocked_along(lhs, lhs_axis),
                                     _blocked_along(rhs, rhs_axis), ContractionScales)
    options = {"scales": scales, "output_blocks": output_blocks}
    return lhs, rhs, {name: value for name, value in options.items() if value is not None}


def _float(operand: Any) -> jax.Array:
    """A fold target in float32, the scales' dtype (a quantized one, which the contracts never
    make one, dequantized): cast, not promoted, so strict dtype promotion accepts the product."""
    array = operand.dequantize() if isinstance(operand, QuantizedArray) else operand
    return array.astype(jnp.float32)


def _folded_into_other(operand: Any, contraction_axis: int) -> bool:
    """Whether a quantized operand's one scale block varies along the contraction (it is
    quantized along its other axis): then it multiplies the other operand, in float32, before
    the kernel; quantized along the contraction, its scale varies along an output axis and
    multiplies the result."""
    return operand.axis != contraction_axis


def folded_problem(problem: Problem, lhs: Any, rhs: Any) -> Problem:
    """`problem` (a call's, whose key names its operands' stored types) as the wrapped kernel
    of `folded` gets it: the operand a scale is folded into is float32 (the first fold
    dequantizes that operand, so one at most), and a tgmm whose result is scaled after its
    kernel has a float32 result and no existing_out there. A tiling for the key's types may
    not suit the wider tiles (kernelhub/_grouped_matmul/passes.py, KernelCall.kernel_problem)."""
    tgmm = problem.kernel is Kernel.TGMM
    # lhs [m, k] or tgmm's [k, m]: axis 1; rhs [G, k, n], [G, n, k] or tgmm's [m, n].
    rhs_contraction = 0 if tgmm else 2 if problem.kernel is Kernel.GMM_TRANSPOSED_RHS else 1
    lhs_quantized, rhs_quantized = (isinstance(x, QuantizedArray) and x.num_blocks == 1
                                    for x in (lhs, rhs))
    lhs_folds = lhs_quantized and _folded_into_other(lhs, 1)
    rhs_quantized = rhs_quantized and not lhs_folds  # else dequantized by that fold
    changes: dict[str, Any] = {}
    if lhs_folds:
        changes["rhs_dtype"] = "float32"
    elif rhs_quantized and _folded_into_other(rhs, rhs_contraction):
        changes["lhs_dtype"] = "float32"
    if tgmm and ((lhs_quantized and not lhs_folds) or
                 (rhs_quantized and not _folded_into_other(rhs, rhs_contraction))):
        changes.update(out_dtype="float32", has_existing=False)
    return dataclasses.replace(problem, **changes) if changes else problem


def folded(raw_gmm: RawKernel, raw_tgmm: RawKernel) -> Folded:
    """Raw kernels taking QuantizedArrays, from raw kernels taking plain arrays (int8, fp8,
    int4 and float4_e2m1fn ones included: a backend whose kernels take no 4-bit values leaves
    out the quantized_4bit feature) in their place, `scales=` (ContractionScales) and
    `output_blocks=` (OutputBlockScales)."""

    def gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset, existing_out,
            transpose_rhs, epilogue: KernelEpilogue | None = None):
        fused = {} if epilogue is None else {"epilogue": epilogue}
        if not _is_quantized(lhs, rhs):
            return raw_gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                           existing_out, transpose_rhs, **fused)
        m = lhs.shape[0]
        local_groups = rhs.shape[0]
        rhs_contraction = 2 if transpose_rhs else 1
        lhs, rhs, kernel_options = _kernel_scales(lhs, 1, rhs, rhs_contraction)
        row_scale = column_scale = None
        if isinstance(lhs, QuantizedArray):
            scale = _scales(lhs)
            if not _folded_into_other(lhs, 1):  # one scale per row: the output's rows
                row_scale = scale
            else:  # one scale per k: folded into rhs along its k axis
                shape = [1, 1, 1]
                shape[rhs_contraction] = scale.shape[0]
                rhs = _float(rhs) * scale.reshape(shape)
            lhs = lhs.values
        if isinstance(rhs, QuantizedArray):
            scale = _scales(rhs)  # [local_groups, the axis the scale varies over]
            if not _folded_into_other(rhs, rhs_contraction):  # per output column and group
                column_scale = scale
            else:  # one scale per k and group: folded into each row of lhs
                groups = row_groups(group_sizes, group_offset, local_groups, m)
                lhs = _float(lhs) * scale[groups]
            rhs = rhs.values
        if row_scale is not None or column_scale is not None:
            # Applied to the kernel's float32 tile before its store, ahead of any bias or
            # activation (the contract's order).
            epilogue = (epilogue or NO_EPILOGUE)._replace(row_scale=row_scale,
                                                          column_scale=column_scale)
            fused = {"epilogue": epilogue}
        return raw_gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                       existing_out, transpose_rhs, **kernel_options, **fused)

    def tgmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
             num_actual_groups, existing_out):
        if not _is_quantized(lhs, rhs):
            return raw_tgmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                            num_actual_groups, existing_out)
        lhs, rhs, kernel_options = _kernel_scales(lhs, 1, rhs, 0)
        k_scale = n_scale = None
        if isinstance(lhs, QuantizedArray):  # [k, m]
            scale = _scales(lhs)
            if not _folded_into_other(lhs, 1):  # one scale per k: the output's rows
                k_scale = scale
            else:  # one scale per m: folded into rhs's rows
                rhs = _float(rhs) * scale[:, None]
            lhs = lhs.values
        if isinstance(rhs, QuantizedArray):  # [m, n]
            scale = _scales(rhs)
            if not _folded_into_other(rhs, 0):  # one scale per n: the output's columns
                n_scale = scale
            else:  # one scale per m: folded into lhs's columns
                lhs = _float(lhs) * scale[None, :]
            rhs = rhs.values
        if k_scale is None and n_scale is None:  # every scale applied in the kernel
            return raw_tgmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                            num_actual_groups, existing_out, **kernel_options)
        out = raw_tgmm(lhs, rhs, group_sizes, jnp.float32, tiling, group_offset,
                       num_actual_groups, None, **kernel_options)
        if k_scale is not None:
            out = out * k_scale[None, :, None]
        if n_scale is not None:
            out = out * n_scale[None, None, :]
        if existing_out is not None:
            out = out + existing_out.astype(jnp.float32)
        return out.astype(preferred_element_type)

    return Folded(gmm, tgmm)
