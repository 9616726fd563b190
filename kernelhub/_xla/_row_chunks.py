"""Covering a group's rows with few, well-shaped matmuls, for XLA on any backend.

Two ways, by what a matmul call costs beyond its rows:
- `visit_rows` (gmm, whose output is the chunk's rows): as many chunks of the largest size as
  fit, then at most one chunk each of the rest's binary digits down to SMALLEST_DIGIT rows, then
  one chunk of the smallest power of two (at least 8) that holds what is left: at most three
  calls beyond the full chunks and fewer than SMALLEST_DIGIT rows of wasted work.
- `sum_over_rows` (tgmm, whose every call makes a whole [k, n] sum): full chunks, then one last
  chunk padded to a multiple of LAST_CHUNK_STEP rows, so a group below the largest size costs
  one call.
Either way an empty group costs nothing, and neither many small groups nor one huge group wastes
much, which a single fixed tile would.

Full and binary-digit chunks lie inside the group, so they are neither clamped nor masked. The
last chunk reads a window that is clamped to the array, so no chunk reads or writes out of
bounds; the rows of that window that are not the chunk's own are masked with a select (never a
multiply, so a NaN elsewhere cannot leak in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

SMALLEST_CHUNK = 8
DEFAULT_LARGEST_CHUNK = 512
# Rests of at least this many rows are cut at their binary digits rather than padded.
SMALLEST_DIGIT = 128

# step(carry, window_start, window_rows, row_is_valid[window_rows] or None) -> carry; None
# means every row of the window is the chunk's own, so the step needs no mask.
ChunkStep = Callable[[Any, jax.Array, int, jax.Array | None], Any]


def chunk_sizes(rows: int, largest: int = DEFAULT_LARGEST_CHUNK) -> tuple[int, ...]:
    """The chunk sizes used for an array of `rows` rows, largest first (powers of two)."""
    top = 1
    while top * 2 <= min(largest, rows):
        top *= 2
    sizes = [top]
    while sizes[-1] > SMALLEST_CHUNK:
        sizes.append(sizes[-1] // 2)
    return tuple(sizes)


def visit_rows(start: jax.Array, end: jax.Array, rows: int, sizes: tuple[int, ...],
               step: ChunkStep, carry: Any) -> Any:
    """Folds `step` over chunks covering rows [start, end) of an array with `rows` rows."""

    def run(size: int, state: tuple[Any, jax.Array]) -> tuple[Any, jax.Array]:
        carry, logical_start = state
        window_start, valid = _padded_window(logical_start, end, rows, size)
        return step(carry, window_start, size, valid), logical_start + size

    def run_whole(size: int, state: tuple[Any, jax.Array]) -> tuple[Any, jax.Array]:
        # A chunk that lies inside [start, end), so inside the array: no clamp, no mask.
        carry, logical_start = state
        return step(carry, logical_start, size, None), logical_start + size

    top = sizes[0]
    full_chunks = jnp.maximum(end - start, 0) // top
    state = lax.fori_loop(0, full_chunks, lambda _, s: run_whole(top, s), (carry, start))
    # The rest: its binary digits down to SMALLEST_DIGIT rows, at most one chunk each, then one
    # chunk, the smallest size that holds what is left. Each matmul call has a fixed cost
    # (for gmm, packing the [k, n] weights) that a chunk per binary digit would pay up to seven
    # times, while one chunk for the whole rest would waste up to half of a large rest's rows
    # and need the masked read and select of its output rows.
    for size in sizes[1:]:
        if size >= SMALLEST_DIGIT:
            state = lax.cond(end - state[1] >= size, lambda s, size=size: run_whole(size, s),
                             lambda s: s, state)
    # A chain of two-way conds rather than lax.switch: XLA updates a cond's carry in place,
    # but copies it in every branch of a many-way conditional.
    rest = end - state[1]
    smaller = 0
    for size in sizes[::-1]:
        if size > SMALLEST_DIGIT:
            break
        fits = (rest > smaller) & (rest <= size)
        state = lax.cond(fits, lambda s, size=size: run(size, s), lambda s: s, state)
        smaller = size
    return state[0]


def _padded_window(start: jax.Array, end: jax.Array, rows: int,
                   size: int) -> tuple[jax.Array, jax.Array]:
    """The `size`-row window holding rows [start, end), clamped into the array, and which of its
    rows are in [start, end)."""
    window_start = jnp.minimum(start, rows - size)
    row = window_start + jnp.arange(size, dtype=jnp.int32)
    return window_start, (row >= start) & (row < end)


# product(window_start, window_rows, row_is_valid[window_rows] or None) -> value
ChunkProduct = Callable[[jax.Array, int, jax.Array | None], Any]


# sum_over_rows pads a group's last chunk to a multiple of this many rows (powers of two
# below it). Measured on XLA:CPU for tgmm: 128 saves the most [k, n] passes in bf16, whose
# matmuls are cheap next to those passes, and costs nothing measurable in float32.
LAST_CHUNK_STEP = 128


def last_chunk_sizes(largest: int) -> tuple[int, ...]:
    """Window sizes for the last chunk of `sum_over_rows`, smallest first: powers of two from
    SMALLEST_CHUNK below LAST_CHUNK_STEP, then multiples of it up to `largest`."""
    sizes = []
    size = SMALLEST_CHUNK
    while size < min(LAST_CHUNK_STEP, largest):
        sizes.append(size)
        size *= 2
    sizes += range(LAST_CHUNK_STEP, largest + 1, LAST_CHUNK_STEP)
    if not sizes or sizes[-1] != largest:
        sizes.append(largest)
    return tuple(sizes)


def sum_over_rows(start: jax.Array, end: jax.Array, rows: int, largest: int,
                  product: ChunkProduct) -> jax.Array:
    """The sum of `product` over chunks covering rows [start, end), which must not be empty.

    For products whose result does not shrink with the chunk (tgmm's [k, n] sums), where every
    chunk beyond the first costs a pass over that result. The rows are cut into full chunks of
    `largest` rows and the rest, which is padded to the smallest of `last_chunk_sizes(largest)`
    that holds it: fewer than LAST_CHUNK_STEP rows of extra work buy up to three fewer passes
    than cutting the rest at its binary digits as `visit_rows` does. The rest's product (or,
    when there is none, the last full chunk's) is the initial sum, so there is no zero to add
    to; its lax.switch takes no carry, so none is copied into each branch.
    """
    full_chunks = (end - start) // largest
    rest = end - start - full_chunks * largest
    # Without a rest, the last full chunk starts the sum, and unmasked.
    added_chunks = jnp.where(rest == 0, full_chunks - 1, full_chunks)
    last_start = start + added_chunks * largest
    sizes = last_chunk_sizes(largest)
    index = jnp.int32(len(sizes))
    for position in range(len(sizes) - 2, -1, -1):
        index = jnp.where(rest <= sizes[position], position + 1, index)
    index = jnp.where(rest == 0, 0, index)

    def padded(size: int) -> Any:
        window_start, valid = _padded_window(last_start, end, rows, size)
        return product(window_start, size, valid)

    branches = [lambda: product(last_start, largest, None)]
    branches += [lambda size=size: padded(size) for size in sizes]
    total = lax.switch(index, branches)
    return lax.fori_loop(0, added_chunks,
                         lambda i, total: total + product(start + i * largest, largest, None),
                         total)


def as_bits(array: jax.Array) -> jax.Array:
    """16-bit floats as uint16 so XLA:CPU slices them without upcasting the whole array."""
    if array.dtype.itemsize == 2:
        return lax.bitcast_convert_type(array, jnp.uint16)
    return array


def pinned_bits(array: jax.Array, loop_index: jax.Array) -> jax.Array:
    """`as_bits(array)` made inside a loop body, where it fuses into the slices taken of it.

    Made once outside the loop, the uint16 view is a real copy: one extra pass over the array per
    call, which for a [G, k, n] rhs costs as much as the matmuls. Tying the array to the loop
    index through an optimization barrier keeps XLA from hoisting the bitcast out of the loop,
    so it fuses into each dynamic slice and only the sliced rows are read. Pin in the same
    computation (loop or branch body) as the slice: across a nested body the view is
    materialised again, once per visit.
    """
    if array.dtype.itemsize != 2:
        return array
    array, _ = lax.optimization_barrier((array, loop_index))
    return as_bits(array)


def from_bits(array: jax.Array, dtype: Any) -> jax.Array:
    if array.dtype == jnp.uint16:
        return lax.bitcast_convert_type(array, dtype)
    return array


def largest_chunk(tiling: Any, m: int, k: int, n: int) -> int:
    """The largest row chunk: tiling[0] when given (a power of two), else the default."""
    if callable(tiling):
        tiling = tiling(m, k, n)
    if tiling is None:
        return DEFAULT_LARGEST_CHUNK
    rows = tiling[0]
    if rows < 1 or rows & (rows - 1):
        raise ValueError(
            f"tiling for the xla implementation is (rows, ...): rows, the largest row chunk, must "
            f"be a power of two, got {tiling!r}"
        )
    return rows


# Above this many rows per group, per-group matmuls are as fast as a batched one on XLA:CPU and
# gathering the rows first only adds copies.
MOST_HEAD_ROWS = 128


def head_capacity(rows: int, num_groups: int) -> int:
    """Rows per group summed by one batched matmul before the per-group loop (0: none).

    Used by tgmm: many small groups make many small-contraction GEMMs with a large [k, n]
    output, which XLA:CPU runs far slower one by one than batched. The capacity is the largest
    power of two <= rows / num_groups, so the batched matmul covers at most `rows` rows and
    finishes balanced groups.
    """
    even_share = rows // max(num_groups, 1)
    if even_share > MOST_HEAD_ROWS or even_share < 1:
        return 0
    capacity = 1
    while capacity * 2 <= even_share:
        capacity *= 2
    return capacity
