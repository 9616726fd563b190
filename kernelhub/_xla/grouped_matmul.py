"""grouped_matmul in plain XLA (contract: kernelhub/ops/grouped_matmul.py).

One loop over the local groups; each group's rows are covered by `_row_chunks`, so the work
is about m*k*n whatever the number or sizes of groups, with no [G, m, ...] intermediate.
Quantized operands are dequantized a group's weights and a chunk's rows at a time
(`_operands`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._core.manual_axes import varying_like
from kernelhub._core.shapes import is_static
from kernelhub._xla import _operands, _row_chunks
from kernelhub._grouped_matmul.epilogue import NO_EPILOGUE, KernelEpilogue
from kernelhub._grouped_matmul.groups import local_bounds


def raw_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                       existing_out, transpose_rhs,
                       epilogue: KernelEpilogue = NO_EPILOGUE) -> jax.Array:
    """The raw forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py). The epilogue runs on each chunk's float32 sums."""
    out_dtype = jnp.dtype(preferred_element_type)
    m, k = lhs.shape
    local_groups = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    # Quantized operands reach these loops whole (no scale folding), so no scales come here.
    spec, bias = epilogue.spec, epilogue.bias
    out_columns = spec.output_columns(n)
    out = (existing_out if existing_out is not None
           else jnp.zeros((m, out_columns), out_dtype))
    largest = _row_chunks.largest_chunk(tiling, m, k, n)
    starts, ends = local_bounds(group_sizes, group_offset, local_groups, m)
    lhs, rows = _row_chunks.with_spare_rows(lhs, 0, m, largest)
    out, _ = _row_chunks.with_spare_rows(out, 0, m, largest)
    contract = ((1,), (1,)) if transpose_rhs else ((1,), (0,))
    # Quantized operands with one scale along k: their values are multiplied as they are and
    # the scales applied to the sums; otherwise each part is dequantized first.
    factored = _operands.scales_factor_out((lhs, 1), (rhs, 2 if transpose_rhs else 1))
    if factored:
        compute_dtype, sum_dtype = _operands.carrier_dtype(lhs, rhs, contraction=k)
    else:
        compute_dtype, sum_dtype = _operands.compute_dtype(lhs, rhs), jnp.float32
    integer_out = jnp.issubdtype(out_dtype, jnp.integer)
    if integer_out:  # two int8 arrays (the contract's rule): int32 sums, exact or wrapping as lax's
        compute_dtype, sum_dtype = jnp.dtype(jnp.int8), jnp.dtype(jnp.int32)

    def one_group(j, out_bits):
        group_bias = 0.0 if bias is None else lax.dynamic_index_in_dim(
            bias, j, 0, keepdims=False).astype(jnp.float32)
        if factored:
            weights, column_scale = _operands.indexed_values(rhs, j, compute_dtype)
        else:
            weights, column_scale = _operands.indexed(rhs, j, compute_dtype), None

        def step(out_bits, window_start, window_rows, valid):
            if factored:
                rows, row_scale = _operands.sliced_values(lhs, 0, window_start, window_rows,
                                                          window_start, compute_dtype)
            else:
                rows = _operands.sliced(lhs, 0, window_start, window_rows, window_start,
                                        compute_dtype)
                row_scale = None
            product = lax.dot_general(rows, weights, (contract, ((), ())),
                                      preferred_element_type=sum_dtype)
            if not integer_out:
                product = product.astype(jnp.float32)
            if row_scale is not None:
                product = product * row_scale[:, None]
            if column_scale is not None:
                product = product * column_scale[None, :]
            if not spec.is_identity:
                product = spec.apply(product + group_bias)
            new = _row_chunks.as_bits(product.astype(out_dtype))
            if valid is not None:
                old = lax.dynamic_slice_in_dim(out_bits, window_start, window_rows, 0)
                new = jnp.where(valid[:, None], new, old)
            return lax.dynamic_update_slice_in_dim(out_bits, new, window_start, 0)

        return _row_chunks.visit_rows(starts[j], ends[j], rows, largest, step, out_bits)

    out = varying_like(out, lhs, rhs, group_sizes, group_offset)
    # An empty group skips its body: the slice of its weights and its chunk conditionals.
    out_bits = lax.fori_loop(0, local_groups, lambda j, out_bits: lax.cond(
        starts[j] < ends[j], lambda o: one_group(j, o), lambda o: o, out_bits),
        _row_chunks.as_bits(out))
    out = _row_chunks.from_bits(out_bits, out_dtype)
    return out if is_static(m) else out[:m]  # the spare rows of a symbolic m
