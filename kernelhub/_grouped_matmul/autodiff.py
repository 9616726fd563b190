"""Exact gradients for any pair of raw grouped-matmul kernels.

An implementation supplies forward kernels with the contracts' signatures (already validated
arguments, no autodiff of their own) and gets back differentiable functions. The backward pass
needs nothing but the two ops themselves:

  gmm:  out = lhs @ rhs[j] on local rows, existing_out elsewhere
        d lhs         = gmm(d out, rhs, transpose_rhs = not transpose_rhs)
        d rhs[j]      = tgmm(lhs^T, d out)        (tgmm(d out^T, lhs) when rhs is transposed)
        d existing_out = d out where the row is not computed, else 0
  tgmm: out[j] = lhs[:, rows] @ rhs[rows] + existing_out[j]
        d lhs         = gmm(rhs, d out, transpose_rhs=True)^T
        d rhs         = gmm(lhs^T, d out)
        d existing_out = d out

Each of these kernel calls is a pass (forward, lhs_gradient, rhs_gradient) and gets the tiling
meant for it (kernelhub/_grouped_matmul/tilings.py): the caller's entry for the pass, else the
tuning in force (kernelhub/tuning), else the implementation's heuristic.

A quantized operand stands for its dequantized value in these products (the raw kernels take
QuantizedArrays quantized along any axis), and its gradient goes to its float source.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from kernelhub._core.dtypes import promoted
from kernelhub._core.manual_axes import unify_varying
from kernelhub.quantization import QuantizedArray
from kernelhub._grouped_matmul import names
from kernelhub._grouped_matmul.epilogue import NO_EPILOGUE, Epilogue, KernelEpilogue, applied
from kernelhub._grouped_matmul.groups import NO_OFFSET, computed_rows, group_sums
from kernelhub._grouped_matmul.passes import TuningSpace, gmm_call, run, tgmm_call
from kernelhub._grouped_matmul.problem import require_static_groups
from kernelhub._grouped_matmul.tilings import Tilings, as_tilings

RawKernel = Callable[..., jax.Array]


class Differentiable(NamedTuple):
    grouped_matmul: Callable[..., jax.Array]
    transposed_grouped_matmul: Callable[..., jax.Array]


def _zero_cotangent(value: Any) -> Any:
    del value  # integer inputs take no cotangent
    return None


def gradient_dtype(operand: Any) -> Any:
    """The dtype of `operand`'s gradient, or None when it takes none: a quantized operand's
    gradient is its float source's (straight-through, kernelhub/quantization.py), and one
    without a source has nothing to pass it to; an integer array takes none (as in lax)."""
    if not isinstance(operand, QuantizedArray):
        return None if jnp.issubdtype(operand.dtype, jnp.integer) else operand.dtype
    return None if operand.source is None else operand.source.dtype


# The dtypes the kernels write; a raw fp8 operand's gradient (lax gives it in fp8) is computed
# in float32 and rounded once.
_KERNEL_GRADIENT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
                           jnp.dtype(jnp.float16))


def _kernel_dtype(dtype: Any) -> Any:
    return dtype if jnp.dtype(dtype) in _KERNEL_GRADIENT_DTYPES else jnp.dtype(jnp.float32)


def _rounded(gradient: jax.Array | None, dtype: Any) -> jax.Array | None:
    return None if gradient is None else gradient.astype(dtype)


def cotangent(operand: Any, gradient: jax.Array | None) -> Any:
    """`gradient` shaped as `operand`'s cotangent: a quantized operand's goes to its source;
    its values and scale take none."""
    if not isinstance(operand, QuantizedArray):
        return gradient
    if jnp.issubdtype(operand.values.dtype, jnp.floating):
        d_values = jnp.zeros(operand.shape, operand.values.dtype)
    else:
        d_values = np.zeros(operand.shape, jax.dtypes.float0)
    return QuantizedArray._unchecked(d_values, jnp.zeros_like(operand.scale), operand.axis,
                                     operand.block_size,
                                     None if operand.source is None else gradient)


def transpose(operand: Any) -> Any:
    """The transpose of a matrix, float or quantized (its scales and source with it)."""
    if not isinstance(operand, QuantizedArray):
        return operand.T
    return QuantizedArray._unchecked(
        operand.values.T, operand.scale.T, 1 - operand.axis, operand.block_size,
        None if operand.source is None else operand.source.T)


def differentiable(raw_gmm: RawKernel, raw_tgmm: RawKernel, space: TuningSpace) -> Differentiable:
    """Wraps raw forward kernels in custom VJPs built from the same kernels. `space` names the
    implementation and its candidate tilings for kernelhub.tuning."""
    op_gmm, op_tgmm = names.GROUPED_MATMUL, names.TRANSPOSED_GROUPED_MATMUL

    def run_gmm(op, pass_name, lhs, rhs, group_sizes, dtype, tilings, group_offset,
                existing_out, transpose_rhs, epilogue=NO_EPILOGUE):
        return run(tilings, gmm_call(space, op, pass_name, raw_gmm, lhs, rhs, group_sizes,
                                      dtype, group_offset, existing_out, transpose_rhs,
                                      epilogue))

    def run_tgmm(op, pass_name, lhs, rhs, group_sizes, dtype, tilings, group_offset,
                 num_actual_groups, existing_out):
        return run(tilings, tgmm_call(space, op, pass_name, raw_tgmm, lhs, rhs, group_sizes,
                                       dtype, group_offset, num_actual_groups, existing_out))

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 7, 9))
    def gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset, existing_out,
            transpose_rhs, bias, epilogue):
        return run_gmm(op_gmm, "forward", lhs, rhs, group_sizes, preferred_element_type, tiling,
                       group_offset, existing_out, transpose_rhs, KernelEpilogue(epilogue, bias))

    def gmm_forward(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                    existing_out, transpose_rhs, bias, epilogue):
        saved = None
        if epilogue.nonlinear:
            # The backward pass needs the pre-activation z: the forward kernel writes z (bias
            # added), the epilogue follows outside it, and z is kept under its checkpoint name
            # (a jax.checkpoint policy may drop it: then this forward runs again).
            # z in float32, as the kernels hold it: rounded to a bfloat16 output, a value near
            # a clamp (swiglu_oai's +-7) or a kink could land on its other side, and the
            # gradient there would be another function's.
            saved = run_gmm(op_gmm, "forward", lhs, rhs, group_sizes, jnp.float32, tiling,
                            group_offset, None, transpose_rhs,
                            KernelEpilogue(epilogue.bias_only(), bias))
            saved = checkpoint_name(saved, names.PRE_ACTIVATION)
            out = applied(saved, KernelEpilogue(epilogue, None), group_sizes, group_offset,
                          rhs.shape[0], existing_out, preferred_element_type)
        else:
            out = gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                      existing_out, transpose_rhs, bias, epilogue)
        return out, (lhs, rhs, group_sizes, group_offset, existing_out, bias, saved)

    def gmm_backward(preferred_element_type, tiling, transpose_rhs, epilogue, residuals, d_out):
        lhs, rhs, group_sizes, group_offset, existing_out, bias, saved = residuals
        local_groups = rhs.shape[0]
        m = lhs.shape[0]
        d_existing = None
        if existing_out is not None:
            computed = computed_rows(group_sizes, group_offset, local_groups, m)
            d_existing = jnp.where(computed[:, None], jnp.zeros_like(d_out), d_out)
        d_bias = None
        if epilogue.nonlinear:
            d_pre = epilogue.pre_activation_gradient(saved.astype(jnp.float32), d_out)
            if bias is not None:
                # Summed from the float32 d z, whatever the matmuls below take.
                d_bias = group_sums(d_pre, group_sizes, group_offset,
                                    local_groups).astype(bias.dtype)
            # The matmuls take d z in the widest of d out's and their operands' gradient
            # dtypes: float32 operands keep float32 gradients under a bfloat16 output, as
            # without an epilogue, and bfloat16 ones multiply bfloat16 whatever the bias's
            # dtype (a float32 bias widened both gradient matmuls, and copied the weights
            # and activations to float32 for them).
            wanted = [_kernel_dtype(gradient_dtype(x)) for x in (lhs, rhs)
                      if gradient_dtype(x) is not None]
            d_out = d_pre.astype(promoted(d_out.dtype, *wanted))
        elif bias is not None:
            d_bias = group_sums(d_out, group_sizes, group_offset, local_groups).astype(bias.dtype)
        # The kernels accumulate in float32 and round once into the primal's dtype.
        d_lhs = d_rhs = None
        if gradient_dtype(lhs) is not None:
            d_lhs = _rounded(run_gmm(op_gmm, "lhs_gradient", d_out, rhs, group_sizes,
                                     _kernel_dtype(gradient_dtype(lhs)), tiling, group_offset,
                                     None, not transpose_rhs), gradient_dtype(lhs))
        if gradient_dtype(rhs) is not None:
            if transpose_rhs:
                d_rhs = run_tgmm(op_gmm, "rhs_gradient", d_out.T, lhs, group_sizes,
                                 _kernel_dtype(gradient_dtype(rhs)), tiling, group_offset,
                                 local_groups, None)
            else:
                d_rhs = run_tgmm(op_gmm, "rhs_gradient", transpose(lhs), d_out, group_sizes,
                                 _kernel_dtype(gradient_dtype(rhs)), tiling, group_offset,
                                 local_groups, None)
            d_rhs = _rounded(d_rhs, gradient_dtype(rhs))
        return (cotangent(lhs, d_lhs), cotangent(rhs, d_rhs), _zero_cotangent(group_sizes),
                _zero_cotangent(group_offset), d_existing, d_bias)

    gmm.defvjp(gmm_forward, gmm_backward)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 6))
    def tgmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
             num_actual_groups, existing_out):
        return run_tgmm(op_tgmm, "forward", lhs, rhs, group_sizes, preferred_element_type,
                        tiling, group_offset, num_actual_groups, existing_out)

    def tgmm_forward(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                     num_actual_groups, existing_out):
        out = tgmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                   num_actual_groups, existing_out)
        return out, (lhs, rhs, group_sizes, group_offset, existing_out is not None)

    def tgmm_backward(preferred_element_type, tiling, num_actual_groups, residuals, d_out):
        lhs, rhs, group_sizes, group_offset, has_existing = residuals
        d_lhs = d_rhs = None
        if gradient_dtype(lhs) is not None:
            d_lhs = _rounded(run_gmm(op_tgmm, "lhs_gradient", rhs, d_out, group_sizes,
                                     _kernel_dtype(gradient_dtype(lhs)), tiling, group_offset,
                                     None, True).T, gradient_dtype(lhs))
        if gradient_dtype(rhs) is not None:
            d_rhs = _rounded(run_gmm(op_tgmm, "rhs_gradient", transpose(lhs), d_out, group_sizes,
                                     _kernel_dtype(gradient_dtype(rhs)), tiling, group_offset,
                                     None, False), gradient_dtype(rhs))
        return (cotangent(lhs, d_lhs), cotangent(rhs, d_rhs), _zero_cotangent(group_sizes),
                _zero_cotangent(group_offset), d_out if has_existing else None)

    tgmm.defvjp(tgmm_forward, tgmm_backward)

    def grouped_matmul(lhs, rhs, group_sizes, preferred_element_type=jnp.float32,
                       tiling=None, group_offset=None, existing_out=None,
                       transpose_rhs=False, bias=None, activation=None, glu=None,
                       glu_layout="concatenated"):
        require_static_groups(group_sizes.shape[0], rhs.shape[0], "rhs's group dimension")
        lhs, rhs, group_sizes, group_offset, existing_out, bias = unify_varying(
            lhs, rhs, group_sizes, group_offset, existing_out, bias)
        tiling = tiling if isinstance(tiling, Tilings) else as_tilings(tiling)
        group_offset = NO_OFFSET if group_offset is None else group_offset
        epilogue = Epilogue(bias is not None, activation, glu, glu_layout)
        return gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                   existing_out, transpose_rhs, bias, epilogue)

    def transposed_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type=jnp.float32,
                                  tiling=None, group_offset=None, num_actual_groups=None,
                                  existing_out=None):
        actual = 1 if num_actual_groups is None else num_actual_groups
        require_static_groups(group_sizes.shape[0], actual, "num_actual_groups")
        lhs, rhs, group_sizes, group_offset, existing_out = unify_varying(
            lhs, rhs, group_sizes, group_offset, existing_out)
        tiling = tiling if isinstance(tiling, Tilings) else as_tilings(tiling)
        return tgmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                    num_actual_groups, existing_out)

    return Differentiable(grouped_matmul, transposed_grouped_matmul)
