"""An independent float64 reference for ragged_dot_general in every mode, with group_offset.

Written from lax's rules with one masked dense product per group (jax.numpy, so that
kernelhub.testing can differentiate it in float64); it shares no code with kernelhub.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax


def mode_of(numbers, lhs_rank: int) -> int:
    (lhs_contract, _), (lhs_batch, _) = numbers.dot_dimension_numbers
    ragged, = numbers.lhs_ragged_dimensions
    return 2 if ragged in lhs_contract else 3 if ragged in lhs_batch else 1


def prefix_axes(numbers, lhs_rank: int) -> list[int]:
    """The lhs axes group_sizes may carry before g, in lax's order."""
    (lhs_contract, _), (lhs_batch, _) = numbers.dot_dimension_numbers
    ragged, = numbers.lhs_ragged_dimensions
    free = [a for a in range(lhs_rank) if a not in lhs_contract and a not in lhs_batch]
    mode = mode_of(numbers, lhs_rank)
    if mode == 1:
        return list(lhs_batch) + free[:free.index(ragged)]
    if mode == 2:
        return list(lhs_batch) + list(lhs_contract)[:list(lhs_contract).index(ragged)]
    return list(lhs_batch)[:list(lhs_batch).index(ragged)]


def group_masks(lhs_shape, group_sizes, numbers) -> list[jnp.ndarray]:
    """Per group, a 0/1 array of lhs's shape: 1 where the ragged index belongs to the group."""
    ragged, = numbers.lhs_ragged_dimensions
    prefix = prefix_axes(numbers, len(lhs_shape))
    sizes = np.asarray(group_sizes)
    if sizes.ndim == 1:
        sizes = np.broadcast_to(sizes, tuple(lhs_shape[a] for a in prefix) + sizes.shape)
    # Exact sums (no int32 wrap). Indices stop at the ragged axis's end, so sizes summing past
    # it leave the excess in no index: lax's meaning, the first groups own the indices that exist.
    ends = np.cumsum(sizes, axis=-1, dtype=np.int64)
    starts = ends - sizes
    # Move the prefix axes of the bounds to lhs's axis order, size 1 on every other lhs axis.
    order = np.argsort(prefix)
    shape = [lhs_shape[a] if a in prefix else 1 for a in range(len(lhs_shape))]
    index = np.arange(lhs_shape[ragged]).reshape([-1 if a == ragged else 1 for a in range(len(lhs_shape))])
    masks = []
    for g in range(sizes.shape[-1]):
        start = np.transpose(starts[..., g], order).reshape(shape)
        end = np.transpose(ends[..., g], order).reshape(shape)
        masks.append(jnp.asarray(np.broadcast_to((start <= index) & (index < end), lhs_shape), jnp.float64))
    return masks


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, group_offset=None,
                       **_):
    numbers = ragged_dot_dimension_numbers
    lhs, rhs = jnp.asarray(lhs, jnp.float64), jnp.asarray(rhs, jnp.float64)
    offset = 0 if group_offset is None else int(np.asarray(group_offset).reshape(()))
    dot = numbers.dot_dimension_numbers
    masks = group_masks(lhs.shape, group_sizes, numbers)
    groups = len(masks)
    mode = mode_of(numbers, lhs.ndim)
    if mode == 1:
        axis, = numbers.rhs_group_dimensions
        (lc, rc), (lb, rb) = dot
        shifted = lambda axes: [a - (a > axis) for a in axes]  # noqa: E731
        out = 0.0
        for j in range(rhs.shape[axis]):
            if offset + j < groups:
                weights = jnp.take(rhs, j, axis=axis)
                out = out + lax.dot_general(lhs * masks[offset + j], weights,
                                            ((lc, shifted(rc)), (lb, shifted(rb))))
        if isinstance(out, float):  # no local group at all
            out = lax.dot_general(lhs * 0, jnp.take(rhs, 0, axis=axis), ((lc, shifted(rc)), (lb, shifted(rb))))
        return out
    if mode == 2:
        parts = [lax.dot_general(lhs * masks[offset + j], rhs, dot) if offset + j < groups
                 else lax.dot_general(lhs * 0, rhs, dot) for j in range(groups)]
        return jnp.stack(parts)
    # Mode 3: a batched product whose batch entries in the groups offset.. are kept.
    kept = sum(masks[offset:], jnp.zeros(lhs.shape, jnp.float64)) if offset < groups else jnp.zeros(lhs.shape)
    return lax.dot_general(lhs * kept, rhs, dot)
