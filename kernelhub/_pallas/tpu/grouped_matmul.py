"""grouped_matmul as a Pallas Mosaic kernel (contract: kernelhub/ops/grouped_matmul.py).

Grid (column tiles, items, contraction tiles); the items come from `schedule.gmm_schedule`.
An output block stays in VMEM while consecutive items share its row tile: the first of them
fills it with zeros or existing_out, each multiplying item then overwrites just its group's rows
(a select, so a NaN elsewhere stays out). Contraction blocks that run past k are masked to zero
on both operands; blocks past m or n only feed rows and columns that are never written back.
With scale blocks along k (`scales`: kernelhub/_pallas/tpu/scale_blocks.py) each contraction
tile's product is summed in float32 sub-slice by sub-slice, each scaled by its lhs row scales
and its group's rhs column scales.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._core.manual_axes import shape_dtype_like
from kernelhub._pallas.tpu import epilogue_tiles, mxu, scale_blocks
from kernelhub._pallas.tpu import schedule as schedule_lib
from kernelhub._pallas.tpu import tiling as tiling_lib
from kernelhub._pallas.tpu.kernel_parts import (
    accumulator_dtype, call_options, contraction_precision, keep_first, kernel_name,
    kernel_operand, needs_widening, result_dtype, row_mask, tile_product, tile_values, widened)
from kernelhub._pallas.tpu.schedule import GmmField
from kernelhub._pallas.tpu.tiling import LANES
from kernelhub._grouped_matmul.contraction_scales import (
    NO_OUTPUT_BLOCKS, NO_SCALES, ContractionScales, OutputBlockScales, take_scale_refs)
from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.epilogue import NO_EPILOGUE, KernelEpilogue, applied
from kernelhub._grouped_matmul.problem import gmm_problem


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
                   preferred_element_type: Any, tiling: Any, group_offset: jax.Array,
                   existing_out: jax.Array | None, transpose_rhs: bool,
                   scales: ContractionScales | None = None,
                   output_blocks: OutputBlockScales | None = None,
                   epilogue: KernelEpilogue = NO_EPILOGUE, *,
                   interpret: Any = False) -> jax.Array:
    """The raw forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py). The epilogue runs on the float32 accumulator
    block in VMEM before the store (kernelhub/_pallas/tpu/epilogue_tiles.py)."""
    out_dtype = jnp.dtype(preferred_element_type)
    if needs_widening(lhs.dtype, rhs.dtype, out_dtype):
        out = grouped_matmul(
            lhs.astype(widened(lhs.dtype)), rhs.astype(widened(rhs.dtype)), group_sizes,
            widened(out_dtype), tiling, group_offset,
            None if existing_out is None else existing_out.astype(widened(out_dtype)),
            transpose_rhs, scales, output_blocks, epilogue, interpret=interpret)
        return out.astype(out_dtype)
    spec = epilogue.spec
    if spec.glu is not None and (scales is not None or output_blocks is not None):
        # Scale blocks of a gated rhs would need the gate's and up's scale tiles too: this rare
        # pair (blocked scales on a glu weight) runs the gate outside the kernel.
        total = grouped_matmul(lhs, rhs, group_sizes, jnp.float32, tiling, group_offset, None,
                               transpose_rhs, scales, output_blocks, interpret=interpret)
        return applied(total, epilogue, group_sizes, group_offset, rhs.shape[0], existing_out,
                       out_dtype)
    problem = gmm_problem(lhs, rhs, group_sizes, out_dtype, existing_out is not None,
                          transpose_rhs)
    m, k, n_rhs = problem.m, problem.k, problem.n
    n = spec.output_columns(n_rhs)
    schedule_lib.check_symbolic(problem, interpret)

    options = call_options(problem, tiling, interpret)
    scales, output_blocks = scales or NO_SCALES, output_blocks or NO_OUTPUT_BLOCKS
    lhs_row_block, rhs_column_block = output_blocks.operand_blocks
    options = scale_blocks.fitted_tiles(
        options, {"tm": (m, tiling_lib.row_granule(problem)), "tk": (k, LANES), "tn": (n, LANES)},
        {"tk": scales.operand_blocks, "tm": (lhs_row_block,), "tn": (rhs_column_block,)})
    gate = epilogue_tiles.GatedColumns.of(spec, n, options.tiles.tn, transpose_rhs)
    if gate is not None:
        options = options.with_tile("tn", gate.tn)
    tm, tk, tn = options.tiles.as_tuple()
    k_tiles, n_tiles = -(-k // tk), -(-n // tn)
    plan = schedule_lib.gmm_schedule(group_sizes, group_offset, problem.local_groups, m, tm, k_tiles)
    field = plan.reader

    def k_block(item, kk, table):
        hold = field(table, GmmField.HOLD_K, item)
        return jnp.where(hold < 0, kk, hold)

    def lhs_index(ni, item, kk, table):
        return field(table, GmmField.LHS_TILE, item), k_block(item, kk, table)

    def rhs_index(ni, item, kk, table):
        group, kb = field(table, GmmField.GROUP, item), k_block(item, kk, table)
        return (group, ni, kb) if transpose_rhs else (group, kb, ni)

    def out_index(ni, item, kk, table):
        return field(table, GmmField.OUT_TILE, item), ni

    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    out_spec = pl.BlockSpec((tm, tn), out_index)
    in_specs = [pl.BlockSpec((tm, tk), lhs_index)]
    operands = [kernel_operand(lhs)]
    if gate is None:
        in_specs.append(pl.BlockSpec((None, tn, tk) if transpose_rhs else (None, tk, tn),
                                     rhs_index))
        operands.append(kernel_operand(rhs))
    else:  # the rhs tiles holding the gate and up halves of the output tile's columns
        in_specs += gate.rhs_specs(rhs_index, tk)
        operands += gate.rhs_operands(kernel_operand(rhs))
    lhs_scales = rhs_scales = None
    if scales.lhs is not None:
        lhs_scales = scale_blocks.TileScales(scales.lhs_block, tk, k)
        in_specs.append(pl.BlockSpec(
            (lhs_scales.entries, tm, 1),
            lambda ni, item, kk, table: (lhs_scales.block_index(k_block(item, kk, table)),
                                         field(table, GmmField.LHS_TILE, item), 0)))
        operands.append(lhs_scales.leading(scales.lhs, 1)[:, :, None])
    if scales.rhs is not None:
        rhs_scales = scale_blocks.TileScales(scales.rhs_block, tk, k)
        in_specs.append(pl.BlockSpec(
            (None, rhs_scales.entries, 1, tn),
            lambda ni, item, kk, table: (field(table, GmmField.GROUP, item),
                                         rhs_scales.block_index(k_block(item, kk, table)), 0, ni)))
        # [G, blocks, n] from either layout, then the blocks leading within a group.
        by_column = jnp.swapaxes(scales.rhs, 1, 2) if transpose_rhs else scales.rhs
        operands.append(jnp.moveaxis(rhs_scales.leading(by_column, 1), 0, 1)[:, :, None, :])
    lhs_rows = rhs_columns = None
    if lhs_row_block is not None:  # [row blocks, k] as [blocks, 1, k]
        lhs_rows = scale_blocks.TileScales(lhs_row_block, tm, m)
        in_specs.append(pl.BlockSpec(
            (lhs_rows.entries, 1, tk),
            lambda ni, item, kk, table: (
                lhs_rows.block_index(field(table, GmmField.LHS_TILE, item)), 0,
                k_block(item, kk, table))))
        operands.append(lhs_rows.leading(output_blocks.lhs, 0)[:, None, :])
    if rhs_column_block is not None:
        # [G, k, column blocks] as [G, blocks, k, 1]; transposed, [G, blocks, k] as [G, blocks,
        # 1, k]: each entry a vector along k, as the rhs tile holds k.
        rhs_columns = scale_blocks.TileScales(rhs_column_block, tn, n)
        entry = (1, tk) if transpose_rhs else (tk, 1)
        in_specs.append(pl.BlockSpec(
            (None, rhs_columns.entries, *entry),
            lambda ni, item, kk, table: (
                field(table, GmmField.GROUP, item), rhs_columns.block_index(ni),
                *((0, k_block(item, kk, table)) if transpose_rhs
                  else (k_block(item, kk, table), 0)))))
        blocks_leading = jnp.moveaxis(rhs_columns.leading(
            output_blocks.rhs, 1 if transpose_rhs else 2), 0, 1)
        operands.append(blocks_leading[:, :, None, :] if transpose_rhs
                        else blocks_leading[..., None])
    if epilogue.row_scale is not None:  # [m, 1]: the row tile's scales as a column
        in_specs.append(pl.BlockSpec(
            (tm, 1), lambda ni, item, kk, table: (field(table, GmmField.LHS_TILE, item), 0)))
        operands.append(epilogue.row_scale.astype(jnp.float32)[:, None])
    for values in epilogue.column_vectors:  # the column scale, then the bias
        laid_out = epilogue_tiles.column_operand(spec, values, gate, n, tn)
        in_specs.append(pl.BlockSpec(
            (None, 1, laid_out.shape[-1] // n_tiles),
            lambda ni, item, kk, table: (field(table, GmmField.GROUP, item), 0, ni)))
        operands.append(laid_out)
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
    blocks = tuple(s.block for s in (lhs_scales, rhs_scales) if s is not None)
    kernel = functools.partial(
        _kernel, read=plan.reader, tm=tm, tk=tk, k=k, k_tiles=k_tiles, spec=spec, gate=gate,
        plain=epilogue.is_identity, has_row_scale=epilogue.row_scale is not None,
        has_column_scale=epilogue.column_scale is not None, has_bias=epilogue.bias is not None,
        transpose_rhs=transpose_rhs, compute=compute, lhs_dtype=lhs.dtype, rhs_dtype=rhs.dtype,
        has_existing=existing_out is not None,
        lhs_block=None if lhs_scales is None else lhs_scales.block,
        rhs_block=None if rhs_scales is None else rhs_scales.block,
        slices=scale_blocks.sub_slices(tk, k, blocks) if blocks else None,
        lhs_rows=lhs_rows, rhs_columns=rhs_columns)
    call = pl.pallas_call(
        kernel,
        out_shape=shape_dtype_like((m, n), out_dtype, lhs),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(n_tiles, plan.items, k_tiles),
            in_specs=in_specs,
            out_specs=out_spec,
            scratch_shapes=[pltpu.VMEM(
                (tm, tn if gate is None else 2 * tn),
                jnp.float32 if scales.arrays else accumulator_dtype(compute, k, out_dtype)),
                *epilogue_tiles.scratch(gate, tm, tn)],
        ),
        input_output_aliases=aliases,
        # Items revisit an output block back to back, and contraction steps accumulate: only
        # the column tiles are independent (split between megacore's two cores).
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=options.vmem_limit_bytes),
        # A symbolic m (shape-polymorphic export) has no count to estimate with.
        cost_estimate=None if not is_static(m) else pl.CostEstimate(
            flops=2 * m * k * n_rhs, transcendentals=0 if spec.is_identity else m * n_rhs,
            bytes_accessed=(lhs.size * lhs.dtype.itemsize * n_tiles
                            + rhs.size * rhs.dtype.itemsize
                            + m * n * out_dtype.itemsize * (2 if existing_out is not None else 1))),
        interpret=options.interpret,
        name=kernel_name(problem.kernel, options.tiles),
    )
    return call(plan.table, *operands)


def _kernel(table, lhs_ref, *refs, read, tm, tk, k, k_tiles, spec, gate, plain, has_row_scale,
            has_column_scale, has_bias, transpose_rhs, compute, lhs_dtype, rhs_dtype,
            has_existing, lhs_block, rhs_block, slices, lhs_rows,
            rhs_columns):
    from jax.experimental import pallas as pl

    rhs_count = 1 if gate is None else gate.rhs_count
    rhs_refs, refs = refs[:rhs_count], refs[rhs_count:]
    lhs_scale_ref, rhs_scale_ref, lhs_row_ref, rhs_column_ref, refs = take_scale_refs(
        refs, lhs_block, rhs_block, lhs_rows, rhs_columns)
    epilogue_refs = []
    for present in (has_row_scale, has_column_scale, has_bias):
        epilogue_refs.append(refs[0] if present else None)
        refs = refs[1:] if present else refs
    row_scale_ref, column_scale_ref, bias_ref = epilogue_refs
    if has_existing:
        existing_ref, refs = refs[0], refs[1:]
    else:
        existing_ref = None
    out_ref, acc_ref, *transposed_ref = refs
    item, kk = pl.program_id(1), pl.program_id(2)
    field = functools.partial(read, table)

    @pl.when((kk == 0) & (field(GmmField.FIRST_VISIT, item) == 1))
    def _initialise_output_block():
        if has_existing:
            out_ref[...] = existing_ref[...]
        else:
            out_ref[...] = jnp.zeros(out_ref.shape, out_ref.dtype)

    def multiply(mask_past_k: bool):
        rhs_values = functools.partial(tile_values, dtype=rhs_dtype, compute=compute)
        rhs = rhs_values(rhs_refs[0][...]) if gate is None else gate.rhs_tile(rhs_refs, rhs_values)
        lhs = tile_values(lhs_ref[...], lhs_dtype, compute)
        # Output-axis scale blocks (rows of lhs, columns of rhs): dequantized here, before the
        # mask, which then also clears scales read past k.
        if lhs_rows is not None:
            lhs = lhs * scale_blocks.across_tile(lhs_row_ref, lhs_rows, lhs.shape, axis=0)
        if rhs_columns is not None:
            rhs = rhs * scale_blocks.across_tile(rhs_column_ref, rhs_columns, rhs.shape,
                                                 axis=0 if transpose_rhs else 1)
        if mask_past_k:  # the last contraction block runs past k: zero both operands there
            valid = k - kk * tk
            lhs = keep_first(lhs, valid, axis=1)
            rhs = keep_first(rhs, valid, axis=1 if transpose_rhs else 0)
        contracting = ((1,), (1,)) if transpose_rhs else ((1,), (0,))

        def dot(lhs, rhs, result_dtype):
            return lax.dot_general(lhs, rhs, (contracting, ((), ())),
                                   preferred_element_type=result_dtype,
                                   precision=contraction_precision(compute))

        if slices is None:
            product = tile_product(dot, lhs, rhs, 1, 1 if transpose_rhs else 0, compute,
                                   acc_ref.dtype)
        else:
            def sub_slice_product(start, size):
                part = slice(start, start + size)
                return dot(lhs[:, part], rhs[:, part] if transpose_rhs else rhs[part, :],
                           accumulator_dtype(compute))

            product = scale_blocks.scaled_sum(sub_slice_product, slices, acc_ref.shape, lhs_scale_ref,
                                              lhs_block, rhs_scale_ref, rhs_block)

        @pl.when(kk == 0)
        def _start():
            acc_ref[...] = product

        @pl.when(kk > 0)
        def _accumulate():
            acc_ref[...] += product

    multiplies = field(GmmField.MULTIPLIES, item) == 1
    if k % tk:
        pl.when(multiplies & (kk < k_tiles - 1))(lambda: multiply(False))
        pl.when(multiplies & (kk == k_tiles - 1))(lambda: multiply(True))
    else:
        pl.when(multiplies)(lambda: multiply(False))

    @pl.when(multiplies & (kk == k_tiles - 1))
    def _store_group_rows():
        first_row = field(GmmField.OUT_TILE, item) * tm
        mine = row_mask(out_ref.shape, 0, first_row, field(GmmField.ROW_START, item),
                        field(GmmField.ROW_END, item))
        kept = out_ref[...].astype(result_dtype(out_ref.dtype))
        total = acc_ref[...].astype(result_dtype(out_ref.dtype))
        if not plain:
            total = epilogue_tiles.finished(total, spec, gate, row_scale_ref, column_scale_ref,
                                            bias_ref, transposed_ref)
        out_ref[...] = jnp.where(mine, total, kept).astype(out_ref.dtype)
