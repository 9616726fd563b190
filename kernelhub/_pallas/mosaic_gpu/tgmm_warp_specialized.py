"""tgmm's body with warp specialization: the tiling's fifth entry, `compute_warpgroups=2`.

The same work as transposed_grouped_matmul.py's body ((group, k-tile, n-tile) output tiles on a
persistent grid, each summing its group's chunks, tgmm_chunks.py), split between three
warpgroups of each program:
- the memory warpgroup issues the TMA loads of each chunk's lhs and rhs tiles, `stages`
  chunks ahead, and goes on to the next tile's loads while this one is stored;
- each of the two compute warpgroups multiplies the chunks into its own float32 accumulator,
  [block_k, block_n / 2]: its half of the output tile's columns, and stores that half by TMA
  (plus existing_out's, when given), the store left in flight while it sums its next tile
  (in 64-row pieces where whole tiles do not fit beside the pipeline: a float32 output's).

Why: where a group's rows are many (Mixtral: 1024 a group), tgmm is bound by wgmma, and one
warpgroup's registers hold at most a 128 x 128 float32 sum, whose chunk brings 64 bytes of
tiles per 64 multiply-adds of a row; two warpgroups share the lhs tile of a 128 x 256 output
tile, which halves that per product, and one waits on its loads while the other multiplies.

A chunk holding rows its group does not sum (only a group's first and last can) is masked in
shared memory by both compute warpgroups, each setting every such row of both tiles to zero:
they write the same values, so neither depends on the other having finished, and each reads
the tiles only after its own writes (a NaN in another group's row stays out of both halves).
Shared memory is allocated once for the program: the pipeline's buffers, an output tile and a
barrier per compute warpgroup (and, interpreted, a tile per compute warpgroup to transpose the
lhs through).
"""

from __future__ import annotations

import functools

import jax

from kernelhub._pallas.mosaic_gpu import block_rules, kernel_parts, profiling
from kernelhub._pallas.mosaic_gpu.tgmm_chunks import ChunkLayout
from kernelhub._pallas.mosaic_gpu.kernel_parts import (COMPUTE_WARPGROUPS, MEMORY_REGISTERS,
                                                       WG_AXIS)


def body(bounds_ref, lhs_ref, rhs_ref, *refs, blocks: block_rules.BlockConfig, groups: int,
         rows_padded: int, k_tiles: int, n_tiles: int, layout: ChunkLayout,
         existing: kernel_parts.Existing, interpret: bool, tile_rows: int) -> None:
    """The kernel body; arguments as transposed_grouped_matmul._body's, `tile_rows` the rows
    of each compute warpgroup's output tile (shared_memory.output_tile_rows: block_k, or a piece of
    it stored after another)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    existing_ref, out_ref = kernel_parts.tgmm_output_refs(refs, existing)
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    part = bn // COMPUTE_WARPGROUPS  # each compute warpgroup's columns
    shape = (bk, part)
    stages = max(blocks.stages, 2)

    def pipeline(step, context, k_tile, n_tile, first_row_of, chunks):
        return plgpu.emit_pipeline_warp_specialized(
            step, grid=(chunks,), memory_registers=MEMORY_REGISTERS,
            in_specs=layout.specs(blocks, k_tile, n_tile, first_row_of, delay_release=0),
            wg_axis=WG_AXIS, num_compute_wgs=COMPUTE_WARPGROUPS,
            max_concurrent_steps=stages, compute_context=context)

    ignored = lambda *_, **__: None  # noqa: E731 - allocations do not depend on the body
    # The buffers depend on the blocks and dtypes only: a static grid of `stages` chunks
    # allocates as many slots as the per-tile pipelines (whose grids are dynamic) use.
    allocating = pipeline(ignored, ignored, 0, 0, lambda c: c * bm, stages)
    scoped = dict(
        allocations=allocating.get_allocations(lhs_ref, rhs_ref),
        tiles=plgpu.SMEM((COMPUTE_WARPGROUPS, tile_rows, part), out_ref.dtype),
        barriers=plgpu.Barrier(num_barriers=COMPUTE_WARPGROUPS),
        scratches=layout.scratch(blocks, lhs_ref.dtype, interpret, columns=part,
                                 copies=COMPUTE_WARPGROUPS),
    )

    @functools.partial(pl.run_scoped, **scoped, collective_axes=WG_AXIS)
    def _program(allocations, tiles, barriers, scratches):
        wg = jax.lax.axis_index(WG_AXIS)
        computing = wg < COMPUTE_WARPGROUPS
        tile_smem = tiles.at[wg]
        barrier = barriers.at[wg]
        own_scratch = None if scratches is None else scratches.at[wg]

        @plgpu.nd_loop((groups, k_tiles, n_tiles), collective_axes=kernel_parts.SM_AXIS)
        def _work(info):
            group, k_tile, n_tile = info.index
            end, chunks, rows_of = layout.group_chunks(bounds_ref, group, bm, rows_padded)

            def store(total):
                with jax.named_scope(profiling.STORE):
                    kernel_parts.store_tile(total, tile_smem, barrier, existing_ref, out_ref,
                                            group, k_tile * bk,
                                            pl.ds(n_tile * bn + wg * part, part))

            def context(run):
                def with_accumulator(acc):
                    with jax.named_scope(profiling.SUMS):
                        total = kernel_parts.sums(run(acc))
                    store(total)

                pl.run_scoped(with_accumulator, kernel_parts.accumulator(shape, lhs_ref.dtype))

            @jax.named_scope(profiling.STEP)
            def step(indices, lhs_smem, rhs_smem, acc):
                first_row, summed_from = rows_of(indices[0])
                tiles = layout.masked_tiles(lhs_smem, rhs_smem, first_row, summed_from, end,
                                            indices[0], interpret)
                left, right = layout.operands(*tiles, own_scratch, columns=(wg * part, part))
                plgpu.wgmma(acc, left, right)
                # The pipeline refills a chunk's buffers once both compute warpgroups are
                # past it (delay_release=0): this chunk's products are done here.
                plgpu.wgmma_wait(0)
                return acc

            @pl.when(chunks > 0)
            def _sum():
                pipeline(step, context, k_tile, n_tile, lambda c: rows_of(c)[0], chunks)(
                    lhs_ref, rhs_ref, allocations=allocations)

            if existing is not kernel_parts.Existing.IN_PLACE:
                # (In place, an empty group's tiles already hold existing_out's values.)
                @pl.when((chunks == 0) & computing)
                def _empty():
                    store(kernel_parts.wgmma_zeros(shape, interpret))

        # The last stores complete before the kernel ends.
        plgpu.wait_smem_to_gmem(0)
