"""Which (row tile, group) pairs grouped_matmul's programs visit, computed on the device.

The rows [0, m) are cut into consecutive segments: the rows before the first local group, each
local group, and the rows after the last one. A visit is one segment's share of one row tile of
`block_m` rows, and it writes only the rows it owns. Visits are ordered by segment, hence by
row (or, with SPREAD_FILLS, with the zero-writing visits spread among the others).

Where a segment's tiles start is `row_align`'s choice:
- `row_align=block_m`: the fixed tiles [i * block_m, (i + 1) * block_m), so a tile that a group
  boundary crosses is visited once per segment in it;
- a smaller divisor of block_m: tiles start at the segment's first row, rounded down to a
  multiple of `row_align`, and follow each other at block_m rows. A group of r rows then costs
  ceil(r / block_m) visits (plus one only where the rounding pushes it over), where fixed tiles
  cost one more wherever a boundary falls inside a tile. Each visit reads the group's weights,
  so on fine-grained MoE shapes (tens of rows per expert at arbitrary offsets) this is up to
  half the weight traffic. A tile is moved back to end at round_up(m, block_m) where it would
  pass it: it then holds rows of the segment before as well, which it does not write.

Either way a segment with r rows spread over t tiles costs t visits, never more than the fixed
tiles cost it, and t <= ceil(r / block_m) + 1 with all segments together covering at most
num_tiles + num_segments - 1 tiles: that bound is the static grid size, so the launch never
depends on the values of group_sizes (no host sync; jit and CUDA graphs hold). Visits past the
real count do nothing, and an empty group has no visit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._grouped_matmul.groups import local_bounds, running_sum

# Row 1 of the visit table: what a visit does with its rows.
FILL = -1  # rows of no local group: write zeros
IDLE = -2  # past the last visit: nothing

FIRST_ROW, GROUP, START, END = range(4)

# Whether the visits that write zeros (rows of no local group, with fill_uncomputed) are spread
# evenly among the visits that compute, rather than before and after them in row order. In row
# order, with one expert-parallel shard's groups among many rows (DeepSeek-V3: 2048 of 16384),
# every program writes its zeros in one phase and reads weights in another: on the H100's
# profile (2026-11-28) DeepSeek-V3's lhs gradient spent 17% of its span outside its work items,
# about the time its 205 MB of zeros take at HBM's write rate, while its reads ran at 1.5 of
# the 2.6 TB/s HBM streams. Spread, the writes share that time with the reads. Off until a GPU
# profile says whether it pays (mosaic_profile's *_spread_fills probes).
SPREAD_FILLS = False


def visit_count(m: int, block_m: int, local_groups: int, fill_uncomputed: bool) -> int:
    """The static number of visits: every tile once, plus one per boundary between segments."""
    segments = local_groups + (2 if fill_uncomputed else 0)
    return -(-m // block_m) + segments - 1


def segment_boundaries(group_sizes: jax.Array, group_offset: jax.Array, local_groups: int,
                       m: int) -> jax.Array:
    """[local_groups + 3] rising row boundaries: 0, each local group's start, the end, m.

    Made monotone so that sizes that break the contract under jit still tile [0, m) exactly
    (every row then belongs to exactly one segment, so every output row is written).
    """
    starts, ends = local_bounds(group_sizes, group_offset, local_groups, m)
    bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), starts[:1], ends,
                              jnp.full((1,), m, jnp.int32)])
    return lax.cummax(jnp.clip(bounds, 0, m), axis=0)


def visit_table(group_sizes: jax.Array, group_offset: jax.Array, local_groups: int, m: int,
                block_m: int, fill_uncomputed: bool, row_align: int | None = None,
                spread_fills: bool | None = None) -> jax.Array:
    """int32 [4, visits]: per visit the first row of its tile, its group (local index, FILL or
    IDLE) and the rows [start, end) it writes, all inside [first row, first row + block_m).

    `row_align` (a divisor of block_m; None is block_m, the fixed tiles) is where a segment's
    tiles start (module docstring). With `fill_uncomputed` False (the output starts as
    existing_out) the rows outside the local groups get no visits at all. `spread_fills`
    (None: SPREAD_FILLS) orders the visits by `spread`, not by row.
    """
    row_align = block_m if row_align is None else row_align
    if row_align < 1 or block_m % row_align:
        raise ValueError(f"row_align {row_align} must divide block_m {block_m}")
    bounds = segment_boundaries(group_sizes, group_offset, local_groups, m)
    first, last = bounds[:-1], bounds[1:]  # segment s owns rows [first[s], last[s])
    tiles = tile_count(first, last, block_m, row_align)
    if not fill_uncomputed:
        tiles = tiles.at[0].set(0).at[-1].set(0)
    ends = running_sum(tiles)
    begins = ends - tiles

    count = visit_count(m, block_m, local_groups, fill_uncomputed)
    visit = jnp.arange(count, dtype=jnp.int32)
    # compare_all: one fused comparison, no loop (an XLA loop on a GPU may sync with the host)
    segment = jnp.minimum(jnp.searchsorted(ends, visit, side="right", method="compare_all"),
                          local_groups + 1)
    live = visit < ends[-1]
    first_row, window = tile_rows(first[segment], visit - begins[segment], block_m, row_align,
                                  -(-m // block_m) * block_m)
    group = jnp.where((segment == 0) | (segment == local_groups + 1), FILL, segment - 1)
    table = jnp.stack([
        jnp.where(live, first_row, 0),
        jnp.where(live, group, IDLE),
        jnp.where(live, jnp.maximum(first[segment], window), 0),
        jnp.where(live, jnp.minimum(last[segment], window + block_m), 0),
    ]).astype(jnp.int32)
    spread_fills = SPREAD_FILLS if spread_fills is None else spread_fills
    return spread(table) if spread_fills and fill_uncomputed else table


def spread(table: jax.Array) -> jax.Array:
    """The visits reordered so that the FILL visits fall evenly among the computing ones: the
    i-th of F fills goes where (i + 1/2) / F falls among the computing visits' (j + 1/2) / C.
    The computing visits keep their order (a group's row tiles stay together, for the bands),
    and IDLE visits stay last."""
    group = table[GROUP]
    fill, idle = group == FILL, group == IDLE
    computing = ~fill & ~idle
    fills = jnp.maximum(jnp.sum(fill), 1).astype(jnp.float32)
    computes = jnp.maximum(jnp.sum(computing), 1).astype(jnp.float32)
    rank_fill = (running_sum(fill.astype(jnp.int32)) - 1).astype(jnp.float32)
    rank_computing = (running_sum(computing.astype(jnp.int32)) - 1).astype(jnp.float32)
    place = jnp.where(fill, (rank_fill + 0.5) / fills, (rank_computing + 0.5) / computes)
    place = jnp.where(idle, 2.0, place)  # after every live visit
    order = jnp.argsort(place, stable=True)
    return table[:, order]


# A segment's tiles, rows [first, last) in tiles of `block` rows that start at `first` rounded
# down to a multiple of `align` (module docstring); tgmm's chunks of summed rows are cut the
# same way (kernelhub/_pallas/mosaic_gpu/tgmm_chunks.py). Plain integer arithmetic on
# non-negative values, so it runs in XLA and inside a kernel alike.


def tile_count(first, last, block: int, align: int) -> jax.Array:
    """How many tiles the rows [first, last) take: 0 when there are none."""
    base = first - lax.rem(first, jnp.int32(align))
    return jnp.where(last > first, lax.div(last - base + block - 1, jnp.int32(block)), 0)


def tile_rows(first, index, block: int, align: int, rows_padded: int):
    """(the first row of tile `index`, the row its window starts at): a window that would pass
    `rows_padded` (a multiple of `block`) is moved back to end there, so the tile then holds
    rows of the window before as well; what it owns starts at the window."""
    window = first - lax.rem(first, jnp.int32(align)) + index * block
    return jnp.minimum(window, rows_padded - block), window
