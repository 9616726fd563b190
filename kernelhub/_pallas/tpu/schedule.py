"""Work items: which group and which row tile each step of a kernel's grid handles.

Mosaic kernels cannot scan group sizes (no cumsum in a kernel), so the schedule is computed
by XLA before the kernel and handed to it as scalar-prefetched int32 tables (SMEM), which both
the kernel and its blocks' index maps read. See docs/tpu.md for the scheme, in short:

- the grid's item axis has a static length, `row_tiles + groups - 1`, an upper bound: each
  group adds at most one row tile shared with its predecessor;
- gmm's items walk the row tiles in order, each output tile once or, when several local groups
  share it, once per group back to back (so its block stays in VMEM between them). Row tiles of
  no local group get an item too, which only writes zeros or existing_out: no row is left unset;
- tgmm's items walk the local groups in order, one item per row tile of the group, and one for
  an empty group, which only writes its zero (or existing_out) block;
- items past the real ones repeat the last real item and do nothing.

An item that does not multiply keeps pointing at the input blocks of its neighbour, so the
pipeline, which skips a copy when a block index does not change, fetches nothing for it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._core import jax_internals as _jax_internals
from kernelhub._grouped_matmul.groups import local_bounds
from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.problem import Kernel, Problem, require_static


class GmmField(enum.IntEnum):
    """Rows of a grouped_matmul schedule table."""

    OUT_TILE = 0  # row tile of the output block (and of lhs when the item multiplies)
    LHS_TILE = 1  # row tile of the lhs block held in VMEM
    GROUP = 2  # local group whose rhs block is held in VMEM
    HOLD_K = 3  # -1 to walk the contraction axis; else the contraction block to hold still
    MULTIPLIES = 4  # 1 when the item multiplies, 0 when it only writes or idles
    FIRST_VISIT = 5  # 1 on the first item of an output tile: initialise the block
    ROW_START = 6  # the group's rows [start, end): what the item may store
    ROW_END = 7


class TgmmField(enum.IntEnum):
    """Rows of a transposed_grouped_matmul schedule table."""

    GROUP = 0  # local group of the output block
    TILE = 1  # row tile of the lhs and rhs blocks held in VMEM
    MULTIPLIES = 2
    FIRST = 3  # first item of its group: reset the accumulator
    LAST = 4  # last item of its group: write the output block
    ROW_START = 5
    ROW_END = 6


class Schedule(NamedTuple):
    table: jax.Array  # int32 [fields * items], field-major: field f of item i at f * items + i
    items: int  # static: the grid's item-axis length

    @property
    def reader(self) -> Callable[[Any, int, Any], Any]:
        """(table ref, field, item) -> the field's value, for the kernel and its index maps.

        It closes over the static length only, never over the traced table.
        """
        items = self.items

        def read(ref, field: int, item):
            return ref[field * items + item]

        return read


def _hold(values: jax.Array, active: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per item, `values` of the nearest active item: the last one before, else the first after.

    Also returns whether an active item came before (or is this one).
    """
    index = jnp.arange(values.shape[0], dtype=jnp.int32)
    last_active = lax.cummax(jnp.where(active, index, -1), axis=0)
    first_active = jnp.argmax(active)  # 0 when none is active: any value will do
    source = jnp.where(last_active >= 0, last_active, first_active)
    return values[source], last_active >= 0


def _tile_span(starts: jax.Array, ends: jax.Array, tm: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per group: whether it has rows, its first row tile, and how many row tiles it touches."""
    nonempty = ends > starts
    first = starts // tm
    count = jnp.where(nonempty, (ends - 1) // tm - first + 1, 0)
    return nonempty, first, count


def check_symbolic(problem: Problem, interpret: Any) -> None:
    """Raises when a symbolic size (shape-polymorphic export) cannot be lowered: k or n (the
    tiles and the kernels' masks are fitted to them), or m outside Pallas's dynamic-shape mode.

    The schedule's length grows with m, and Mosaic takes a scalar-prefetched table of symbolic
    length only as a placeholder it fills in when the program is compiled for its m, which
    Pallas does inside `pallas_export_experimental(dynamic_shapes=True)` (kernelhub.export
    enters it for symbolic arguments).
    """
    inner = "lhs's columns" if problem.kernel is not Kernel.TGMM else "lhs's rows"
    require_static(problem.k, f"k ({inner}) for the Pallas TPU kernels")
    require_static(problem.n, "n (the output's columns) for the Pallas TPU kernels")
    m = problem.m
    if is_static(m) or interpret is not False or _jax_internals.pallas_symbolic_shapes():
        return
    raise ValueError(
        f"the Pallas TPU kernels lower a symbolic m ({m}, the rows of lhs) only for "
        f"shape-polymorphic export with kernelhub.export, or inside "
        f"jax.experimental.pallas.pallas_export_experimental(dynamic_shapes=True); "
        f"jax.export lowers it for 'cpu' on kernelhub's XLA implementation")


def gmm_schedule(group_sizes: jax.Array, group_offset: jax.Array, local_groups: int, m: int,
                 tm: int, k_tiles: int) -> Schedule:
    """The grouped_matmul schedule for rows tiled by `tm` (see the module docstring)."""
    m_tiles = -(-m // tm)
    items = m_tiles + local_groups - 1
    starts, ends = local_bounds(group_sizes, group_offset, local_groups, m)
    nonempty, first_tile, tile_count = _tile_span(starts, ends, tm)
    any_rows = jnp.any(nonempty)
    # Row tiles before and after the local groups' rows get one writing item each.
    lead = jnp.where(any_rows, jnp.min(jnp.where(nonempty, first_tile, m_tiles)), m_tiles)
    last_busy_tile = jnp.max(jnp.where(nonempty, first_tile + tile_count - 1, -1))
    trail = jnp.where(any_rows, m_tiles - 1 - last_busy_tile, 0)
    busy = jnp.sum(tile_count)

    item = jnp.arange(items, dtype=jnp.int32)
    position = item - lead  # among the multiplying items
    group_of_position = jnp.repeat(jnp.arange(local_groups, dtype=jnp.int32), tile_count,
                                   total_repeat_length=items)
    group = group_of_position[jnp.clip(position, 0, items - 1)]
    first_position = jnp.cumsum(tile_count) - tile_count
    busy_tile = first_tile[group] + position - first_position[group]

    multiplies = (position >= 0) & (position < busy)
    after = item - lead - busy  # index among the trailing writing items
    out_tile = jnp.where(item < lead, item,
                         jnp.where(multiplies, busy_tile,
                                   jnp.where(after < trail, last_busy_tile + 1 + after, m_tiles - 1)))
    real = item < lead + busy + trail
    previous = jnp.concatenate([jnp.full((1,), -1, jnp.int32), out_tile[:-1]])
    first_visit = real & (out_tile != previous)

    lhs_tile, after_busy = _hold(busy_tile, multiplies)
    held_group, _ = _hold(group, multiplies)
    hold_k = jnp.where(multiplies, -1, jnp.where(after_busy, k_tiles - 1, 0))
    fields = {
        GmmField.OUT_TILE: out_tile,
        GmmField.LHS_TILE: jnp.where(busy > 0, lhs_tile, 0),
        GmmField.GROUP: jnp.where(busy > 0, held_group, 0),
        GmmField.HOLD_K: hold_k,
        GmmField.MULTIPLIES: multiplies,
        GmmField.FIRST_VISIT: first_visit,
        GmmField.ROW_START: jnp.where(multiplies, starts[group], 0),
        GmmField.ROW_END: jnp.where(multiplies, ends[group], 0),
    }
    return Schedule(_pack(fields, len(GmmField)), items)


def tgmm_schedule(group_sizes: jax.Array, group_offset: jax.Array, actual_groups: int, m: int,
                  tm: int) -> Schedule:
    """The transposed_grouped_matmul schedule for rows tiled by `tm`."""
    m_tiles = -(-m // tm)
    items = m_tiles + actual_groups - 1
    starts, ends = local_bounds(group_sizes, group_offset, actual_groups, m)
    nonempty, first_tile, tile_count = _tile_span(starts, ends, tm)
    visits = jnp.maximum(tile_count, 1)  # an empty group still writes its block
    total = jnp.sum(visits)

    item = jnp.arange(items, dtype=jnp.int32)
    # Items past `total` repeat the last group, whose block is then already written.
    group = jnp.repeat(jnp.arange(actual_groups, dtype=jnp.int32), visits,
                       total_repeat_length=items)
    position = item - (jnp.cumsum(visits) - visits)[group]
    real = item < total
    multiplies = real & nonempty[group]
    tile, _ = _hold(first_tile[group] + position, multiplies)
    fields = {
        TgmmField.GROUP: group,
        TgmmField.TILE: jnp.where(jnp.any(multiplies), tile, 0),
        TgmmField.MULTIPLIES: multiplies,
        TgmmField.FIRST: real & (position == 0),
        TgmmField.LAST: real & (position == visits[group] - 1),
        TgmmField.ROW_START: starts[group],
        TgmmField.ROW_END: ends[group],
    }
    return Schedule(_pack(fields, len(TgmmField)), items)


def _pack(fields: dict[int, jax.Array], count: int) -> jax.Array:
    return jnp.concatenate([fields[f].astype(jnp.int32) for f in range(count)])
