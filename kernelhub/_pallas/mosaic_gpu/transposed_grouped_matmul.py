"""transposed_grouped_matmul as a Pallas Mosaic GPU kernel for Hopper (contract:
kernelhub/ops/transposed_grouped_matmul.py).

Work: (group, k-tile, n-tile) output tiles, group outermost, walked by a persistent grid of one
program per SM (`plgpu.nd_loop`), so the programs running at once read the same group's rows. A
program sums its group's rows in chunks of block_m (tgmm_chunks.py: with 16-bit values they
start at the group's first row, rounded down to 8, and lhs is read [m, k], so the weight
gradient's `x.T` costs no copy): `plgpu.emit_pipeline` brings the lhs and rhs tiles of each
chunk into shared memory by TMA, `stages` chunks in flight, and wgmma adds them into a float32
accumulator (int32 for int8 tiles: exact). Of a group's chunks only the first and the last can hold
rows it does not sum (other groups', or those a last chunk moved back from the end shares with the
chunk before); there a select sets those rows to exact zeros in shared memory, in both tiles (so a
NaN in another group's row stays out of this sum); with the tiling's upcast, an 8-bit tile beside a
16-bit one or one of another 8-bit kind is converted to 16 bits in that pass, at every chunk (beside
float32, to float32). An empty group runs no chunk. The tile, plus existing_out's when given, is
stored whole by one TMA copy: every output element is written once, by one program. Compiled,
existing_out is the output's own buffer (aliased, as gmm's): each tile is read from it and written
back, and an empty group's tiles are left as they are. The store runs while the program sums its
next tile (one shared-memory tile per program holds the result in flight; only writing the next
result waits for it). Scale blocks of quantized operands are scale_blocks.py's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernelhub._grouped_matmul.groups import local_bounds
from kernelhub._grouped_matmul.problem import tgmm_problem
from kernelhub._pallas.mosaic_gpu import (block_rules, config, group_spans, kernel_parts,
                                          operand_types, profiling, scale_blocks, shared_memory,
                                          tgmm_warp_specialized)
from kernelhub._pallas.mosaic_gpu.tgmm_chunks import ChunkLayout
from kernelhub._pallas.mosaic_gpu.block_rules import round_up
from kernelhub._pallas.mosaic_gpu.kernel_parts import padded


def raw_transposed_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type, tiling,
                                  group_offset, num_actual_groups, existing_out, scales=None,
                                  output_blocks=None, *, interpret: bool = False) -> jax.Array:
    """The forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py)."""
    out_dtype = jnp.dtype(preferred_element_type)
    groups = num_actual_groups
    lhs, rhs, problem, plan = scale_blocks.planned_tgmm(
        lhs, rhs, scales, output_blocks,
        lambda lhs, rhs: tgmm_problem(lhs, rhs, group_sizes, out_dtype,
                                      existing_out is not None, groups))
    blocks = config.from_tiling(tiling, problem, interpret=interpret,
                                output_block=plan.tile_block,
                                wider_than_key=plan.blocks_given)
    m, k, n = problem.m, problem.k, problem.n
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n

    m_p, k_p, n_p = round_up(m, bm), round_up(k, bk), round_up(n, bn)
    if blocks.upcast:
        # Both read as stored, the 8-bit tiles converted in shared memory.
        layout = ChunkLayout.converting(lhs.dtype, rhs.dtype)
        lhs, rhs = operand_types.read_as(lhs), operand_types.read_as(rhs)
    else:
        dtype = operand_types.kernel_dtype(lhs.dtype, rhs.dtype, m)
        layout = ChunkLayout.for_dtype(dtype)
        lhs, rhs = lhs.astype(dtype), rhs.astype(dtype)
    lhs, rhs = layout.arranged(lhs, rhs)
    # Compiled, rows along both operands' major axis (16-bit layouts) are padded only to a
    # multiple of ROW_ALIGN, as gmm's are: a chunk may read past the last row (TMA fills
    # those reads with zeros) and sums only its group's rows; at least one whole chunk. Rows
    # along a minor axis are cut in 128-byte swizzle rows: padded to whole chunks, as they are
    # interpreted.
    rows = (max(round_up(m, block_rules.ROW_ALIGN), bm) if layout.lhs_rows_major and not interpret
            else m_p)
    lhs_sizes, rhs_sizes = layout.padding(rows, k_p, n_p)
    lhs, rhs = padded(lhs, lhs_sizes), padded(rhs, rhs_sizes)
    existing = None if existing_out is None else padded(existing_out, {1: k_p, 2: n_p})
    # Compiled, the output is existing_out's buffer (aliased): the program that sums a tile
    # reads it there and writes it back, and an empty group's tiles are left as they are
    # (kernel_parts.tgmm_output_refs). The interpreter takes no aliased output: there
    # existing_out is an operand and every tile is written.
    in_place = existing is not None and not interpret
    copied = () if existing is None or in_place else (existing,)
    starts, ends = local_bounds(group_sizes, group_offset, groups, m)
    tiles = dict(blocks=blocks, k_tiles=k_p // bk, n_tiles=n_p // bn, layout=layout,
                 existing=kernel_parts.Existing.of(existing is not None, in_place),
                 interpret=interpret)
    if blocks.group_span > 1:
        table, spans = group_spans.chunk_tables(starts, ends, blocks.group_span, m_p, bm,
                                                layout)
        body = functools.partial(group_spans.body, spans=spans.shape[1], **tiles)
        tables = (table, spans)
    else:
        if blocks.compute_warpgroups == 1:
            body = functools.partial(_body, groups=groups, rows_padded=m_p, **tiles,
                                     row_block=plan.tile_block)
        else:
            body = functools.partial(tgmm_warp_specialized.body, groups=groups,
                                     rows_padded=m_p, **tiles,
                                     tile_rows=shared_memory.output_tile_rows(blocks, problem))
        tables = (jnp.stack([starts, ends]).astype(jnp.int32),)
    tile_scales = () if plan.tile_scales is None else (padded(plan.tile_scales, {1: m_p}),)
    out = kernel_parts.launch(body, (*tables, lhs, rhs, *tile_scales, *copied),
                              (groups, k_p, n_p),
                              out_dtype, interpret, "kernelhub_transposed_grouped_matmul",
                              starting_as=existing if in_place else None,
                              warp_specialized=blocks.compute_warpgroups > 1,
                              programs_per_sm=blocks.programs_per_sm)
    return out if (k_p, n_p) == (k, n) else out[:, :k, :n]


def _body(bounds_ref, lhs_ref, rhs_ref, *refs, blocks: block_rules.BlockConfig, groups: int,
          rows_padded: int, k_tiles: int, n_tiles: int, layout: ChunkLayout,
          existing: kernel_parts.Existing, interpret: bool, row_block: int | None = None
          ) -> None:
    """The kernel body with one compute warpgroup. With `row_block` (lhs's scale blocks
    along k, scale_blocks.py) the scales [k blocks, m] come first in `refs`."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    scales_ref, refs = (refs[0], refs[1:]) if row_block is not None else (None, refs)
    existing_ref, out_ref = kernel_parts.tgmm_output_refs(refs, existing)
    pl.run_scoped(functools.partial(_loop, bounds_ref, lhs_ref, rhs_ref, existing_ref, out_ref,
                                    scales_ref=scales_ref, row_block=row_block,
                                    blocks=blocks, groups=groups, rows_padded=rows_padded,
                                    k_tiles=k_tiles, n_tiles=n_tiles, layout=layout,
                                    skip_empty=existing is kernel_parts.Existing.IN_PLACE,
                                    interpret=interpret),
                  plgpu.SMEM((blocks.block_k, blocks.block_n), out_ref.dtype), plgpu.Barrier())


def _loop(bounds_ref, lhs_ref, rhs_ref, existing_ref, out_ref, tile_smem, barrier, *,
          blocks: block_rules.BlockConfig, groups: int, rows_padded: int, k_tiles: int,
          n_tiles: int, layout: ChunkLayout, skip_empty: bool, interpret: bool,
          scales_ref=None, row_block: int | None = None) -> None:
    """The program's share of the output tiles. One shared-memory tile holds each result
    while TMA stores it; the next tile's sums run while that store is in flight (a group of a
    fine-grained MoE sums few rows into each tile: its store costs as much as its loads), and
    only the write of the next result waits for it. `skip_empty`: an empty group's tiles
    already hold what they should (existing_out's, in place) and are not stored. With
    `scales_ref` ([k blocks, m]) each chunk's lhs tile is scaled by its block's scales for the
    chunk's rows."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    shape = (bk, bn)
    multiplied = layout.multiplied(lhs_ref.dtype)

    @plgpu.nd_loop((groups, k_tiles, n_tiles), collective_axes=kernel_parts.SM_AXIS)
    def _work(info):
        group, k_tile, n_tile = info.index
        end, chunks, rows_of = layout.group_chunks(bounds_ref, group, bm, rows_padded)

        def accumulate(acc, scratch=None, **conversions):
            @jax.named_scope(profiling.STEP)
            def step(indices, lhs_smem, rhs_smem, scales_smem=None):
                first_row, summed_from = rows_of(indices[0])
                tiles = layout.masked_tiles(
                    lhs_smem, rhs_smem, first_row, summed_from, end, indices[0], interpret,
                    **conversions,
                    lhs_scales=None if scales_smem is None else scales_smem[...])
                plgpu.wgmma(acc, *layout.operands(*tiles, scratch))
                # The previous chunk's product is done before the pipeline refills its
                # buffers (delay_release=1); this one's stays in flight.
                plgpu.wgmma_wait(1)

            @pl.when(chunks > 0)
            def _sum():
                specs = layout.specs(blocks, k_tile, n_tile, lambda c: rows_of(c)[0])
                operands = [lhs_ref, rhs_ref]
                if scales_ref is not None:
                    # The chunks are aligned rows (a K-major layout: scale_blocks.py).
                    specs.append(plgpu.BlockSpec(
                        (bm,), lambda c: (jax.lax.div(rows_of(c)[0], jnp.int32(bm)),)))
                    operands.append(scales_ref.at[
                        jax.lax.div(k_tile * bk, jnp.int32(row_block))])
                plgpu.emit_pipeline(
                    step,
                    grid=(chunks,),
                    in_specs=specs,
                    max_concurrent_steps=max(blocks.stages, 2),
                )(*operands)

            return kernel_parts.sums(acc)

        shared = layout.step_scratch(blocks, lhs_ref.dtype, rhs_ref.dtype, interpret)
        accumulator = kernel_parts.accumulator(shape, multiplied)
        with jax.named_scope(profiling.SUMS):
            if shared:
                # Registers and shared memory come from separate scopes (the interpreter's
                # rule).
                total = pl.run_scoped(lambda acc: pl.run_scoped(
                    lambda **tiles: accumulate(acc, **tiles), **shared), accumulator)
            else:
                total = pl.run_scoped(accumulate, accumulator)

        @pl.when((chunks > 0) if skip_empty else True)
        @jax.named_scope(profiling.STORE)
        def _store():
            kernel_parts.store_tile(total, tile_smem, barrier, existing_ref, out_ref, group,
                                    k_tile * bk, pl.ds(n_tile * bn, bn))

    # The last store completes before the kernel ends.
    plgpu.wait_smem_to_gmem(0)
