"""gmm's body with warp specialization: the tiling's fifth entry, `compute_warpgroups=2`.

The same work as grouped_matmul.py's body ((visit, n-tile) pairs on a persistent grid, in bands),
split between three warpgroups of each program:
- the memory warpgroup issues the TMA loads of the lhs and weight tiles, `stages` ahead, and
  goes on to the next work item's loads once the compute warpgroups have taken the last
  step's tiles (the end of each pipeline waits for that);
- each of the two compute warpgroups multiplies the row tile by its half of the block_n
  columns into its own float32 accumulator (two for a gated unit), runs the epilogue on it,
  and stores the visit's rows of its half from its own shared-memory tile. With the tiling's
  upcast it first converts the step's 8-bit tiles it multiplies (the lhs tile, its columns of
  the weight tiles) into copies of its own in shared memory (operand_types.converted_dtype).
  With scale blocks along k (scale_fitting.within_scale_block) the memory warpgroup also loads each
  step's scale vectors, and each compute warpgroup sums its step into accumulators of the
  step's own, scales them by the step's row scales and its columns' scales, and adds them to
  float32 totals carried through the pipeline in registers: one warpgroup scales while the
  other's products run.

So the next work item's first loads are in flight while a work item's epilogue and stores
run. Shared memory that the warpgroups use is allocated once
for the program, outside the work loop: the pipeline's buffers, an output tile per compute
warpgroup, and the epilogue's vectors with a barrier per compute warpgroup.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernelhub._grouped_matmul import visits
from kernelhub._grouped_matmul.contraction_scales import take_scale_refs
from kernelhub._grouped_matmul.epilogue import Epilogue
from kernelhub._pallas.mosaic_gpu import (block_rules, kernel_parts, operand_types, profiling,
                                          scale_blocks)
from kernelhub._pallas.mosaic_gpu.kernel_parts import (COMPUTE_WARPGROUPS, MEMORY_REGISTERS,
                                                       WG_AXIS)


def body(table_ref, lhs_ref, rhs_ref, *refs, blocks: block_rules.BlockConfig, k_tiles: int,
         n_tiles: int, num_visits: int, n_half: int, halves: int, transpose_rhs: bool,
         paired: bool, spec: Epilogue, plain: bool, has_row_scale: bool, has_column_scale: bool,
         has_bias: bool, has_existing: bool, interpret: bool, band: int,
         epilogue_fn, tile_rows: int, plan: scale_blocks.Plan = scale_blocks.NOTHING
         ) -> None:
    """The kernel body; arguments as grouped_matmul._body's, `epilogue_fn` its epilogue,
    `tile_rows` the rows of each compute warpgroup's output tile (shared_memory.output_tile_rows:
    block_m, or a piece of it stored after another). `plan`: scale blocks along k only (an
    output tile in one block runs one compute warpgroup: scale_fitting.within_output_block)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    assert plan.tile_block is None, "scaled lhs tiles run one compute warpgroup"
    lhs_steps_ref, rhs_steps_ref, refs = take_scale_refs(refs, *plan.scales.operand_blocks)
    scaled = blocks.scaled_steps
    row_scale_ref, column_scale_ref, bias_ref, existing_ref, out_ref = (
        kernel_parts.gmm_operand_refs(refs, has_row_scale, has_column_scale, has_bias,
                                      has_existing))
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    part = bn // COMPUTE_WARPGROUPS  # each compute warpgroup's columns
    shape = (bm, part)
    pieces = bm // tile_rows
    multiplied = operand_types.multiplied_dtype(blocks.upcast, lhs_ref.dtype, rhs_ref.dtype)
    # With upcast, each compute warpgroup converts the 8-bit tiles it multiplies into copies
    # of its own: the whole lhs tile, and its columns of each weight tile. It waits for its
    # products at every step, so one copy of each serves.
    converts_lhs = lhs_ref.dtype != multiplied
    converts_rhs = rhs_ref.dtype != multiplied
    weight_part = (part, bk) if transpose_rhs else (bk, part)

    # Each work item hands the pipeline views already cut to its row tile and column tiles.
    rhs_spec = (plgpu.BlockSpec((bn, bk), lambda i: (0, i)) if transpose_rhs else
                plgpu.BlockSpec((bk, bn), lambda i: (i, 0)))

    # A step's scale vectors: the row tile's lhs scales, and each column tile's rhs scales
    # (views cut to the work item's, [k steps, rows or columns]).
    step_specs = [plgpu.BlockSpec((None, size), lambda i: (i, 0)) for ref, size, count in (
        (lhs_steps_ref, bm, 1), (rhs_steps_ref, bn, halves)) if ref is not None
        for _ in range(count)]

    def pipeline(step, context):
        return plgpu.emit_pipeline_warp_specialized(
            step, grid=(k_tiles,), memory_registers=MEMORY_REGISTERS,
            in_specs=[plgpu.BlockSpec((bm, bk), lambda i: (0, i)), *[rhs_spec] * halves,
                      *step_specs],
            wg_axis=WG_AXIS, num_compute_wgs=COMPUTE_WARPGROUPS,
            max_concurrent_steps=max(blocks.stages, 2), compute_context=context)

    def step_views(first_row, column_tiles, group):
        views = []
        if lhs_steps_ref is not None:
            views.append(lhs_steps_ref.at[:, pl.ds(first_row, bm)])
        if rhs_steps_ref is not None:
            views += [rhs_steps_ref.at[group, :, pl.ds(c * bn, bn)] for c in column_tiles]
        return views

    ignored = lambda *_, **__: None  # noqa: E731 - allocations do not depend on the body
    # One group's weights stand for all: the pipeline's buffers depend on dtypes and blocks.
    group_rhs = rhs_ref.at[0]
    scoped = dict(
        allocations=pipeline(ignored, ignored).get_allocations(
            lhs_ref, *[group_rhs] * halves, *step_views(0, range(halves), 0)),
        tiles=plgpu.SMEM((COMPUTE_WARPGROUPS, tile_rows, part), out_ref.dtype),
        barriers=plgpu.Barrier(num_barriers=COMPUTE_WARPGROUPS),
        rows_smem=plgpu.SMEM((COMPUTE_WARPGROUPS, bm), jnp.float32),
        columns_smem=plgpu.SMEM((COMPUTE_WARPGROUPS, 2 * halves, part), jnp.float32),
        # Interpreted, weights [G, n, k] reach wgmma through a transposing tile per compute
        # warpgroup (kernel_parts.transposed_operand), allocated here with the program's.
        scratches=plgpu.SMEM((COMPUTE_WARPGROUPS, bk, part), multiplied)
        if transpose_rhs and interpret else None,
        lhs_copies=plgpu.SMEM((COMPUTE_WARPGROUPS, bm, bk), multiplied) if converts_lhs
        else None,
        rhs_copies=plgpu.SMEM((COMPUTE_WARPGROUPS, halves, *weight_part), multiplied)
        if converts_rhs else None,
    )

    @functools.partial(pl.run_scoped, **scoped, collective_axes=WG_AXIS)
    def _program(allocations, tiles, barriers, rows_smem, columns_smem, scratches, lhs_copies,
                 rhs_copies):
        wg = jax.lax.axis_index(WG_AXIS)
        computing = wg < COMPUTE_WARPGROUPS
        tile_smem = tiles.at[wg]
        barrier = barriers.at[wg]
        scratch = None if scratches is None else scratches.at[wg]

        def load(src, smem):
            return kernel_parts.load_vector_through(src, smem, barrier)

        @plgpu.nd_loop((num_visits * n_tiles,), collective_axes=kernel_parts.SM_AXIS)
        def _work(info):
            visit, n_tile = kernel_parts.banded_order(info.index[0], num_visits, n_tiles, band)
            group, first_row, start, end = kernel_parts.visit_rows(table_ref, visit)
            # This compute warpgroup's first column of the output.
            first_col = n_tile * bn + wg * part

            def store_piece(piece):
                # The visit's rows among the piece's. In flight while the next piece is
                # written or the next work item's sums run: whoever writes the tile next
                # waits for it first.
                top = first_row + piece * tile_rows
                first = jnp.clip(start - top, 0, tile_rows)
                count = jnp.maximum(jnp.clip(end - top, 0, tile_rows) - first, 0)
                kernel_parts.store_rows(
                    tile_smem,
                    lambda row, rows: out_ref.at[pl.ds(top + row, rows),
                                                 pl.ds(first_col, part)],
                    first, count, tile_rows, wait=False)

            def store(result):
                for piece in range(pieces):
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    tile_smem[...] = (result if pieces == 1 else
                                      result[piece * tile_rows:(piece + 1) * tile_rows])
                    plgpu.commit_smem()
                    store_piece(piece)

            def context(run):
                def with_accumulators(*accs):
                    with jax.named_scope(profiling.SUMS):
                        totals = run(tuple(accs))
                        totals = tuple(kernel_parts.sums(acc) for acc in totals)
                    with jax.named_scope(profiling.STORE):
                        finish(totals)

                def with_totals():
                    with jax.named_scope(profiling.SUMS):
                        totals = run(tuple(kernel_parts.wgmma_zeros(shape, interpret)
                                           for _ in range(halves)))
                    with jax.named_scope(profiling.STORE):
                        finish(totals)

                def finish(totals):
                    if plain:
                        (result,) = totals
                    else:
                        row_scale = None if row_scale_ref is None else load(
                            row_scale_ref.at[pl.ds(first_row, bm)], rows_smem.at[wg])

                        def columns(ref, slot, half):
                            return load(ref.at[group, pl.ds(first_col + half * n_half, part)],
                                        columns_smem.at[wg, 2 * half + slot])

                        result = epilogue_fn(
                            spec, totals, shape, row_scale,
                            None if column_scale_ref is None else functools.partial(
                                columns, column_scale_ref, 0),
                            None if bias_ref is None else functools.partial(
                                columns, bias_ref, 1))
                    store(result.astype(out_ref.dtype))

                if scaled:
                    with_totals()
                else:
                    pl.run_scoped(with_accumulators,
                                  *[kernel_parts.accumulator(shape, multiplied)
                                    for _ in range(halves)])

            def operands(lhs_smem, rhs_smems):
                # The previous step's products are done (each step waits for its own): its
                # copies are free.
                left = (kernel_parts.converted(lhs_smem, lhs_copies.at[wg]) if converts_lhs
                        else lhs_smem)
                rights = []
                for half, rhs_smem in enumerate(rhs_smems):
                    right = (rhs_smem.at[pl.ds(wg * part, part), :] if transpose_rhs
                             else rhs_smem.at[:, pl.ds(wg * part, part)])
                    if converts_rhs:
                        right = kernel_parts.converted(right, rhs_copies.at[wg, half])
                    rights.append(right)
                if converts_lhs or converts_rhs:
                    plgpu.commit_smem()
                return left, rights

            def products(accs, left, rights):
                for acc, right in zip(accs, rights):
                    if transpose_rhs:
                        # (The interpreter's transposes share the warpgroup's scratch
                        # tile: each is used at once.)
                        right = kernel_parts.transposed_operand(right, scratch)
                    plgpu.wgmma(acc, left, right)

            @jax.named_scope(profiling.STEP)
            def plain_step(_, lhs_smem, *rest):
                rhs_smems, accs = rest[:-1], rest[-1]
                products(accs, *operands(lhs_smem, rhs_smems))
                plgpu.wgmma_wait(0)
                return accs

            @jax.named_scope(profiling.STEP)
            def scaled_step(_, lhs_smem, *rest):
                *smems, totals = rest
                rhs_smems, scale_smems = smems[:halves], smems[halves:]
                left, rights = operands(lhs_smem, rhs_smems)
                # The step's scale vectors: lhs's (when scaled), then each column tile's
                # rhs's, of which this compute warpgroup's columns scale its sums.
                column_smems = scale_smems[1:] if lhs_steps_ref is not None else scale_smems
                return scale_blocks.added_step(
                    totals, lambda accumulators: products(accumulators, left, rights), shape,
                    multiplied, None if lhs_steps_ref is None else lambda: scale_smems[0][...],
                    None if rhs_steps_ref is None else
                    lambda half: column_smems[half].at[pl.ds(wg * part, part)][...])

            @pl.when(group >= 0)
            def _compute():
                column_tiles = [n_tile + half * (n_half // bn) for half in range(halves)]
                rhs_views = kernel_parts.weight_views(rhs_ref.at[group], n_tile, halves, bn,
                                                      n_half, k_tiles * bk, transpose_rhs,
                                                      paired)
                pipeline(scaled_step if scaled else plain_step, context)(
                    lhs_ref.at[pl.ds(first_row, bm), :], *rhs_views,
                    *step_views(first_row, column_tiles, group), allocations=allocations)

            @pl.when((group == visits.FILL) & computing)
            def _fill():
                if existing_ref is None:
                    store(jnp.zeros(shape, out_ref.dtype))
                    return
                for piece in range(pieces):
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    plgpu.copy_gmem_to_smem(
                        existing_ref.at[pl.ds(first_row + piece * tile_rows, tile_rows),
                                        pl.ds(first_col, part)],
                        tile_smem, barrier)
                    plgpu.barrier_wait(barrier)
                    store_piece(piece)

        # The last stores complete before the kernel ends.
        plgpu.wait_smem_to_gmem(0)
