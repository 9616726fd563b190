"""Reordering rows between the exchange's slot layout and the experts' sorted order.

After token_exchange a device holds [sources, capacity] slots: slot s has the rows source s sent,
sorted by (local) expert. grouped_matmul wants all rows of one expert together, so the rows are
permuted into expert order (source order within an expert) and the answers permuted back. The
permutation is computed from per-(source, expert) counts, without a sort.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from kernelhub._grouped_matmul.groups import running_sum


class SlotOrder(NamedTuple):
    """A permutation of the sources * capacity slot entries.

    row_of_slot[j]: where slot entry j goes in expert order; slot_of_row is its inverse. Rows
    past sum(group_sizes) are empty slot entries (exactly 0).
    """

    row_of_slot: Int[Array, "entries"]
    slot_of_row: Int[Array, "entries"]
    group_sizes: Int[Array, "local_experts"]


def _exclusive_cumsum(values: Array, axis: int) -> Array:
    return running_sum(values, axis) - values


def expert_order(counts: Int[Array, "sources local_experts"], capacity: int) -> SlotOrder:
    """The slot-to-expert-order permutation, given how many rows each source sent each expert.

    A source's counts are cut at `capacity` in expert order, as the exchange cut its run.
    """
    sources, _ = counts.shape
    kept_end = running_sum(counts, 1, limit=capacity)
    kept = jnp.diff(kept_end, axis=1, prepend=0)
    kept_start = kept_end - kept
    kept_total = kept_end[:, -1]

    position = jnp.arange(capacity, dtype=jnp.int32)
    # The expert of entry i of slot s is the number of that slot's experts ending at or before i.
    expert = jnp.sum(kept_end[:, None, :] <= position[None, :, None], axis=2)
    holds_row = position[None, :] < kept_total[:, None]
    safe_expert = jnp.minimum(expert, counts.shape[1] - 1)

    group_sizes = jnp.sum(kept, axis=0).astype(jnp.int32)
    expert_start = _exclusive_cumsum(group_sizes, 0)
    earlier_sources = _exclusive_cumsum(kept, 0)

    def of_entry(table):  # [sources, local_experts] -> the value for each entry's expert
        return jnp.take_along_axis(table, safe_expert, axis=1)

    within = position[None, :] - of_entry(kept_start)
    row = expert_start[safe_expert] + of_entry(earlier_sources) + within
    # Empty entries fill the rows after the last expert's, slot by slot.
    empties_before = _exclusive_cumsum(capacity - kept_total, 0)
    empty_row = (jnp.sum(group_sizes) + empties_before[:, None]
                 + position[None, :] - kept_total[:, None])
    row_of_slot = jnp.where(holds_row, row, empty_row).reshape(sources * capacity).astype(jnp.int32)
    entries = jnp.arange(sources * capacity, dtype=jnp.int32)
    slot_of_row = jnp.zeros_like(entries).at[row_of_slot].set(entries, unique_indices=True)
    return SlotOrder(row_of_slot, slot_of_row, group_sizes)


def rows_from_returned(
    returned: Float[Array, "devices capacity d"], send_sizes: Int[Array, "devices"], rows: int
) -> Float[Array, "rows d"]:
    """The answers for this device's `rows` sorted rows, from what each device sent back.

    Row r went to the device whose run holds it; a row past `capacity` in its run was dropped
    and gets exactly 0.
    """
    devices, capacity, _ = returned.shape
    run_end = running_sum(send_sizes)
    row = jnp.arange(rows, dtype=jnp.int32)
    device = jnp.minimum(
        jnp.searchsorted(run_end, row, side="right", method="compare_all"), devices - 1)
    within = row - (run_end - send_sizes)[device]
    answered = (within < capacity) & (row < run_end[-1])
    picked = returned[device, jnp.clip(within, 0, capacity - 1)]
    return jnp.where(answered[:, None], picked, jnp.zeros((), returned.dtype))
