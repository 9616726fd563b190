"""Where each group's rows lie: shared by every implementation and by the gradients.

Sizes are sanitised the same way everywhere, so that sizes which break the contract under jit
(negative, or summing past the rows) still give in-bounds ranges: negative sizes count as 0 and
every boundary is clamped to [0, rows].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Int

# The group offset of a call that gives none: a host constant, not a device op per call, and
# on no device, since a call may be traced for another target's device.
NO_OFFSET = np.zeros((), np.int32)


def running_sum(values: Int[Array, "..."], axis: int = 0, *, limit: int | None = None) -> jax.Array:
    """The inclusive running sum of integer `values` along `axis`, as one windowed sum.

    Not jnp.cumsum: jax 0.11 lowers cumsum for CUDA through a composite whose fallback is a
    sequential while loop, and a GPU runs each step of such a loop after a round trip to the
    host. A windowed sum has no loop on any target and compiles as fast as cumsum on a CPU
    (which lowers cumsum to the same thing). With `limit`, the values are first clipped to
    [0, limit] and the sums saturate at it, so that no int32 sum wraps: where `limit` times the
    count could pass 2**31, by summing with a + min(b, limit - a) (min(a + b, limit) without
    overflow, and associative on [0, limit]).
    """
    count = values.shape[axis]
    if count == 0:
        return values
    window = [1] * values.ndim
    window[axis] = count
    padding = [(0, 0)] * values.ndim
    padding[axis] = (count - 1, 0)
    zero = np.zeros((), values.dtype)

    def windowed(operand, add):
        return lax.reduce_window(operand, zero, add, tuple(window), (1,) * values.ndim, padding)

    if limit is None:
        return windowed(values, lax.add)
    capped = jnp.clip(values, 0, limit)
    # No partial sum can wrap; a symbolic limit (shape-polymorphic export) may be any size.
    if isinstance(limit, (int, np.integer)) and count * limit < 2**31:
        return jnp.minimum(windowed(capped, lax.add), limit)
    return windowed(capped, lambda a, b: a + jnp.minimum(b, limit - a))


def group_bounds(group_sizes: Int[Array, "*batch G"],
                 rows: int) -> tuple[Int[Array, "*batch G"], Int[Array, "*batch G"]]:
    """(starts, ends): group g owns rows [starts[g], ends[g]), clamped into [0, rows]; groups
    along the last axis, each leading index a call of its own."""
    ends = running_sum(group_sizes.astype(jnp.int32), group_sizes.ndim - 1, limit=rows)
    starts = jnp.concatenate([jnp.zeros_like(ends[..., :1]), ends[..., :-1]], axis=-1)
    return starts, ends


def local_bounds(
    group_sizes: Int[Array, "G"], group_offset: Int[Array, ""], local_groups: int, rows: int
) -> tuple[Int[Array, "L"], Int[Array, "L"]]:
    """(starts, ends) of the local groups group_offset .. group_offset + local_groups - 1.

    A local group past the last group (an offset out of range under jit) is empty.
    """
    starts, ends = group_bounds(group_sizes, rows)
    index = group_offset + jnp.arange(local_groups, dtype=jnp.int32)
    inside = (index >= 0) & (index < group_sizes.shape[0])
    safe = jnp.clip(index, 0, group_sizes.shape[0] - 1)
    return jnp.where(inside, starts[safe], 0), jnp.where(inside, ends[safe], 0)


def computed_rows(
    group_sizes: Int[Array, "G"], group_offset: Int[Array, ""], local_groups: int, rows: int
) -> jax.Array:
    """Boolean [rows]: True on the rows that belong to a local group."""
    starts, ends = local_bounds(group_sizes, group_offset, local_groups, rows)
    # Local groups are consecutive, so their rows form one range.
    row = jnp.arange(rows, dtype=jnp.int32)
    return (row >= starts[0]) & (row < jnp.max(ends))


def row_groups(group_sizes: Int[Array, "G"], group_offset: Int[Array, ""], local_groups: int,
               rows: int) -> jax.Array:
    """int32 [rows]: each row's local group, clamped into [0, local_groups) for other rows."""
    _, ends = local_bounds(group_sizes, group_offset, local_groups, rows)
    # ends is non-decreasing: a row's group is the number of local groups ending at or before it.
    # method="sort": no loop (the default's while loop costs a GPU a host round trip per step).
    group = jnp.searchsorted(ends, jnp.arange(rows, dtype=jnp.int32), side="right", method="sort")
    return jnp.minimum(group, local_groups - 1).astype(jnp.int32)


def group_sums(values: jax.Array, group_sizes: Int[Array, "G"], group_offset: Int[Array, ""],
               local_groups: int) -> jax.Array:
    """float32 [local_groups, ...]: the sum of `values` [rows, ...] over each local group's rows
    (0 for a group without rows; other rows, NaN or not, are left out by a select)."""
    rows = values.shape[0]
    computed = computed_rows(group_sizes, group_offset, local_groups, rows)
    mask = computed.reshape((rows,) + (1,) * (values.ndim - 1))
    kept = jnp.where(mask, values.astype(jnp.float32), jnp.zeros((), jnp.float32))
    groups = row_groups(group_sizes, group_offset, local_groups, rows)
    # Rows outside the local groups are zeros in `kept`, whatever group row_groups clamps them to.
    # Finite values: a one-hot [local_groups, rows] product, not a segment sum. XLA:GPU lowers
    # segment_sum to an atomic scatter-add, and with few groups each output element takes a
    # thousand or more contended adds (Mixtral's bias gradient ran 600x slower than its
    # matmuls on an H200). The product costs 2 * local_groups FLOPs per element, well under the
    # matmul's 2 * k, and HIGHEST keeps float32 sums float32 (no TF32 or one-pass bf16). A NaN or
    # an infinity would reach every group through the product's zeros (0 * NaN), so then, and
    # only then (a device-side branch, no host sync), the segment sum keeps it in its own group.

    def product(kept):
        membership = groups[None, :] == jnp.arange(local_groups, dtype=jnp.int32)[:, None]
        return jnp.tensordot(membership.astype(jnp.float32), kept, axes=(1, 0),
                             precision=lax.Precision.HIGHEST)

    def segments(kept):
        return jax.ops.segment_sum(kept, groups, num_segments=local_groups,
                                   indices_are_sorted=True)

    return lax.cond(jnp.all(jnp.isfinite(kept)), product, segments, kept)
