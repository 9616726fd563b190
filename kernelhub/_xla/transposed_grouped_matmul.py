"""transposed_grouped_matmul in plain XLA (contract: kernelhub/ops/transposed_grouped_matmul.py).

One loop over the computed groups; each accumulates its rows' outer products in float32 over
the chunks of `_row_chunks`, so the work is about k*m*n whatever the groups. Quantized operands
are dequantized a chunk at a time (`_operands`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._core.manual_axes import varying_like
from kernelhub._xla import _operands, _row_chunks
from kernelhub._grouped_matmul.groups import local_bounds


def raw_transposed_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type, tiling,
                                  group_offset, num_actual_groups, existing_out) -> jax.Array:
    """The raw forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py)."""
    out_dtype = jnp.dtype(preferred_element_type)
    k, m = lhs.shape
    n = rhs.shape[1]
    actual = num_actual_groups
    compute_dtype = _operands.compute_dtype(lhs, rhs)
    # int8 x int8 sums in int32 (exact, or for an int32 output wrapping as lax's); past what
    # int32 holds exactly a float output sums bfloat16 products in float32.
    sum_dtype = _operands.sum_dtype(compute_dtype, out_dtype, m)
    if compute_dtype == jnp.int8 and sum_dtype == jnp.float32:
        compute_dtype = jnp.dtype(jnp.bfloat16)
    chunk = _row_chunks.largest_chunk(tiling, m, k, n)
    starts, ends = local_bounds(group_sizes, group_offset, actual, m)
    lhs, rows = _row_chunks.with_spare_rows(lhs, 1, m, chunk)
    rhs, _ = _row_chunks.with_spare_rows(rhs, 0, m, chunk)
    largest = _row_chunks.top_chunk(rows, chunk)

    def window(array, window_start, window_rows, valid, axis):
        part = _operands.sliced(array, axis, window_start, window_rows, window_start,
                                compute_dtype)
        if valid is None:
            return part
        mask = valid[None, :] if axis == 1 else valid[:, None]
        return jnp.where(mask, part, jnp.zeros_like(part))

    def product(window_start, window_rows, valid):
        # [k, rows] @ [rows, n]: the plain matmul layout, which XLA:CPU's fast GEMMs take as is.
        left = window(lhs, window_start, window_rows, valid, axis=1)
        right = window(rhs, window_start, window_rows, valid, axis=0)
        return lax.dot_general(left, right, (((1,), (0,)), ((), ())),
                               preferred_element_type=sum_dtype)

    capacity = _row_chunks.head_rows(tiling, m, k, n, group_sizes.shape[0])
    if capacity:
        sums = _head_sums(lhs, rhs, compute_dtype, sum_dtype, starts, ends, capacity, rows)
        rest = jnp.minimum(starts + capacity, jnp.maximum(ends, starts))
    else:
        sums, rest = jnp.zeros((actual, k, n), sum_dtype), starts
    if existing_out is not None:
        sums = sums + existing_out.astype(sum_dtype)
    stored = bool(capacity) or existing_out is not None  # else every sum the loop meets is 0
    sums = varying_like(sums, lhs, rhs, group_sizes, group_offset)

    def add_rest(j, sums):
        # The group's rows are summed apart and stored once: a stored sum is read and written
        # once per group, not once per chunk.
        total = _row_chunks.sum_over_rows(rest[j], ends[j], rows, largest, product)
        if stored:
            total = lax.dynamic_index_in_dim(sums, j, 0, keepdims=False) + total
        return lax.dynamic_update_index_in_dim(sums, total, j, 0)

    sums = lax.fori_loop(0, actual, lambda j, sums: lax.cond(
        rest[j] < ends[j], lambda sums: add_rest(j, sums), lambda sums: sums, sums), sums)
    return sums.astype(out_dtype)


def _head_sums(lhs, rhs, compute_dtype, sum_dtype, starts, ends, capacity: int,
               rows: int) -> jax.Array:
    """[A, k, n] of sum_dtype: each group's sum over its first `capacity` rows."""
    index = starts[:, None] + jnp.arange(capacity, dtype=jnp.int32)[None, :]
    valid = index < ends[:, None]
    index = jnp.minimum(index, rows - 1)
    left = _operands.taken(lhs, 1, index)  # [k, A, capacity]
    right = _operands.taken(rhs, 0, index)  # [A, capacity, n]
    # [A, k, capacity] @ [A, capacity, n]: the layout XLA:CPU has a fast (and, for bf16, any)
    # batched GEMM for. The barrier keeps XLA from folding the transpose back into the dot,
    # which sends bf16 to a fallback that rejects it ("Unsupported element type for DotThunk").
    left = lax.optimization_barrier(jnp.transpose(left, (1, 0, 2)))
    left = jnp.where(valid[:, None, :], left, 0).astype(compute_dtype)
    right = jnp.where(valid[:, :, None], right, 0).astype(compute_dtype)
    return lax.dot_general(left, right, (((2,), (1,)), ((0,), (0,))),
                           preferred_element_type=sum_dtype)
