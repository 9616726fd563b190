"""What a call with an empty axis returns, for every backend: its raw kernels never see one.

An axis of size 0 leaves no product to compute, but the contract still fixes every output
element (kernelhub/ops/grouped_matmul.py, kernelhub/ops/transposed_grouped_matmul.py):

- grouped_matmul, m or n of 0: the output is existing_out, or zeros;
- grouped_matmul, k of 0: each computed row is an empty sum, 0; every other row is
  existing_out's, or 0;
- transposed_grouped_matmul, k, m or n of 0: every group's sum is empty, so the output is
  existing_out (the sum is added to it), or zeros.

`guarded` wraps a backend's raw kernels so that such calls are answered here; it also gives
them a group offset of 0 when none is passed (the contracts always pass one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from kernelhub._grouped_matmul.epilogue import NO_EPILOGUE, KernelEpilogue, applied
from kernelhub._grouped_matmul.groups import NO_OFFSET, computed_rows

RawKernel = Callable[..., jax.Array]


def gmm_without_products(lhs: Any, rhs: Any, group_sizes: jax.Array, out_dtype: Any,
                         group_offset: jax.Array, existing_out: jax.Array | None,
                         transpose_rhs: bool,
                         epilogue: KernelEpilogue = NO_EPILOGUE) -> jax.Array | None:
    """grouped_matmul's result when one of m, k, n is 0, else None. With k of 0 each computed
    row is the epilogue of an empty sum: of its group's bias, or of 0."""
    m, k = lhs.shape
    n_rhs = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    if m and k and n_rhs:
        return None
    n = epilogue.spec.output_columns(n_rhs)
    kept = existing_out if existing_out is not None else jnp.zeros((m, n), out_dtype)
    if m == 0 or n == 0:
        return kept
    if not epilogue.spec.is_identity:
        return applied(jnp.zeros((m, n_rhs), jnp.float32), epilogue, group_sizes, group_offset,
                       rhs.shape[0], existing_out, out_dtype)
    if existing_out is None:
        return kept
    computed = computed_rows(group_sizes, group_offset, rhs.shape[0], m)
    return jnp.where(computed[:, None], jnp.zeros((), out_dtype), kept)


def tgmm_without_products(lhs: Any, rhs: Any, out_dtype: Any, num_actual_groups: int,
                          existing_out: jax.Array | None) -> jax.Array | None:
    """transposed_grouped_matmul's result when one of k, m, n is 0, else None."""
    k, m = lhs.shape
    n = rhs.shape[1]
    if m and k and n:
        return None
    if existing_out is not None:
        return existing_out
    return jnp.zeros((num_actual_groups, k, n), out_dtype)


def guarded(raw_gmm: RawKernel, raw_tgmm: RawKernel) -> tuple[RawKernel, RawKernel]:
    """The raw kernels, answering calls with an empty axis themselves."""

    def gmm(lhs, rhs, group_sizes, preferred_element_type, tiling=None, group_offset=None,
            existing_out=None, transpose_rhs=False, **kernel_options):
        group_offset = NO_OFFSET if group_offset is None else group_offset
        empty = gmm_without_products(lhs, rhs, group_sizes, jnp.dtype(preferred_element_type),
                                     group_offset, existing_out, transpose_rhs,
                                     kernel_options.get("epilogue", NO_EPILOGUE))
        if empty is not None:
            return empty
        return raw_gmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                       existing_out, transpose_rhs, **kernel_options)

    def tgmm(lhs, rhs, group_sizes, preferred_element_type, tiling=None, group_offset=None,
             num_actual_groups=None, existing_out=None, **kernel_options):
        group_offset = NO_OFFSET if group_offset is None else group_offset
        actual = group_sizes.shape[0] if num_actual_groups is None else num_actual_groups
        empty = tgmm_without_products(lhs, rhs, jnp.dtype(preferred_element_type), actual,
                                      existing_out)
        if empty is not None:
            return empty
        return raw_tgmm(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                        actual, existing_out, **kernel_options)

    return gmm, tgmm
