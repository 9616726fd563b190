"""transposed_grouped_matmul as a Pallas Mosaic kernel
(contract: kernelhub/ops/transposed_grouped_matmul.py).

Grid (column tiles, output-row tiles, items); the items come from `schedule.tgmm_schedule`.
lhs is read as it lies, [k, m] blocks of (tk, tm): no transposed copy. Each item adds one row
tile's products to a float32 accumulator, with the rows outside its group zeroed in both
operands (zeroing one would let 0 * NaN through); the group's last item writes the block, plus
existing_out. An empty group's single item writes zeros (or existing_out). With scale blocks
along m (`scales`: kernelhub/_pallas/tpu/scale_blocks.py) a row tile's product is summed in
float32 sub-slice by sub-slice, each scaled by its lhs row scales and rhs column scales.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._core.manual_axes import shape_dtype_like
from kernelhub._pallas.tpu import mxu, scale_blocks
from kernelhub._pallas.tpu import schedule as schedule_lib
from kernelhub._pallas.tpu import tiling as tiling_lib
from kernelhub._pallas.tpu.kernel_parts import (
    accumulator_dtype, call_options, contraction_precision, kernel_name,
    kernel_operand, needs_widening, result_dtype, row_mask, tile_product, tile_values, widened)
from kernelhub._pallas.tpu.schedule import TgmmField
from kernelhub._pallas.tpu.tiling import LANES
from kernelhub._grouped_matmul.contraction_scales import (
    NO_OUTPUT_BLOCKS, NO_SCALES, ContractionScales, OutputBlockScales, take_scale_refs)
from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.problem import tgmm_problem


def transposed_grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
                              preferred_element_type: Any, tiling: Any,
                              group_offset: jax.Array, num_actual_groups: int,
                              existing_out: jax.Array | None,
                              scales: ContractionScales | None = None,
                              output_blocks: OutputBlockScales | None = None, *,
                              interpret: Any = False) -> jax.Array:
    """The raw forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py)."""
    out_dtype = jnp.dtype(preferred_element_type)
    if needs_widening(lhs.dtype, rhs.dtype, out_dtype):
        out = transposed_grouped_matmul(
            lhs.astype(widened(lhs.dtype)), rhs.astype(widened(rhs.dtype)), group_sizes,
            widened(out_dtype), tiling, group_offset, num_actual_groups,
            None if existing_out is None else existing_out.astype(widened(out_dtype)),
            scales, output_blocks, interpret=interpret)
        return out.astype(out_dtype)
    actual = num_actual_groups
    problem = tgmm_problem(lhs, rhs, group_sizes, out_dtype, existing_out is not None, actual)
    m, k, n = problem.m, problem.k, problem.n
    schedule_lib.check_symbolic(problem, interpret)

    options = call_options(problem, tiling, interpret)
    scales, output_blocks = scales or NO_SCALES, output_blocks or NO_OUTPUT_BLOCKS
    lhs_row_block, rhs_column_block = output_blocks.operand_blocks
    options = scale_blocks.fitted_tiles(
        options, {"tm": (m, LANES), "tk": (k, tiling_lib.depth_granule(problem)), "tn": (n, LANES)},
        {"tm": scales.operand_blocks, "tk": (lhs_row_block,), "tn": (rhs_column_block,)})
    tm, tk, tn = options.tiles.as_tuple()
    k_tiles, n_tiles = -(-k // tk), -(-n // tn)
    plan = schedule_lib.tgmm_schedule(group_sizes, group_offset, actual, m, tm)
    field = plan.reader

    def lhs_index(ni, ki, item, table):
        return ki, field(table, TgmmField.TILE, item)

    def rhs_index(ni, ki, item, table):
        return field(table, TgmmField.TILE, item), ni

    def out_index(ni, ki, item, table):
        return field(table, TgmmField.GROUP, item), ki, ni

    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    out_spec = pl.BlockSpec((None, tk, tn), out_index)
    in_specs = [pl.BlockSpec((tk, tm), lhs_index), pl.BlockSpec((tm, tn), rhs_index)]
    operands = [kernel_operand(lhs), kernel_operand(rhs)]
    lhs_scales = rhs_scales = None
    if scales.lhs is not None:  # [k, blocks]
        lhs_scales = scale_blocks.TileScales(scales.lhs_block, tm, m)
        in_specs.append(pl.BlockSpec(
            (lhs_scales.entries, tk, 1),
            lambda ni, ki, item, table: (
                lhs_scales.block_index(field(table, TgmmField.TILE, item)), ki, 0)))
        operands.append(lhs_scales.leading(scales.lhs, 1)[:, :, None])
    if scales.rhs is not None:  # [blocks, n]
        rhs_scales = scale_blocks.TileScales(scales.rhs_block, tm, m)
        in_specs.append(pl.BlockSpec(
            (rhs_scales.entries, 1, tn),
            lambda ni, ki, item, table: (
                rhs_scales.block_index(field(table, TgmmField.TILE, item)), 0, ni)))
        operands.append(rhs_scales.leading(scales.rhs, 0)[:, None, :])
    lhs_rows = rhs_columns = None
    if lhs_row_block is not None:  # [k blocks, m] as [blocks, 1, m]
        lhs_rows = scale_blocks.TileScales(lhs_row_block, tk, k)
        in_specs.append(pl.BlockSpec(
            (lhs_rows.entries, 1, tm),
            lambda ni, ki, item, table: (lhs_rows.block_index(ki), 0,
                                         field(table, TgmmField.TILE, item))))
        operands.append(lhs_rows.leading(output_blocks.lhs, 0)[:, None, :])
    if rhs_column_block is not None:  # [m, n blocks] as [blocks, m, 1]
        rhs_columns = scale_blocks.TileScales(rhs_column_block, tn, n)
        in_specs.append(pl.BlockSpec(
            (rhs_columns.entries, tm, 1),
            lambda ni, ki, item, table: (rhs_columns.block_index(ni),
                                         field(table, TgmmField.TILE, item), 0)))
        operands.append(rhs_columns.leading(output_blocks.rhs, 1)[..., None])
    blocks = tuple(s.block for s in (lhs_scales, rhs_scales) if s is not None)
    aliases = {}
    if existing_out is not None:
        in_specs.append(out_spec)
        operands.append(existing_out)
        if options.alias_existing:  # the index counts the prefetched schedule table
            aliases = {len(operands): 0}
    compute = mxu.compute_dtype(lhs.dtype, rhs.dtype, options.int8_mxu, options.int4_mxu,
                                options.fp8_mxu)
    if output_blocks.arrays:  # tiles dequantized in VMEM
        compute = jnp.float32
    kernel = functools.partial(
        _kernel, read=plan.reader, tm=tm, compute=compute, lhs_dtype=lhs.dtype,
        rhs_dtype=rhs.dtype, has_existing=existing_out is not None,
        lhs_block=None if lhs_scales is None else lhs_scales.block,
        rhs_block=None if rhs_scales is None else rhs_scales.block,
        slices=scale_blocks.sub_slices(tm, m, blocks) if blocks else None,
        lhs_rows=lhs_rows, rhs_columns=rhs_columns)
    call = pl.pallas_call(
        kernel,
        out_shape=shape_dtype_like((actual, k, n), out_dtype, lhs),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(n_tiles, k_tiles, plan.items),
            in_specs=in_specs,
            out_specs=out_spec,
            scratch_shapes=[pltpu.VMEM(
                (tk, tn),
                jnp.float32 if scales.arrays else accumulator_dtype(compute, m, out_dtype))],
        ),
        input_output_aliases=aliases,
        # Every output block belongs to one (column, row) tile pair: those axes are independent.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=options.vmem_limit_bytes),
        # A symbolic m (shape-polymorphic export) has no count to estimate with.
        cost_estimate=None if not is_static(m) else pl.CostEstimate(
            flops=2 * m * k * n, transcendentals=0,
            bytes_accessed=(lhs.size * lhs.dtype.itemsize * n_tiles
                            + rhs.size * rhs.dtype.itemsize * k_tiles
                            + actual * k * n * out_dtype.itemsize
                            * (2 if existing_out is not None else 1))),
        interpret=options.interpret,
        name=kernel_name(problem.kernel, options.tiles),
    )
    return call(plan.table, *operands)


def _kernel(table, lhs_ref, rhs_ref, *refs, read, tm, compute, lhs_dtype, rhs_dtype,
            has_existing, lhs_block,
            rhs_block, slices, lhs_rows, rhs_columns):
    from jax.experimental import pallas as pl

    lhs_scale_ref, rhs_scale_ref, lhs_row_ref, rhs_column_ref, refs = take_scale_refs(
        refs, lhs_block, rhs_block, lhs_rows, rhs_columns)
    if has_existing:
        existing_ref, out_ref, acc_ref = refs
    else:
        existing_ref, (out_ref, acc_ref) = None, refs
    item = pl.program_id(2)
    field = functools.partial(read, table)

    @pl.when(field(TgmmField.FIRST, item) == 1)
    def _reset():
        acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

    @pl.when(field(TgmmField.MULTIPLIES, item) == 1)
    def _accumulate():
        first_row = field(TgmmField.TILE, item) * tm
        start, end = field(TgmmField.ROW_START, item), field(TgmmField.ROW_END, item)
        lhs = tile_values(lhs_ref[...], lhs_dtype, compute)
        rhs = tile_values(rhs_ref[...], rhs_dtype, compute)
        # Output-axis scale blocks (k rows of lhs, n columns of rhs): dequantized here, before
        # the row masks, which then also clear scales of rows outside the group.
        if lhs_rows is not None:
            lhs = lhs * scale_blocks.across_tile(lhs_row_ref, lhs_rows, lhs.shape, axis=0)
        if rhs_columns is not None:
            rhs = rhs * scale_blocks.across_tile(rhs_column_ref, rhs_columns, rhs.shape, axis=1)
        lhs = jnp.where(row_mask(lhs.shape, 1, first_row, start, end), lhs, jnp.zeros_like(lhs))
        rhs = jnp.where(row_mask(rhs.shape, 0, first_row, start, end), rhs, jnp.zeros_like(rhs))

        def dot(lhs, rhs, result_dtype):
            return lax.dot_general(lhs, rhs, (((1,), (0,)), ((), ())),
                                   preferred_element_type=result_dtype,
                                   precision=contraction_precision(compute))

        if slices is None:
            acc_ref[...] += tile_product(dot, lhs, rhs, 1, 0, compute, acc_ref.dtype)
            return
        def multiply(start, size):
            part = slice(start, start + size)
            return dot(lhs[:, part], rhs[part, :], accumulator_dtype(compute))

        acc_ref[...] += scale_blocks.scaled_sum(multiply, slices, acc_ref.shape, lhs_scale_ref,
                                                lhs_block, rhs_scale_ref, rhs_block)

    @pl.when(field(TgmmField.LAST, item) == 1)
    def _store():
        total = acc_ref[...].astype(result_dtype(out_ref.dtype))
        if has_existing:
            total = total + existing_ref[...].astype(result_dtype(out_ref.dtype))
        out_ref[...] = total.astype(out_ref.dtype)
