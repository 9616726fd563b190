"""transposed_grouped_matmul in plain XLA (contract: kernelhub/ops/transposed_grouped_matmul.py).

One loop over the computed groups; each accumulates its rows' outer products in float32 over
the chunks of `_row_chunks`, so the work is about k*m*n whatever the groups.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._manual_axes import varying_like
from kernelhub._xla import _row_chunks
from kernelhub.ops._groups import local_bounds


def raw_transposed_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type=jnp.float32,
                                  tiling=None, group_offset=None, num_actual_groups=None,
                                  existing_out=None) -> jax.Array:
    out_dtype = jnp.dtype(preferred_element_type)
    k, m = lhs.shape
    n = rhs.shape[1]
    if group_offset is None:
        group_offset = jnp.zeros((), jnp.int32)
    actual = group_sizes.shape[0] if num_actual_groups is None else num_actual_groups
    out = existing_out if existing_out is not None else jnp.zeros((actual, k, n), out_dtype)
    if m == 0 or k == 0 or n == 0 or actual == 0:
        return out
    compute_dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
    sizes = _row_chunks.chunk_sizes(m, _row_chunks.largest_chunk(tiling, m, k, n))
    starts, ends = local_bounds(group_sizes, group_offset, actual, m)
    lhs_bits = _row_chunks.as_bits(lhs)
    rhs_bits = _row_chunks.as_bits(rhs)

    def window(bits, dtype, window_start, window_rows, valid, axis):
        part = lax.dynamic_slice_in_dim(bits, window_start, window_rows, axis)
        part = _row_chunks.from_bits(part, dtype).astype(compute_dtype)
        mask = valid[None, :] if axis == 1 else valid[:, None]
        return jnp.where(mask, part, jnp.zeros_like(part))

    def step(total, window_start, window_rows, valid):
        # [k, rows] @ [rows, n]: the plain matmul layout, which XLA:CPU's fast GEMMs take as is.
        left = window(lhs_bits, lhs.dtype, window_start, window_rows, valid, axis=1)
        right = window(rhs_bits, rhs.dtype, window_start, window_rows, valid, axis=0)
        return total + lax.dot_general(left, right, (((1,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32)

    # Each group's sum starts at 0, varying (inside shard_map) as the products added to it do.
    zero = varying_like(jnp.zeros((k, n), jnp.float32), lhs, rhs, group_sizes, group_offset)

    def one_group(j, out_bits):
        total = _row_chunks.visit_rows(starts[j], ends[j], m, sizes, step,
                                       zero)
        if existing_out is not None:
            total = total + existing_out[j].astype(jnp.float32)
        block = _row_chunks.as_bits(total.astype(out_dtype))[None]
        return lax.dynamic_update_slice_in_dim(out_bits, block, j, 0)

    out = varying_like(out, lhs, rhs, group_sizes, group_offset)
    out_bits = lax.fori_loop(0, actual, one_group, _row_chunks.as_bits(out))
    return _row_chunks.from_bits(out_bits, out_dtype)
