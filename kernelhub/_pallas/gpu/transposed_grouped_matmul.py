"""transposed_grouped_matmul as a Pallas Triton kernel
(contract: kernelhub/ops/transposed_grouped_matmul.py).

Grid: one program per (group, k-tile, n-tile), flattened to one axis with the group outermost,
so the programs running at once read the same rows. A program sums its group's rows in chunks
of block_m, for lhs [k, m] aligned to block_m (so Triton can vectorise the loads along m): the
chunks wholly inside the group go from memory to the tensor cores untouched (Triton pipelines
them through shared memory), and at most two edge chunks pass through registers, where a select
sets the rows outside the group to exact zeros. An empty group runs no chunk and stores 0 (or
existing_out, read and written in place through an alias).

16-bit float lhs [k, m] is read as [m, k] (`_reads_lhs_rows_major`): in the weight gradient,
whose lhs is `x.T`, that costs no copy of x. Its tiles are then contiguous along k and n, so
the chunks need no alignment: they start at the group's first row, only its last one masks
rows (those past the group's end, never read), and a group of r rows takes ceil(r / block_m)
chunks where aligned ones take one more when its start is unaligned. A 4-bit operand is read
as bytes and unpacked per tile in registers (`_four_bit.py`).

With scale blocks along m (`scales`, kernelhub/_grouped_matmul/contraction_scales.py) a chunk lies inside
one block: its product is multiplied by the block's scales of lhs's rows (k) and rhs's columns
(n) before it joins the float32 total.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._pallas.gpu import _four_bit, _launch, _tiles, config
from kernelhub._grouped_matmul.contraction_scales import (
    NO_OUTPUT_BLOCKS, NO_SCALES, ContractionScales, OutputBlockScales, take_scale_refs)
from kernelhub._grouped_matmul.groups import local_bounds
from kernelhub._grouped_matmul.problem import tgmm_problem


def raw_transposed_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type, tiling,
                                  group_offset, num_actual_groups, existing_out,
                                  scales: ContractionScales | None = None,
                                  output_blocks: OutputBlockScales | None = None, *,
                                  interpret: bool = False) -> jax.Array:
    """The forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py)."""
    out_dtype = jnp.dtype(preferred_element_type)
    groups = num_actual_groups
    problem = tgmm_problem(lhs, rhs, group_sizes, out_dtype, existing_out is not None, groups)
    m, k, n = problem.m, problem.k, problem.n
    config.check_static(problem)
    blocks = config.from_tiling(tiling, m, k, n, config.tgmm_heuristic(problem))
    output_blocks = output_blocks or NO_OUTPUT_BLOCKS
    blocks = config.within_all_scale_blocks(blocks, scales, output_blocks, "block_m", "block_k")
    product = _tiles.tile_product(_four_bit.tile_dtype(lhs.dtype), _four_bit.tile_dtype(rhs.dtype),
                                  blocks.block_m, m, interpret, out_dtype,
                                  _four_bit.narrow_allowed(rhs.dtype, rhs_k_major=False))
    lhs_rows_major = _reads_lhs_rows_major(lhs.dtype, scales, output_blocks)
    if lhs_rows_major:
        lhs = lhs.T
        if interpret:
            # XLA:CPU has no 16-bit dot with its lhs transposed; float32 tiles hold the same
            # values and products exactly, summed in float32 as the tensor cores sum them.
            product = _tiles.FLOAT32_TILES
    lhs, lhs_packing = _four_bit.packed(lhs)
    rhs, rhs_packing = _four_bit.packed(rhs)
    if output_blocks.arrays:
        product = _tiles.FLOAT32_TILES
    starts, ends = local_bounds(group_sizes, group_offset, groups, m)
    bounds = jnp.stack([starts, ends]).astype(jnp.int32)
    k_tiles, n_tiles = -(-k // blocks.block_k), -(-n // blocks.block_n)
    scales = scales or NO_SCALES
    lhs_block, rhs_block = scales.operand_blocks
    lhs_row_block, rhs_column_block = output_blocks.operand_blocks
    kernel = functools.partial(
        _kernel, blocks=blocks, m=m, k=k, n=n, k_tiles=k_tiles, n_tiles=n_tiles,
        product=product, has_existing=existing_out is not None, lhs_rows_major=lhs_rows_major,
        lhs_packing=lhs_packing,
        rhs_packing=rhs_packing,
        lhs_block=lhs_block, rhs_block=rhs_block, lhs_row_block=lhs_row_block,
        rhs_column_block=rhs_column_block)
    return _launch.pallas_triton(kernel, (bounds, lhs, rhs, *scales.arrays,
                                          *output_blocks.arrays), existing_out, (groups, k, n),
                                 out_dtype, groups * k_tiles * n_tiles, blocks, interpret,
                                 "kernelhub_transposed_grouped_matmul")


def _reads_lhs_rows_major(dtype, scales: ContractionScales | None,
                          output_blocks: OutputBlockScales) -> bool:
    """Whether the kernel reads 16-bit float lhs [k, m] as [m, k] (its transpose, made here):
    the weight gradient passes `x.T` of the activations x [m, k], and the two transposes cancel
    inside the jitted program, so no copy of x is made. Its tiles then go to the tensor cores
    transposed, which they take for 16-bit values. Scale blocks keep the [k, m] tiles."""
    return (jnp.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)
            and (scales is None or not scales.arrays) and not output_blocks.arrays)


def _kernel(bounds_ref, lhs_ref, rhs_ref, *refs, blocks: config.BlockConfig, m: int, k: int,
            n: int, k_tiles: int, n_tiles: int, product: _tiles.TileProduct,
            has_existing: bool, lhs_rows_major: bool, lhs_packing: _four_bit.Packing | None,
            rhs_packing: _four_bit.Packing | None, lhs_block: int | None, rhs_block: int | None,
            lhs_row_block: int | None, rhs_column_block: int | None) -> None:
    from jax.experimental import pallas as pl

    # refs: the scales with blocks, existing_out when given (the output's buffer), the output.
    lhs_scale_ref, rhs_scale_ref, lhs_row_ref, rhs_column_ref, refs = take_scale_refs(
        refs, lhs_block, rhs_block, lhs_row_block, rhs_column_block)
    out_ref = refs[-1]
    scaled = lhs_block is not None or rhs_block is not None
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    program = pl.program_id(0)
    group = _tiles.div(program, k_tiles * n_tiles)
    inside = _tiles.rem(program, k_tiles * n_tiles)
    first_k = pl.multiple_of(_tiles.div(inside, n_tiles) * bk, bk)
    first_col = pl.multiple_of(_tiles.rem(inside, n_tiles) * bn, bn)
    k_inside = _tiles.within(_tiles.span(first_k, bk), k, bk)
    col_inside = _tiles.within(_tiles.span(first_col, bn), n, bn)
    start = bounds_ref[0, group]
    end = bounds_ref[1, group]

    def add_chunk(chunk: jax.Array, total: jax.Array, edge: bool) -> jax.Array:
        first_row = pl.multiple_of(chunk * bm, bm)
        rows = _tiles.span(first_row, bm)
        # Loads are masked only by static bounds (the array's end), which keeps them vectorised
        # along m; an edge chunk then zeroes the other groups' rows with a select, in registers.
        in_array = _tiles.within(rows, m, bm) if edge else None
        left = _four_bit.load(lhs_ref, (pl.ds(first_k, bk),), k_inside, pl.ds(first_row, bm),
                              in_array, m, lhs_packing, bm)
        right = _four_bit.load(rhs_ref, (pl.ds(first_row, bm),), in_array, pl.ds(first_col, bn),
                               col_inside, n, rhs_packing, bn)
        # Output-axis scale blocks: the k tile (lhs) or n tile (rhs) lies in one block, whose
        # scales vary along m.
        left = _tiles.scaled_by(left, _tiles.block_scales(
            lhs_row_ref, lhs_row_block, first_k, lambda b: (b, pl.ds(first_row, bm)), in_array),
            axis=1)
        right = _tiles.scaled_by(right, _tiles.block_scales(
            rhs_column_ref, rhs_column_block, first_col, lambda b: (pl.ds(first_row, bm), b),
            in_array), axis=0)
        if edge:
            owned = (rows >= start) & (rows < end)
            left = jnp.where(owned[None, :], left, jnp.zeros((), left.dtype))
            right = jnp.where(owned[:, None], right, jnp.zeros((), right.dtype))
        if not scaled:
            return product.add(total, left, right)
        row_scale = _tiles.block_scales(
            lhs_scale_ref, lhs_block, first_row, lambda b: (pl.ds(first_k, bk), b), k_inside)
        col_scale = _tiles.block_scales(
            rhs_scale_ref, rhs_block, first_row, lambda b: (b, pl.ds(first_col, bn)), col_inside)
        return product.add_scaled(total, left, right, row_scale, col_scale)

    def add_rows(first_row: jax.Array, total: jax.Array, last: bool) -> jax.Array:
        """lhs read [m, k]: the rows [first_row, first_row + bm) of the group, a chunk that
        starts where the group's rows do; its last chunk does not read the rows past its end
        (masked loads: the tiles are contiguous along k and n, so they still vectorise)."""
        rows = _tiles.span(first_row, bm)
        owned = rows < end if last else None
        left = _tiles.masked_load(lhs_ref.at[pl.ds(first_row, bm), pl.ds(first_k, bk)], owned,
                                  k_inside)
        right = _four_bit.load(rhs_ref, (pl.ds(first_row, bm),), owned, pl.ds(first_col, bn),
                               col_inside, n, rhs_packing, bn)
        return product.add(total, left.T, right)

    start_total = jnp.zeros((bk, bn), jnp.float32) if scaled else product.zeros((bk, bn))
    if lhs_rows_major:
        # Chunks from the group's first row: a group of r rows takes ceil(r / bm) of them.
        count = jnp.maximum(end - start, 0)
        full = _tiles.div(count, bm)
        total = lax.fori_loop(0, full, lambda i, t: add_rows(start + i * bm, t, False),
                              start_total)
        tail = (_tiles.rem(count, bm) != 0).astype(jnp.int32)
        total = lax.fori_loop(0, tail, lambda i, t: add_rows(start + full * bm, t, True), total)
    else:
        # Chunks aligned to bm (loads along m vectorise): those wholly inside [start, end)
        # take no row mask.
        first_full = _tiles.div(start + bm - 1, bm)
        full = jnp.maximum(_tiles.div(end, bm) - first_full, 0)
        total = lax.fori_loop(0, full, lambda i, t: add_chunk(first_full + i, t, False),
                              start_total)
        # The partial chunks at the group's edges: the head (start unaligned) and the tail
        # (end unaligned), once when both fall in the same chunk.
        nonempty = end > start
        head = nonempty & (_tiles.rem(start, bm) != 0)
        same_chunk = _tiles.div(start, bm) == _tiles.div(end, bm)
        tail = nonempty & (_tiles.rem(end, bm) != 0) & ~(head & same_chunk)
        edges = head.astype(jnp.int32) + tail.astype(jnp.int32)

        def edge(i, t):
            chunk = jnp.where((i == 0) & head, _tiles.div(start, bm), _tiles.div(end, bm))
            return add_chunk(chunk, t, True)

        total = lax.fori_loop(0, edges, edge, total)
    integer = jnp.issubdtype(out_ref.dtype, jnp.integer)
    total = total if integer else product.result(total)
    where = (group, pl.ds(first_k, bk), pl.ds(first_col, bn))
    if has_existing:
        kept = _tiles.masked_load(refs[0].at[where], k_inside, col_inside)
        total = total + kept.astype(total.dtype)
    _tiles.masked_store(out_ref.at[where], product.output(total, out_ref.dtype), k_inside,
                        col_inside)
