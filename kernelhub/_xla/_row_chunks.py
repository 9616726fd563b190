"""Covering a group's rows with few, well-shaped matmuls, for XLA on any backend.

Two ways, by what a matmul call costs beyond its rows:
- `visit_rows` (gmm, whose output is the chunk's rows): as many chunks of the largest size as
  fit, then chunks of MIDDLE_CHUNK rows, then at most one small chunk (SMALL_CHUNKS) for a rest
  that small. Four chunk sizes in all, each a separate piece of compiled code.
- `sum_over_rows` (tgmm, whose every call makes a whole [k, n] sum): full chunks, then one last
  chunk padded to one of a few sizes (LAST_CHUNK_SIZES), so a group below the largest size
  costs one call.
Either way an empty group costs nothing, and neither many small groups nor one huge group wastes
much, which a single fixed tile would.

Full chunks lie inside the group, so they are neither clamped nor masked. The other chunks read
a window that is clamped to the array, so no chunk reads or writes out of bounds; the rows of
that window that are not the chunk's own are masked with a select (never a multiply, so a NaN
elsewhere cannot leak in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._core.shapes import is_static
from kernelhub.quantization import QuantizedArray

DEFAULT_LARGEST_CHUNK = 512
# What is left of a group after its full chunks goes in chunks of this many rows, but for a
# rest of at most max(SMALL_CHUNKS) rows, which takes one chunk of the smallest size that holds
# it. Every chunk size is compiled code of its own (a dynamic slice, a matmul and a masked
# update, about 50 ms of XLA:CPU compile time each), so the sizes are few; these four ran as
# fast as eight (powers of two from 8 to 512) at 8, 64 and 256 groups in the CPU benchmark.
MIDDLE_CHUNK = 64
SMALL_CHUNKS = (8, 16)

# step(carry, window_start, window_rows, row_is_valid[window_rows] or None) -> carry; None
# means every row of the window is the chunk's own, so the step needs no mask.
ChunkStep = Callable[[Any, jax.Array, int, jax.Array | None], Any]


def top_chunk(rows: int, largest: int = DEFAULT_LARGEST_CHUNK) -> int:
    """The largest chunk for an array of `rows` rows: the largest power of two <= both."""
    top = 1
    while top * 2 <= min(largest, rows):
        top *= 2
    return top


def visit_rows(start: jax.Array, end: jax.Array, rows: int, largest: int,
               step: ChunkStep, carry: Any) -> Any:
    """Folds `step` over chunks covering rows [start, end) of an array with `rows` rows."""
    top = top_chunk(rows, largest)
    middle = min(MIDDLE_CHUNK, top)
    small = tuple(size for size in SMALL_CHUNKS if size < middle)

    def run(size: int, state: tuple[Any, jax.Array]) -> tuple[Any, jax.Array]:
        carry, logical_start = state
        window_start, valid = _padded_window(logical_start, end, rows, size)
        return step(carry, window_start, size, valid), logical_start + size

    def run_whole(size: int, state: tuple[Any, jax.Array]) -> tuple[Any, jax.Array]:
        # A chunk that lies inside [start, end), so inside the array: no clamp, no mask.
        carry, logical_start = state
        return step(carry, logical_start, size, None), logical_start + size

    full_chunks = jnp.maximum(end - start, 0) // top
    state = lax.fori_loop(0, full_chunks, lambda _, s: run_whole(top, s), (carry, start))
    rest = jnp.maximum(end - state[1], 0)
    # Middle chunks are all masked, even those inside the group: an unmasked variant would be
    # one more size to compile, and the select costs little next to the matmul.
    middle_chunks = rest // middle + (rest % middle > (small[-1] if small else 0)).astype(rest.dtype)
    state = lax.fori_loop(0, middle_chunks, lambda _, s: run(middle, s), state)
    # A chain of two-way conds rather than lax.switch: XLA updates a cond's carry in place,
    # but copies it in every branch of a many-way conditional.
    rest = end - state[1]
    smaller = 0
    for size in small:
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


# sum_over_rows pads a group's last chunk to the smallest of these sizes (and `largest`) that
# holds it. Every size is compiled code of its own (two dynamic slices, masks and a matmul); on
# XLA:CPU these five ran as fast for tgmm as nine (powers of two from 8 to 128, then multiples
# of 128), within 3% with skewed sizes at 8, 64 and 256 groups: in bf16 the matmuls are cheap
# next to the pass over the [k, n] sum that every extra chunk costs.
LAST_CHUNK_SIZES = (16, 64, 128, 256)


def last_chunk_sizes(largest: int) -> tuple[int, ...]:
    """Window sizes for the last chunk of `sum_over_rows`, smallest first: those of
    LAST_CHUNK_SIZES below `largest`, a power of two, then `largest`."""
    return tuple(size for size in LAST_CHUNK_SIZES if size < largest) + (largest,)


def sum_over_rows(start: jax.Array, end: jax.Array, rows: int, largest: int,
                  product: ChunkProduct) -> jax.Array:
    """The sum of `product` over chunks covering rows [start, end), which must not be empty.

    For products whose result does not shrink with the chunk (tgmm's [k, n] sums), where every
    chunk beyond the first costs a pass over that result. The rows are cut into full chunks of
    `largest` rows and the rest, which is padded to the smallest of `last_chunk_sizes(largest)`
    that holds it: padding buys fewer passes than cutting the rest into chunks as `visit_rows`
    does. The rest's product (or,
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


def _bits_dtype(dtype: Any) -> Any:
    """uint8 or uint16 for 8- and 16-bit floats, which XLA:CPU slices by upcasting; else None."""
    dtype = jnp.dtype(dtype)
    # Sub-byte floats (float4_e2m1fn) have no unsigned view of their width: sliced as they are.
    if (jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize in (1, 2)
            and jnp.finfo(dtype).bits == 8 * dtype.itemsize):
        return jnp.uint8 if dtype.itemsize == 1 else jnp.uint16
    return None


def as_bits(array: jax.Array) -> jax.Array:
    """8- and 16-bit floats as unsigned ints so XLA:CPU slices them without upcasting the whole
    array."""
    bits = _bits_dtype(array.dtype)
    return array if bits is None else lax.bitcast_convert_type(array, bits)


def pinned_bits(array: jax.Array, loop_index: jax.Array) -> jax.Array:
    """`as_bits(array)` made inside a loop body, where it fuses into the slices taken of it.

    Made once outside the loop, the unsigned view is a real copy: one extra pass over the array
    per call, which for a [G, k, n] rhs costs as much as the matmuls. Tying the array to the loop
    index through an optimization barrier keeps XLA from hoisting the bitcast out of the loop,
    so it fuses into each dynamic slice and only the sliced rows are read. Pin in the same
    computation (loop or branch body) as the slice: across a nested body the view is
    materialised again, once per visit.
    """
    if _bits_dtype(array.dtype) is None:
        return array
    array, _ = lax.optimization_barrier((array, loop_index))
    return as_bits(array)


def from_bits(array: jax.Array, dtype: Any) -> jax.Array:
    """The inverse of `as_bits` for an array that was `dtype`."""
    if jnp.dtype(array.dtype) != jnp.dtype(dtype):
        return lax.bitcast_convert_type(array, dtype)
    return array


def _resolved(tiling: Any, m: int, k: int, n: int) -> tuple[int, ...] | None:
    return tiling(m, k, n) if callable(tiling) else tiling


def largest_chunk(tiling: Any, m: int, k: int, n: int) -> int:
    """The largest row chunk: tiling[0] when given (a power of two), else the default."""
    tiling = _resolved(tiling, m, k, n)
    if tiling is None:
        return DEFAULT_LARGEST_CHUNK
    rows = tiling[0]
    if rows < 1 or rows & (rows - 1):
        raise ValueError(
            f"tiling for the xla implementation is (rows, k, n[, head_rows]): rows, the largest "
            f"row chunk, must be a power of two, got {tiling!r}"
        )
    return rows


def head_rows(tiling: Any, m: int, k: int, n: int, num_groups: int) -> int:
    """Rows per group of tgmm's batched head: tiling[3] when given (0, or a power of two), else
    `head_capacity`'s choice for evenly shared rows."""
    tiling = _resolved(tiling, m, k, n)
    if tiling is None or len(tiling) < 4:
        return head_capacity(m, num_groups)
    rows = tiling[3]
    if rows < 0 or rows & (rows - 1):
        raise ValueError(
            f"tiling for the xla implementation is (rows, k, n[, head_rows]): head_rows, the "
            f"rows per group the batched head sums, must be 0 (no head) or a power of two, got "
            f"{tiling!r}"
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
    if not is_static(rows):
        # A symbolic row count (shape-polymorphic export) has no even share to size a head by.
        return 0
    even_share = rows // max(num_groups, 1)
    if even_share > MOST_HEAD_ROWS or even_share < 1:
        return 0
    capacity = 1
    while capacity * 2 <= even_share:
        capacity *= 2
    return capacity


def with_spare_rows(operand: Any, axis: int, rows: Any, spare: int) -> tuple[Any, Any]:
    """(`operand` with `spare` zero rows appended along `axis` when `rows`, its length there, is
    symbolic; the new length), else (`operand`, `rows`) unchanged.

    The chunks' windows are clamped into the array, so each must fit in it: a symbolic row
    count (shape-polymorphic export) may be as small as 1, but jax can tell that rows + spare
    holds every chunk of at most `spare` rows. The spare rows belong to no group, so they are
    masked wherever a window reaches them. A quantized operand keeps its scales: along another
    axis they get spare rows too; along this one a window's blocks past the end read no scale
    that any unmasked row uses.
    """
    if is_static(rows):
        return operand, rows

    def pad(array: jax.Array) -> jax.Array:
        widths = [(0, 0)] * array.ndim
        widths[axis] = (0, spare)
        return jnp.pad(array, widths)

    if isinstance(operand, QuantizedArray):
        scale = operand.scale if axis == operand.axis else pad(operand.scale)
        operand = QuantizedArray._unchecked(pad(operand.values), scale, operand.axis,
                                            operand.block_size)
    else:
        operand = pad(operand)
    return operand, rows + spare
