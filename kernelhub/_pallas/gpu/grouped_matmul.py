"""grouped_matmul as a Pallas Triton kernel (contract: kernelhub/ops/grouped_matmul.py).

Grid: one program per (visit, n-tile), flattened to one axis. A visit (see
kernelhub/_grouped_matmul/visits.py) is one segment's share of one row tile, the tiles starting
at each group's first row; the program computes that row tile times its group's weights for
one n-tile, looping over k, and stores only the rows its segment owns. Visits of rows that
no local group computes store zeros, or nothing at all when the output starts as existing_out
(aliased, so no copy is made beyond the one XLA needs when existing_out is not donated).

With scale blocks along k (`scales`, kernelhub/_grouped_matmul/contraction_scales.py) each k step lies
inside one block: its product is multiplied by the step's row scales (lhs) and column scales
(the group's rhs) before it joins the float32 total.

A 4-bit operand (int4, e2m1) is read as bytes and unpacked per tile in registers
(`_four_bit.py`); its tiles then multiply as 8-bit ones.

A fused epilogue (kernelhub/_grouped_matmul/epilogue.py) runs on the float32 total in registers
before the one store: scaled by the row and column scales of quantized operands (the kit folds
them out of the sum), the group's bias row tile added, then the activation. With a gated unit
(glu) a program sums the gate and the up columns that make its output tile (`_rhs_columns`:
two accumulators for the concatenated layout, one of interleaved pairs split in registers), so
the pre-activation is never written; its `block_n` counts the rhs columns it reads, both halves
together (config.gated_output_tile).

Programs are ordered in bands of SWIZZLE row visits: the programs running at once share a few
lhs row tiles and sweep one group's weights, so both stay in L2.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._grouped_matmul import polynomial_erf, visits
from kernelhub._pallas.gpu import _four_bit, _launch, _tiles, config
from kernelhub._grouped_matmul.contraction_scales import (
    NO_OUTPUT_BLOCKS, NO_SCALES, ContractionScales, OutputBlockScales, take_scale_refs)
from kernelhub._grouped_matmul.epilogue import NO_EPILOGUE, Epilogue, KernelEpilogue
from kernelhub._grouped_matmul.problem import gmm_problem

SWIZZLE = 8


def raw_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                       existing_out, transpose_rhs, scales: ContractionScales | None = None,
                       output_blocks: OutputBlockScales | None = None,
                       epilogue: KernelEpilogue = NO_EPILOGUE, *,
                       interpret: bool = False) -> jax.Array:
    """The forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py). With a glu epilogue the output (and existing_out)
    has half of rhs's columns."""
    out_dtype = jnp.dtype(preferred_element_type)
    problem = gmm_problem(lhs, rhs, group_sizes, out_dtype, existing_out is not None,
                          transpose_rhs)
    m, k, n, local_groups = problem.m, problem.k, problem.n, problem.local_groups
    config.check_static(problem)
    spec = epilogue.spec
    gated = spec.glu is not None
    n_out = spec.output_columns(n)
    if gated and output_blocks is not None:
        # Scale blocks along an output axis come only with the gradient passes, which run no
        # epilogue (kernelhub/_grouped_matmul/autodiff.py).
        raise NotImplementedError("a glu with output-axis scale blocks (output_blocks=)")
    blocks = config.from_tiling(tiling, m, k, n, config.gmm_heuristic(problem))
    if gated:
        blocks = config.gated_output_tile(blocks, n_out)
    output_blocks = output_blocks or NO_OUTPUT_BLOCKS
    blocks = config.within_all_scale_blocks(
        blocks, scales, output_blocks, "block_k", "block_m")
    product = _tiles.tile_product(_four_bit.tile_dtype(lhs.dtype), _four_bit.tile_dtype(rhs.dtype),
                                  blocks.block_k, k, interpret, out_dtype,
                                  _four_bit.narrow_allowed(rhs.dtype, transpose_rhs))
    if _weights_copied_k_major(product, rhs.dtype, transpose_rhs, scales, m,
                               problem.num_groups):
        rhs, transpose_rhs = jnp.swapaxes(rhs, 1, 2), True
    lhs, lhs_packing = _four_bit.packed(lhs)
    if gated and not spec.interleaved and not transpose_rhs and n_out % 2:
        # Packed along n, an odd gate half would put the up half's first column mid-byte.
        rhs = rhs.astype(_four_bit.tile_dtype(rhs.dtype))
    rhs, rhs_packing = _four_bit.packed(rhs)
    if output_blocks.arrays:
        product = _tiles.FLOAT32_TILES
    fill = existing_out is None
    # Row tiles start at each group's first row, except under output-axis row scale blocks,
    # whose tiles must each lie inside one block.
    row_align = blocks.block_m if output_blocks.arrays else 1
    table = visits.visit_table(group_sizes, group_offset, local_groups, m, blocks.block_m, fill,
                               row_align)
    num_visits = table.shape[1]
    n_tiles = -(-n_out // blocks.block_n)
    scales = scales or NO_SCALES
    lhs_block, rhs_block = scales.operand_blocks
    lhs_row_block, rhs_column_block = output_blocks.operand_blocks
    kernel = functools.partial(
        _kernel, blocks=blocks, m=m, k=k, n_out=n_out, num_visits=num_visits, n_tiles=n_tiles,
        row_align=row_align,
        transpose_rhs=transpose_rhs, product=product, fill=fill, lhs_packing=lhs_packing,
        rhs_packing=rhs_packing,
        lhs_block=lhs_block, rhs_block=rhs_block, lhs_row_block=lhs_row_block,
        rhs_column_block=rhs_column_block, spec=spec, plain=epilogue.is_identity,
        has_row_scale=epilogue.row_scale is not None,
        column_vectors=len(epilogue.column_vectors), has_bias=epilogue.bias is not None)
    row_scale = () if epilogue.row_scale is None else (epilogue.row_scale,)
    operands = (table, lhs, rhs, *scales.arrays, *output_blocks.arrays, *row_scale,
                *epilogue.column_vectors)
    return _launch.pallas_triton(
        kernel, operands, existing_out, (m, n_out), out_dtype, num_visits * n_tiles, blocks,
        interpret, "kernelhub_grouped_matmul")


# Rows per local group from which a forward on the 8-bit tensor cores first copies [G, k, n]
# weights K-major ([G, n, k]), the layout 8-bit wgmma reads: Triton otherwise transposes every
# weight tile on the way. On an H200 (2026-11-26, benchmarks/gpu/2026-11-26-h200/quantized.md)
# e4m3 with K-major weights ran 2.0-2.6x faster at 64 rows per expert; the copy moves the
# weights' bytes twice, which that saving outweighs from about 30 rows per group (decoding,
# with a few rows per expert, keeps the tiles' transposes).
K_MAJOR_COPY_ROWS = 32


def _weights_copied_k_major(product: _tiles.TileProduct, rhs_dtype, transpose_rhs: bool,
                            scales: ContractionScales | None, m: int, num_groups: int) -> bool:
    """Whether the forward multiplies unpacked 8-bit [G, k, n] weights as stored, with one scale
    per row and column (scale blocks keep their layout), at K_MAJOR_COPY_ROWS or more expected
    rows per group (m over all the groups: the sizes themselves are data)."""
    unpacked_8_bit = (jnp.dtype(rhs_dtype).itemsize == 1
                      and _four_bit.tile_dtype(rhs_dtype) == jnp.dtype(rhs_dtype))
    no_blocks = scales is None or not scales.arrays
    return (product.widen_to is None and unpacked_8_bit and not transpose_rhs and no_blocks
            and m >= K_MAJOR_COPY_ROWS * num_groups)


def _band_order(program: jax.Array, num_visits: int, n_tiles: int) -> tuple[jax.Array, jax.Array]:
    """(visit, n-tile) of a program: bands of SWIZZLE visits, n-tiles inner within a band."""
    per_band = SWIZZLE * n_tiles
    band = _tiles.div(program, per_band)
    first = band * SWIZZLE
    band_visits = jnp.minimum(num_visits - first, SWIZZLE)
    inside = _tiles.rem(program, per_band)
    return first + lax.rem(inside, band_visits), lax.div(inside, band_visits)


@dataclasses.dataclass(frozen=True)
class _RhsColumns:
    """The rhs columns one accumulator sums for an output tile: `columns` (a pl.ds of rhs's n
    axis) starting at `first` (a multiple of `alignment`), and which of them lie inside rhs
    (None: all), those before `limit`."""

    columns: object
    first: jax.Array
    inside: jax.Array | None
    limit: int
    alignment: int


def _rhs_columns(first_col: jax.Array, bn: int, n_out: int, inside: jax.Array | None,
                 spec: Epilogue) -> list[_RhsColumns]:
    """The accumulators of the output tile [first_col, first_col + bn) (of which `inside`
    lie before n_out): one of the same columns without a glu; gate then up tiles of the
    concatenated layout; one tile of the 2 * bn interleaved columns (contiguous, so loaded as
    wide vectors; `_epilogue` splits the pairs)."""
    from jax.experimental import pallas as pl

    if spec.glu is None:
        return [_RhsColumns(pl.ds(first_col, bn), first_col, inside, n_out, bn)]
    if spec.interleaved:
        first = pl.multiple_of(2 * first_col, 2 * bn)
        pairs = _tiles.within(_tiles.span(first, 2 * bn), 2 * n_out, 2 * bn)
        return [_RhsColumns(pl.ds(first, 2 * bn), first, pairs, 2 * n_out, 2 * bn)]
    up = n_out + first_col
    return [_RhsColumns(pl.ds(first_col, bn), first_col, inside, n_out, bn),
            _RhsColumns(pl.ds(up, bn), up, inside, 2 * n_out, math.gcd(n_out, bn))]


def _kernel(table_ref, lhs_ref, rhs_ref, *refs, blocks: config.BlockConfig, m: int, k: int,
            n_out: int, num_visits: int, n_tiles: int, row_align: int, transpose_rhs: bool,
            product: _tiles.TileProduct, fill: bool, lhs_packing: _four_bit.Packing | None,
            rhs_packing: _four_bit.Packing | None, lhs_block: int | None,
            rhs_block: int | None, lhs_row_block: int | None,
            rhs_column_block: int | None, spec: Epilogue, plain: bool, has_row_scale: bool,
            column_vectors: int, has_bias: bool) -> None:
    from jax.experimental import pallas as pl

    # refs: the scales with blocks, the epilogue's row scale, column scale and bias when
    # given, existing_out when given (the output's buffer), the output.
    lhs_scale_ref, rhs_scale_ref, lhs_row_ref, rhs_column_ref, refs = take_scale_refs(
        refs, lhs_block, rhs_block, lhs_row_block, rhs_column_block)
    row_scale_ref, refs = (refs[0], refs[1:]) if has_row_scale else (None, refs)
    vector_refs = refs[:column_vectors]
    column_scale_ref = vector_refs[0] if column_vectors - has_bias else None
    bias_ref = vector_refs[-1] if has_bias else None
    out_ref = refs[-1]
    scaled = lhs_block is not None or rhs_block is not None
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    visit, n_tile = _band_order(pl.program_id(0), num_visits, n_tiles)
    group = table_ref[visits.GROUP, visit]
    first_row = table_ref[visits.FIRST_ROW, visit]
    if row_align > 1:
        first_row = pl.multiple_of(first_row, row_align)
    first_col = pl.multiple_of(n_tile * bn, bn)
    rows = _tiles.span(first_row, bm)
    cols = _tiles.span(first_col, bn)
    owned = (rows >= table_ref[visits.START, visit]) & (rows < table_ref[visits.END, visit])
    # Output columns past n_out: for a glu, their gate and up columns are past rhs's too.
    col_inside = _tiles.within(cols, n_out, bn)
    out_block = out_ref.at[pl.ds(first_row, bm), pl.ds(first_col, bn)]
    sources = _rhs_columns(first_col, bn, n_out, col_inside, spec)

    @pl.when(group >= 0)
    def _multiply():
        row_inside = _tiles.within(rows, m, bm)

        def step(i, totals):
            first_k = pl.multiple_of(i * bk, bk)
            k_inside = _tiles.within(_tiles.span(first_k, bk), k, bk)
            left = _four_bit.load(lhs_ref, (pl.ds(first_row, bm),), row_inside,
                                  pl.ds(first_k, bk), k_inside, k, lhs_packing, bk)
            # Output-axis scale blocks: the row tile (lhs) or column tile (rhs) lies in one block,
            # whose scales vary along k.
            left = _tiles.scaled_by(left, _tiles.block_scales(
                lhs_row_ref, lhs_row_block, first_row, lambda b: (b, pl.ds(first_k, bk)),
                k_inside), axis=1)
            row_scale = _tiles.block_scales(
                lhs_scale_ref, lhs_block, first_k, lambda b: (pl.ds(first_row, bm), b),
                row_inside)
            new_totals = []
            for total, source in zip(totals, sources):  # one accumulator, or gate and up
                columns, inside = source.columns, source.inside
                if transpose_rhs:
                    right = _four_bit.load(rhs_ref, (group, columns), inside, pl.ds(first_k, bk),
                                           k_inside, k, rhs_packing, bk)
                else:
                    right = _four_bit.load(rhs_ref, (group, pl.ds(first_k, bk)), k_inside,
                                           columns, inside, source.limit, rhs_packing,
                                           source.alignment)
                right = _tiles.scaled_by(right, _tiles.block_scales(
                    rhs_column_ref, rhs_column_block, source.first,
                    lambda b: ((group, b, pl.ds(first_k, bk)) if transpose_rhs
                               else (group, pl.ds(first_k, bk), b)), k_inside),
                    axis=1 if transpose_rhs else 0)
                if not scaled:
                    new_totals.append(product.add(total, left, right, trans_b=transpose_rhs))
                    continue
                col_scale = _tiles.block_scales(
                    rhs_scale_ref, rhs_block, first_k,
                    lambda b, columns=columns: ((group, columns, b) if transpose_rhs
                                                else (group, b, columns)), inside)
                new_totals.append(product.add_scaled(total, left, right, row_scale, col_scale,
                                                     transpose_rhs))
            return tuple(new_totals)

        shapes = [(bm, source.columns.size) for source in sources]
        starts = tuple(jnp.zeros(shape, jnp.float32) if scaled else product.zeros(shape)
                       for shape in shapes)
        totals = lax.fori_loop(0, -(-k // bk), step, starts)
        if plain:
            (total,) = totals
            result = product.output(total, out_ref.dtype)
        else:
            row_scale = None if row_scale_ref is None else _tiles.vector_load(
                row_scale_ref.at[pl.ds(first_row, bm)], row_inside).astype(jnp.float32)
            result = _epilogue(spec, [product.result(total) for total in totals], sources,
                               row_scale, column_scale_ref, bias_ref, group).astype(out_ref.dtype)
        _tiles.masked_store(out_block, result, owned, col_inside)

    if fill:
        @pl.when(group == visits.FILL)
        def _zero():
            _tiles.masked_store(out_block, jnp.zeros((bm, bn), out_ref.dtype), owned, col_inside)


def _epilogue(spec: Epilogue, totals: list[jax.Array], sources: list[_RhsColumns],
              row_scale: jax.Array | None, column_scale_ref, bias_ref,
              group: jax.Array) -> jax.Array:
    """The float32 output tile from the float32 sums of each accumulator: scaled by the rows'
    and the group's columns' scales of quantized operands, the group's bias at their rhs
    columns added, then the activation, or the gate of (gate, up)."""

    def column_vector(ref, source):
        return _tiles.vector_load(ref.at[group, source.columns],
                                  source.inside).astype(jnp.float32)[None, :]

    finished = []
    for total, source in zip(totals, sources):
        if row_scale is not None:
            total = total * row_scale[:, None]
        if column_scale_ref is not None:
            total = total * column_vector(column_scale_ref, source)
        if bias_ref is not None:
            total = total + column_vector(bias_ref, source)
        finished.append(total)
    totals = finished
    if spec.glu is None:
        (total,) = totals
        return spec.activate(total, erf=polynomial_erf.erf)
    gate, up = _tiles.deinterleaved(*totals) if spec.interleaved else totals
    return spec.gated(gate, up, erf=polynomial_erf.erf)
