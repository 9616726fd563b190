"""tgmm's body over spans of groups: the tiling's sixth entry, `group_span` > 1.

With one pipeline per (group, k-tile, n-tile), a fine-grained MoE's group (64 rows) gives the
pipeline one or two chunks: each work item waits out a whole load's latency and the stages
never overlap. Here a work item is (span, k-tile, n-tile), a span being `group_span`
consecutive local groups, and one `emit_pipeline` streams all of the span's chunks (each
group's own, tgmm_chunks.py: with 16-bit values they start at its first row): the loads of a
group's first chunks are in flight while the previous group's last ones are summed.

The running sum is the pipeline's carry, a float32 value in registers (int32 for int8 tiles,
exact across a group's chunks): each chunk's product comes from a wgmma into a fresh accumulator
and is added to it. At a group's first chunk the sum restarts from zeros (a select, so that no
NaN of the group before can leak in), and at its last chunk it is stored by TMA
(kernel_parts.store_tile, the store left in flight). An empty group gets one visit whose rows
are all masked, so its tile is stored as zeros. (One accumulator reset at each group's start
would save the adds, but Mosaic GPU's interpreter in jax 0.10.2 has no rule for storing into an
accumulator or for `pl.run_state`.) Each wgmma is waited for at its chunk; the loads of the next
`stages` chunks are in flight meanwhile.

The chunk table is computed on the device from group_sizes, with a static length (every chunk
of [0, m) once, plus one per group), so the launch never depends on the sizes' values.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernelhub._grouped_matmul.groups import running_sum
from kernelhub._pallas.mosaic_gpu import block_rules, kernel_parts, operand_types, profiling
from kernelhub._pallas.mosaic_gpu.tgmm_chunks import ChunkLayout

# Rows of the chunk table: a visit's group, the first row of its chunk's tiles, the rows
# [from, end) of the group it sums, 1 on the group's first visit (the sum starts from zeros)
# and on its last (its tile is stored).
GROUP, ROW, FROM, END, FIRST, LAST = range(6)


def chunk_tables(starts: jax.Array, ends: jax.Array, span: int, m_padded: int,
                 block_m: int, layout: ChunkLayout) -> tuple[jax.Array, jax.Array]:
    """(visits int32 [6, count], spans int32 [2, spans]): per visit the rows above; per span
    its visits [first, end). The chunks are `layout`'s (tgmm_chunks.py)."""
    groups = starts.shape[0]
    chunks = layout.chunk_count(starts, ends, block_m)
    visits = jnp.maximum(chunks, 1)
    # The groups are consecutive and none takes more chunks than the aligned ones it touches,
    # of which only a boundary's is counted twice: at most m_padded / block_m + groups - 1
    # chunks, and one visit more per empty group.
    count = m_padded // block_m + groups
    ends_v = jnp.minimum(running_sum(visits, limit=count), count)
    begins_v = ends_v - visits
    visit = jnp.arange(count, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(ends_v, visit, side="right", method="compare_all"),
                        groups - 1)
    # An empty group's one visit sums no row: [end, end).
    first_row, summed_from = layout.chunk_rows(starts[group], visit - begins_v[group], block_m,
                                               m_padded)
    empty = chunks[group] == 0
    table = jnp.stack([group, jnp.clip(first_row, 0, m_padded - block_m),
                       jnp.where(empty, ends[group], summed_from), ends[group],
                       (visit == begins_v[group]).astype(jnp.int32),
                       (visit == ends_v[group] - 1).astype(jnp.int32)]).astype(jnp.int32)
    first_group = jnp.arange(0, groups, span, dtype=jnp.int32)
    last_group = jnp.minimum(first_group + span, groups) - 1
    spans = jnp.stack([jnp.minimum(begins_v[first_group], ends_v[last_group]),
                       ends_v[last_group]]).astype(jnp.int32)
    return table, spans


def body(table_ref, spans_ref, lhs_ref, rhs_ref, *refs, blocks: block_rules.BlockConfig,
         spans: int, k_tiles: int, n_tiles: int, layout: ChunkLayout,
         existing: kernel_parts.Existing, interpret: bool) -> None:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    # (In place, an empty group's one visit adds its zeros to existing_out's tile: the same
    # values written back.)
    existing_ref, out_ref = kernel_parts.tgmm_output_refs(refs, existing)
    pl.run_scoped(functools.partial(_loop, table_ref, spans_ref, lhs_ref, rhs_ref, existing_ref,
                                    out_ref, blocks=blocks, spans=spans, k_tiles=k_tiles,
                                    n_tiles=n_tiles, layout=layout, interpret=interpret),
                  plgpu.SMEM((blocks.block_k, blocks.block_n), out_ref.dtype), plgpu.Barrier())


def _loop(table_ref, spans_ref, lhs_ref, rhs_ref, existing_ref, out_ref, tile_smem, barrier, *,
          blocks: block_rules.BlockConfig, spans: int, k_tiles: int, n_tiles: int,
          layout: ChunkLayout, interpret: bool) -> None:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bk, bn = blocks.block_k, blocks.block_n
    shape = (bk, bn)
    multiplied = layout.multiplied(lhs_ref.dtype)
    summed_in = jnp.dtype(operand_types.accumulator_dtype(multiplied))

    # Span outermost: the programs running at once read the same span's rows.
    @plgpu.nd_loop((spans, k_tiles, n_tiles), collective_axes=kernel_parts.SM_AXIS)
    def _work(info):
        span, k_tile, n_tile = info.index
        first_visit = spans_ref[0, span]
        visit_count = spans_ref[1, span] - first_visit

        def row_of(step):
            return table_ref[ROW, first_visit + step]

        def accumulate(scratch=None, **conversions):
            # The running sum in the accumulator's dtype: int8's stay exact across chunks.
            zeros = kernel_parts.wgmma_zeros(shape, interpret, summed_in)

            @jax.named_scope(profiling.STEP)
            def step(indices, lhs_smem, rhs_smem, running):
                visit = first_visit + indices[0]
                group = table_ref[GROUP, visit]
                tiles = layout.masked_tiles(
                    lhs_smem, rhs_smem, table_ref[ROW, visit], table_ref[FROM, visit],
                    table_ref[END, visit], indices[0], interpret, **conversions)
                left, right = layout.operands(*tiles, scratch)
                # All rows kept, or (a group's first chunk) none: zeros by a select.
                first_kept = jnp.where(table_ref[FIRST, visit] == 1, bk, 0)
                kept = kernel_parts.tile_iota(shape, 0, interpret) >= first_kept
                before = jnp.where(kept, running, jnp.zeros((), summed_in))

                def product(acc_ref):
                    plgpu.wgmma(acc_ref, left, right)
                    return acc_ref[...]

                total = before + pl.run_scoped(
                    product, kernel_parts.accumulator(shape, multiplied))

                @pl.when(table_ref[LAST, visit] == 1)
                @jax.named_scope(profiling.STORE)
                def _store():
                    kernel_parts.store_tile(total.astype(jnp.float32), tile_smem, barrier,
                                            existing_ref, out_ref, group, k_tile * bk,
                                            pl.ds(n_tile * bn, bn))

                return total

            @pl.when(visit_count > 0)
            @jax.named_scope(profiling.SUMS)
            def _sum():
                plgpu.emit_pipeline(
                    step,
                    grid=(visit_count,),
                    in_specs=layout.specs(blocks, k_tile, n_tile, row_of),
                    max_concurrent_steps=max(blocks.stages, 2),
                    init_carry=zeros,
                )(lhs_ref, rhs_ref)

        # (Interpreted, a transposing tile: the interpreter's wgmma takes no transposed view.)
        shared = layout.step_scratch(blocks, lhs_ref.dtype, rhs_ref.dtype, interpret)
        if shared:
            pl.run_scoped(lambda **tiles: accumulate(**tiles), **shared)
        else:
            accumulate()

    # The last store completes before the kernel ends.
    plgpu.wait_smem_to_gmem(0)
