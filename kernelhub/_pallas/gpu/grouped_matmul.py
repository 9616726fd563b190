"""grouped_matmul as a Pallas Triton kernel (contract: kernelhub/ops/grouped_matmul.py).

Grid: one program per (visit, n-tile), flattened to one axis. A visit (see `visits.py`) is one
segment's share of one row tile; the program computes that row tile times its group's weights
for one n-tile, looping over k, and stores only the rows its segment owns. Visits of rows that
no local group computes store zeros, or nothing at all when the output starts as existing_out
(aliased, so no copy is made beyond the one XLA needs when existing_out is not donated).

With scale blocks along k (`scales`, kernelhub/_grouped_matmul/contraction_scales.py) each k step lies
inside one block: its product is multiplied by the step's row scales (lhs) and column scales
(the group's rhs) before it joins the float32 total.

Programs are ordered in bands of SWIZZLE row visits: the programs running at once share a few
lhs row tiles and sweep one group's weights, so both stay in L2.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._pallas.gpu import _launch, _tiles, config, visits
from kernelhub._grouped_matmul.contraction_scales import (
    NO_OUTPUT_BLOCKS, NO_SCALES, ContractionScales, OutputBlockScales, take_scale_refs)
from kernelhub._grouped_matmul.problem import gmm_problem

SWIZZLE = 8


def raw_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                       existing_out, transpose_rhs, scales: ContractionScales | None = None,
                       output_blocks: OutputBlockScales | None = None, *,
                       interpret: bool = False) -> jax.Array:
    """The forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py)."""
    out_dtype = jnp.dtype(preferred_element_type)
    problem = gmm_problem(lhs, rhs, group_sizes, out_dtype, existing_out is not None,
                          transpose_rhs)
    m, k, n, local_groups = problem.m, problem.k, problem.n, problem.local_groups
    config.check_static(problem)
    blocks = config.from_tiling(tiling, m, k, n, config.gmm_heuristic(problem))
    output_blocks = output_blocks or NO_OUTPUT_BLOCKS
    blocks = config.within_all_scale_blocks(blocks, scales, output_blocks, "block_k", "block_m")
    product = _tiles.tile_product(lhs.dtype, rhs.dtype, blocks.block_k, k, interpret, out_dtype)
    if output_blocks.arrays:
        product = _tiles.FLOAT32_TILES
    fill = existing_out is None
    table = visits.visit_table(group_sizes, group_offset, local_groups, m, blocks.block_m, fill)
    num_visits = table.shape[1]
    n_tiles = -(-n // blocks.block_n)
    scales = scales or NO_SCALES
    lhs_block, rhs_block = scales.operand_blocks
    lhs_row_block, rhs_column_block = output_blocks.operand_blocks
    kernel = functools.partial(
        _kernel, blocks=blocks, m=m, k=k, n=n, num_visits=num_visits, n_tiles=n_tiles,
        transpose_rhs=transpose_rhs, product=product, fill=fill,
        lhs_block=lhs_block, rhs_block=rhs_block, lhs_row_block=lhs_row_block,
        rhs_column_block=rhs_column_block)
    return _launch.pallas_triton(
        kernel, (table, lhs, rhs, *scales.arrays, *output_blocks.arrays), existing_out, (m, n),
        out_dtype, num_visits * n_tiles, blocks, interpret, "kernelhub_grouped_matmul")


def _band_order(program: jax.Array, num_visits: int, n_tiles: int) -> tuple[jax.Array, jax.Array]:
    """(visit, n-tile) of a program: bands of SWIZZLE visits, n-tiles inner within a band."""
    per_band = SWIZZLE * n_tiles
    band = _tiles.div(program, per_band)
    first = band * SWIZZLE
    band_visits = jnp.minimum(num_visits - first, SWIZZLE)
    inside = _tiles.rem(program, per_band)
    return first + lax.rem(inside, band_visits), lax.div(inside, band_visits)


def _kernel(table_ref, lhs_ref, rhs_ref, *refs, blocks: config.BlockConfig, m: int, k: int,
            n: int, num_visits: int, n_tiles: int, transpose_rhs: bool,
            product: _tiles.TileProduct, fill: bool, lhs_block: int | None,
            rhs_block: int | None, lhs_row_block: int | None,
            rhs_column_block: int | None) -> None:
    from jax.experimental import pallas as pl

    # refs: the scales with blocks, existing_out when given (the output's buffer), the output.
    lhs_scale_ref, rhs_scale_ref, lhs_row_ref, rhs_column_ref, refs = take_scale_refs(
        refs, lhs_block, rhs_block, lhs_row_block, rhs_column_block)
    out_ref = refs[-1]
    scaled = lhs_block is not None or rhs_block is not None
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    visit, n_tile = _band_order(pl.program_id(0), num_visits, n_tiles)
    tile = table_ref[visits.TILE, visit]
    group = table_ref[visits.GROUP, visit]
    first_row = pl.multiple_of(tile * bm, bm)
    first_col = pl.multiple_of(n_tile * bn, bn)
    rows = _tiles.span(first_row, bm)
    cols = _tiles.span(first_col, bn)
    owned = (rows >= table_ref[visits.START, visit]) & (rows < table_ref[visits.END, visit])
    col_inside = _tiles.within(cols, n, bn)
    out_block = out_ref.at[pl.ds(first_row, bm), pl.ds(first_col, bn)]

    @pl.when(group >= 0)
    def _multiply():
        row_inside = _tiles.within(rows, m, bm)

        def step(i, total):
            first_k = pl.multiple_of(i * bk, bk)
            k_inside = _tiles.within(_tiles.span(first_k, bk), k, bk)
            left = _tiles.masked_load(lhs_ref.at[pl.ds(first_row, bm), pl.ds(first_k, bk)],
                                      row_inside, k_inside)
            if transpose_rhs:
                right = _tiles.masked_load(
                    rhs_ref.at[group, pl.ds(first_col, bn), pl.ds(first_k, bk)],
                    col_inside, k_inside)
            else:
                right = _tiles.masked_load(
                    rhs_ref.at[group, pl.ds(first_k, bk), pl.ds(first_col, bn)],
                    k_inside, col_inside)
            # Output-axis scale blocks: the row tile (lhs) or column tile (rhs) lies in one block,
            # whose scales vary along k.
            left = _tiles.scaled_by(left, _tiles.block_scales(
                lhs_row_ref, lhs_row_block, first_row, lambda b: (b, pl.ds(first_k, bk)),
                k_inside), axis=1)
            right = _tiles.scaled_by(right, _tiles.block_scales(
                rhs_column_ref, rhs_column_block, first_col,
                lambda b: ((group, b, pl.ds(first_k, bk)) if transpose_rhs
                           else (group, pl.ds(first_k, bk), b)), k_inside),
                axis=1 if transpose_rhs else 0)
            if not scaled:
                return product.add(total, left, right, trans_b=transpose_rhs)
            row_scale = _tiles.block_scales(
                lhs_scale_ref, lhs_block, first_k, lambda b: (pl.ds(first_row, bm), b), row_inside)
            col_scale = _tiles.block_scales(
                rhs_scale_ref, rhs_block, first_k,
                lambda b: ((group, pl.ds(first_col, bn), b) if transpose_rhs
                           else (group, b, pl.ds(first_col, bn))), col_inside)
            return product.add_scaled(total, left, right, row_scale, col_scale, transpose_rhs)

        start = jnp.zeros((bm, bn), jnp.float32) if scaled else product.zeros((bm, bn))
        total = product.output(lax.fori_loop(0, -(-k // bk), step, start), out_ref.dtype)
        _tiles.masked_store(out_block, total, owned, col_inside)

    if fill:
        @pl.when(group == visits.FILL)
        def _zero():
            _tiles.masked_store(out_block, jnp.zeros((bm, bn), out_ref.dtype), owned, col_inside)
