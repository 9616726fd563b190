"""grouped_matmul as a Pallas Mosaic GPU kernel for Hopper (contract:
kernelhub/ops/grouped_matmul.py).

Work: (visit, n-tile) pairs, where a visit is one segment's share of one row tile (the visit
table of kernelhub/_grouped_matmul/visits.py, computed on the device: rows of one local group, or
rows of none). Row tiles start at each segment's first row rounded down to block_rules.ROW_ALIGN,
so a group of up to block_m - 7 rows reads its weights once wherever it starts. A persistent
grid of one program per SM walks the pairs (`plgpu.nd_loop`) in bands of BAND n-tiles
(`kernel_parts.banded_order`): the programs running at once read the same few weight tiles of
one group while its visits pass, so the weights come from HBM about once. Where a group's rows
fit one row tile a band spans every n-tile (band_width).

A visit of a local group multiplies its row tile by the group's weights: `plgpu.emit_pipeline`
keeps `stages` TMA loads of lhs and rhs tiles in flight while `wgmma` adds each k step into a
float32 accumulator in registers (int32 for int8 tiles: exact sums, read as float32 after the
last step). The fused epilogue (scales of quantized operands, bias, activation, gated unit) runs
there, on the accumulator; the tile then goes to shared memory and TMA stores only the visit's
rows (`kernel_parts.store_rows`), so a row tile shared by two groups is written once per row. A
visit of rows outside the local groups stores zeros. With existing_out the compiled kernel
updates its buffer in place (aliased) and such rows get no visit; in interpret mode, which takes
no aliased output, their visits copy existing_out's rows.

A gated unit sums two accumulators, gate and up columns, per output tile. Interleaved weights
[G, 2n, k] (transpose_rhs) are read in place, as rows of gate and up values side by side
(kernel_parts.paired_rows); interleaved [G, k, 2n] are first gathered into the concatenated
layout (a copy of the weights: their pairs are adjacent columns, which TMA cannot split).
float32, fp8 and int8 wgmma read both operands K-major from shared memory, so weights [G, k, n]
of those types are transposed to [G, n, k] first (a copy; store them that way,
transpose_rhs=True, to avoid it). For 8-bit values the tiling's `upcast` avoids the copy
instead (config.py): each step's two tiles are converted to float16 in shared memory and
multiplied on 16-bit wgmma, which reads B as stored, at half the 8-bit rate; the roofline picks
it where the weights' bytes, not the FLOPs, bound the call. An 8-bit operand beside a 16-bit
one (weight-only quantization) or of another 8-bit kind has no 8-bit wgmma: with `upcast` its
tiles alone are converted, to the other's type or float16, instead of the whole operand widened
before the kernel; beside float32 (a quantized call's lhs gradient, whose cotangent holds the
folded scales) to float32, for float32 wgmma, which reads the weights K-major as the lhs
gradient holds them ([G, k, n] read transposed).

Scale blocks of quantized operands (a step's sums scaled into totals, or lhs tiles scaled as
they are copied) are scale_blocks.py's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernelhub._grouped_matmul.epilogue import NO_EPILOGUE, Epilogue, KernelEpilogue
from kernelhub._grouped_matmul.problem import gmm_problem
from kernelhub._grouped_matmul import polynomial_erf, visits
from kernelhub._grouped_matmul.contraction_scales import take_scale_refs
from kernelhub._pallas.mosaic_gpu import (block_rules, config, gmm_warp_specialized, kernel_parts,
                                          operand_types, profiling, scale_blocks, shared_memory)
from kernelhub._pallas.mosaic_gpu.block_rules import round_up
from kernelhub._pallas.mosaic_gpu.kernel_parts import padded

# n-tiles per band of the schedule (the weights' tiles read at once), where a group's rows span
# several row tiles: the band's weight tiles stay in L2 while its row tiles pass.
BAND = 8
# Where a group's rows fit one row tile (at the mean group size) no weight tile is read twice,
# so a band keeps nothing in L2 for later and only splits the visits of the local groups into
# as many rounds as there are bands: the band spans every n-tile (whole rows of the weights).
# On the H100 (2026-11-28, benchmarks/gpu/) DeepSeek-V3's forward ran in 557 us so against 637
# in bands of 8 (the on-device profile, one call each). False: bands of BAND everywhere.
WHOLE_ROWS_FOR_ONE_TILE_GROUPS = True


def band_width(n_tiles: int, m: int, num_groups: int, block_m: int) -> int:
    """The n-tiles of one band of the schedule, for `m` rows over `num_groups` groups."""
    if WHOLE_ROWS_FOR_ONE_TILE_GROUPS and m <= num_groups * block_m:
        return n_tiles
    return min(BAND, n_tiles)


def raw_grouped_matmul(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                       existing_out, transpose_rhs, scales=None, output_blocks=None,
                       epilogue: KernelEpilogue = NO_EPILOGUE, *,
                       interpret: bool = False) -> jax.Array:
    """The forward kernel: arguments as the contract hands them on, no axis empty
    (kernelhub/_grouped_matmul/prologue.py). With a glu epilogue the output (and existing_out)
    has half of rhs's columns."""
    out_dtype = jnp.dtype(preferred_element_type)
    lhs, rhs, problem, plan = scale_blocks.planned(
        lhs, rhs, scales, output_blocks, transpose_rhs,
        lambda lhs, rhs: gmm_problem(lhs, rhs, group_sizes, out_dtype,
                                     existing_out is not None, transpose_rhs))
    spec = epilogue.spec
    blocks = config.from_tiling(tiling, problem, weight_tiles=2 if spec.glu is not None else 1,
                                interpret=interpret, scale_block=plan.scale_block,
                                output_block=plan.tile_block,
                                wider_than_key=plan.blocks_given)
    m, k, local_groups = problem.m, problem.k, problem.local_groups
    n_out = spec.output_columns(problem.n)
    halves = 2 if spec.glu is not None else 1
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n

    scale_arrays = functools.partial(scale_blocks.kernel_arrays, plan, transpose_rhs)
    if blocks.upcast:
        # Both are read as stored and the 8-bit tiles converted in shared memory (beside float32
        # weights [G, k, n] to float32 tiles, which wgmma reads K-major: those weights are
        # transposed below, as without upcast).
        dtype = operand_types.converted_dtype(lhs.dtype, rhs.dtype)
        lhs, rhs = operand_types.read_as(lhs), operand_types.read_as(rhs)
    else:
        dtype = operand_types.kernel_dtype(lhs.dtype, rhs.dtype, k)
        lhs, rhs = lhs.astype(dtype), rhs.astype(dtype)
    if dtype.name in operand_types.K_MAJOR_ONLY and not transpose_rhs:
        rhs, transpose_rhs = jnp.swapaxes(rhs, 1, 2), True
    columns_axis, k_axis = (1, 2) if transpose_rhs else (2, 1)
    vectors = [v.astype(jnp.float32) for v in epilogue.column_vectors]
    # Interleaved weights [G, 2n, k] are read in place (`paired`); [G, k, 2n] are gathered
    # into the concatenated layout. The epilogue's vectors are always gathered (small).
    paired = spec.interleaved and transpose_rhs
    if spec.interleaved:
        if not paired:
            rhs = kernel_parts.concatenated(rhs, columns_axis)
        vectors = [kernel_parts.concatenated(v, 1) for v in vectors]

    m_p, k_p, n_p = round_up(m, bm), round_up(k, bk), round_up(n_out, bn)
    # Compiled, the rows are padded only to a multiple of ROW_ALIGN (Mosaic GPU cuts them in
    # groups of 8), not to whole row tiles: TMA fills a tile's reads past the last row with
    # zeros (rows whose products are never stored), and the stores write only each visit's
    # rows, all below m. Padding to block_m copied the whole activations and the whole output
    # at any m not a multiple of it (a serving batch's); now only an m that is not a multiple
    # of 8 is copied, and with 8 experts a token none is. At least one whole tile, so that no
    # TMA box is larger than the array (a few rows' copy). The interpreter reads past an
    # array's end as an error: there the rows are padded to whole tiles.
    rows = m_p if interpret else max(round_up(m, block_rules.ROW_ALIGN), bm)
    lhs = padded(lhs, {0: rows, 1: k_p})
    rhs = padded(rhs, {k_axis: k_p})
    rhs = (kernel_parts.paired_rows(rhs, n_p) if paired else
           kernel_parts.halves_padded(rhs, columns_axis, halves, n_p))
    vectors = [kernel_parts.halves_padded(v, 1, halves, n_p) for v in vectors]
    scale_arrays = scale_arrays(k_p // bk, bk, m_p, k_p, halves, n_p, spec.interleaved)
    row_scale = () if epilogue.row_scale is None else (
        padded(epilogue.row_scale.astype(jnp.float32), {0: m_p}),)
    existing = None if existing_out is None else padded(existing_out, {0: rows, 1: n_p})
    # Compiled, the output is existing_out's buffer (aliased) and rows of no local group get no
    # visit. The interpreter takes no aliased output: there those rows' visits copy them.
    aliased = existing is not None and not interpret
    table = visits.visit_table(group_sizes, group_offset, local_groups, m, bm,
                               fill_uncomputed=not aliased, row_align=block_rules.ROW_ALIGN)
    num_visits = table.shape[1]
    n_tiles = n_p // bn
    band = band_width(n_tiles, m, problem.num_groups, bm)
    shared = dict(
        blocks=blocks, k_tiles=k_p // bk, n_tiles=n_tiles, num_visits=num_visits,
        n_half=n_p, halves=halves, transpose_rhs=transpose_rhs, paired=paired, spec=spec,
        plain=epilogue.is_identity, has_row_scale=bool(row_scale),
        has_column_scale=epilogue.column_scale is not None, has_bias=epilogue.bias is not None,
        has_existing=existing is not None and not aliased, interpret=interpret, band=band)
    if blocks.compute_warpgroups == 1:
        body = functools.partial(_body, **shared, plan=plan)
    else:
        body = functools.partial(
            gmm_warp_specialized.body, **shared, plan=plan, epilogue_fn=_epilogue,
            tile_rows=shared_memory.output_tile_rows(blocks, problem, 1 if spec.glu is None else 2))
    copied = () if existing is None or aliased else (existing,)
    out = kernel_parts.launch(body, (table, lhs, rhs, *scale_arrays, *row_scale, *vectors,
                                     *copied),
                              (rows, n_p), out_dtype, interpret, "kernelhub_grouped_matmul",
                              starting_as=existing if aliased else None,
                              warp_specialized=blocks.compute_warpgroups > 1,
                              programs_per_sm=blocks.programs_per_sm)
    return out if (rows, n_p) == (m, n_out) else out[:m, :n_out]


def _body(table_ref, lhs_ref, rhs_ref, *refs, blocks: block_rules.BlockConfig, k_tiles: int,
          n_tiles: int, num_visits: int, n_half: int, halves: int, transpose_rhs: bool,
          paired: bool, spec: Epilogue, plain: bool, has_row_scale: bool, has_column_scale: bool,
          has_bias: bool, has_existing: bool, interpret: bool, band: int,
          plan: scale_blocks.Plan = scale_blocks.NOTHING) -> None:
    """The kernel body with one compute warpgroup. With scale blocks (`plan`) their arrays
    come first in `refs` (scale_blocks.kernel_arrays)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    lhs_steps_ref, rhs_steps_ref, tile_scales_ref, refs = take_scale_refs(
        refs, *plan.scales.operand_blocks, plan.tile_block)
    row_scale_ref, column_scale_ref, bias_ref, existing_ref, out_ref = (
        kernel_parts.gmm_operand_refs(refs, has_row_scale, has_column_scale, has_bias,
                                      has_existing))
    bm, bn = blocks.block_m, blocks.block_n
    shape = (bm, bn)
    multiplied = operand_types.multiplied_dtype(blocks.upcast, lhs_ref.dtype, rhs_ref.dtype)

    @plgpu.nd_loop((num_visits * n_tiles,), collective_axes=kernel_parts.SM_AXIS)
    def _work(info):
        visit, n_tile = kernel_parts.banded_order(info.index[0], num_visits, n_tiles, band)
        group, first_row, start, end = kernel_parts.visit_rows(table_ref, visit)
        first_col = n_tile * bn

        def store(result):
            def scope(tile_smem):
                tile_smem[...] = result
                plgpu.commit_smem()
                kernel_parts.store_rows(
                    tile_smem,
                    lambda row, rows: out_ref.at[pl.ds(first_row + row, rows),
                                                 pl.ds(first_col, bn)],
                    start - first_row, end - start, bm)

            pl.run_scoped(scope, plgpu.SMEM(shape, out_ref.dtype))

        @pl.when(group >= 0)
        def _compute():
            # Column tiles that this output tile sums, in the concatenated layout of the
            # scales (and of the weights, unless paired): its own, and for a gated unit the
            # up half's (n_half columns further).
            column_tiles = [n_tile + half * (n_half // bn) for half in range(halves)]
            with jax.named_scope(profiling.SUMS):
                multiply = functools.partial(
                    _multiply, rows_lhs_ref=lhs_ref.at[pl.ds(first_row, bm), :],
                    rhs_views=kernel_parts.weight_views(
                        rhs_ref.at[group], n_tile, halves, bn, n_half, k_tiles * blocks.block_k,
                        transpose_rhs, paired),
                    column_tiles=column_tiles,
                    blocks=blocks, k_tiles=k_tiles, transpose_rhs=transpose_rhs,
                    multiplied=multiplied, interpret=interpret,
                    tile_scales=None if tile_scales_ref is None else tile_scales_ref.at[
                        group, jax.lax.div(first_col, jnp.int32(plan.tile_block))])
                if blocks.scaled_steps:
                    # Each step's sums are scaled into totals carried in registers.
                    totals = multiply(
                        (None,) * halves,
                        step_scales=(
                            None if lhs_steps_ref is None else
                            lhs_steps_ref.at[:, pl.ds(first_row, bm)],
                            None if rhs_steps_ref is None else rhs_steps_ref.at[group]))
                else:
                    totals = pl.run_scoped(
                        lambda *accs: multiply(accs),
                        *[kernel_parts.accumulator(shape, multiplied)
                          for _ in range(halves)])
            if plain:
                (result,) = totals
            else:
                row_scale = None if row_scale_ref is None else kernel_parts.load_vector(
                    row_scale_ref.at[pl.ds(first_row, bm)], (bm,), jnp.float32)

                def columns(ref, half):
                    return kernel_parts.load_vector(
                        ref.at[group, pl.ds(first_col + half * n_half, bn)], (bn,),
                        jnp.float32)

                result = _epilogue(spec, totals, shape, row_scale,
                                   None if column_scale_ref is None else functools.partial(
                                       columns, column_scale_ref),
                                   None if bias_ref is None else functools.partial(
                                       columns, bias_ref))
            with jax.named_scope(profiling.STORE):
                store(result.astype(out_ref.dtype))

        @pl.when(group == visits.FILL)
        def _fill():
            if existing_ref is None:
                store(jnp.zeros(shape, out_ref.dtype))
                return

            def scope(tile_smem, barrier):
                plgpu.copy_gmem_to_smem(
                    existing_ref.at[pl.ds(first_row, bm), pl.ds(first_col, bn)], tile_smem,
                    barrier)
                plgpu.barrier_wait(barrier)
                kernel_parts.store_rows(
                    tile_smem,
                    lambda row, rows: out_ref.at[pl.ds(first_row + row, rows),
                                                 pl.ds(first_col, bn)],
                    start - first_row, end - start, bm)

            pl.run_scoped(scope, plgpu.SMEM(shape, out_ref.dtype), plgpu.Barrier())


def _multiply(accs, rows_lhs_ref, rhs_views, column_tiles, blocks: block_rules.BlockConfig,
              k_tiles: int, transpose_rhs: bool, multiplied, interpret: bool,
              step_scales=(None, None), tile_scales=None):
    """The float32 sums of the row tile times each of `rhs_views` (the group's weights for one
    accumulator's columns, kernel_parts.weight_views; `column_tiles` their tiles among the
    scales' columns), k step by k step through a TMA pipeline into wgmma, which multiplies the
    `multiplied` dtype (an operand of another is converted per step). With scaled steps
    (blocks.scaled_steps) `accs` are None: each step's sums go to accumulators of its own,
    scaled by the step's vectors (`step_scales`: views [k steps, block_m] of lhs's and
    [k steps, n] of the group's rhs's, each None when that operand has no scale blocks) and
    added to float32 totals. With `tile_scales` (a view [k] of the weights' scales for the
    output tile's column block) each step's lhs tile is multiplied by its scales as it is
    copied to shared memory."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    multiply = functools.partial(_multiply_with, accs, rows_lhs_ref, rhs_views,
                                 column_tiles, blocks, k_tiles, transpose_rhs, multiplied,
                                 interpret, step_scales, tile_scales)
    scoped = {}
    # Two copies of each tile a step converts (an 8-bit one under upcast, an lhs tile scaled
    # by its output tile's block): wgmma reads one while the next step converts into the
    # other.
    if rows_lhs_ref.dtype != multiplied or tile_scales is not None:
        scoped["lhs_converted"] = plgpu.SMEM((2, bm, bk), multiplied)
    if rhs_views[0].dtype != multiplied:
        tile = (bn, bk) if transpose_rhs else (bk, bn)
        scoped["rhs_converted"] = plgpu.SMEM((len(accs), 2, *tile), multiplied)
    if transpose_rhs and interpret:
        scoped["scratch"] = plgpu.SMEM((bk, bn), multiplied)
    return pl.run_scoped(lambda **refs: multiply(**refs), **scoped) if scoped else multiply()


def _multiply_with(accs, rows_lhs_ref, rhs_views, column_tiles,
                   blocks: block_rules.BlockConfig, k_tiles: int, transpose_rhs: bool, multiplied,
                   interpret: bool, step_scales, tile_scales, scratch=None,
                   lhs_converted=None, rhs_converted=None):
    """`_multiply`'s pipeline; `scratch` as kernel_parts.transposed_operand takes it; with
    upcast, `lhs_converted` [2, bm, bk] and `rhs_converted` [accumulators, 2, <weight tile>]
    receive the 8-bit tiles of a step converted (None: that operand is multiplied as
    stored), `lhs_converted` also the lhs tile scaled by `tile_scales`."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    shape = (bm, bn)
    halves = len(column_tiles)
    lhs_steps, rhs_steps = step_scales

    def converted(tile_smem, copies, index, scale=None):
        # The previous step's wgmma, which read the other copy, is done (the wait below), and
        # this step's may read this one while the next step converts.
        return kernel_parts.converted(tile_smem, copies.at[jax.lax.rem(index, 2)], scale)

    def operands(indices, lhs_smem, rhs_smems, tile_scale_smem=None):
        left = (lhs_smem if lhs_converted is None else
                converted(lhs_smem, lhs_converted, indices[0],
                          None if tile_scale_smem is None else tile_scale_smem[...]))
        rights = (rhs_smems if rhs_converted is None else
                  [converted(rhs_smem, rhs_converted.at[half], indices[0])
                   for half, rhs_smem in enumerate(rhs_smems)])
        if lhs_converted is not None or rhs_converted is not None:
            plgpu.commit_smem()
        return left, rights

    def products(accumulators, left, rights):
        for acc, right in zip(accumulators, rights):
            # (The interpreter's transposes share one scratch tile: each is used at once.)
            if transpose_rhs:
                right = kernel_parts.transposed_operand(right, scratch)
            plgpu.wgmma(acc, left, right)

    @jax.named_scope(profiling.STEP)
    def step(indices, lhs_smem, *smems):
        left, rights = operands(indices, lhs_smem, smems[:halves], *smems[halves:])
        products(accs, left, rights)
        # This step's products stay in flight; the previous step's are done, so the pipeline
        # may refill their buffers (delay_release=1) after this step.
        plgpu.wgmma_wait(len(accs))

    @jax.named_scope(profiling.STEP)
    def scaled_step(indices, lhs_smem, *refs_and_totals):
        *smems, totals = refs_and_totals
        rhs_smems, scale_smems = smems[:halves], smems[halves:]
        left, rights = operands(indices, lhs_smem, rhs_smems)
        # The step's scale vectors: lhs's (when scaled), then each column tile's rhs's.
        column_smems = scale_smems[1:] if lhs_steps is not None else scale_smems
        return scale_blocks.added_step(
            totals, lambda accumulators: products(accumulators, left, rights), shape,
            multiplied, None if lhs_steps is None else lambda: scale_smems[0][...],
            None if rhs_steps is None else lambda half: column_smems[half][...])

    # wgmma reads a step's tiles until the next step's wait: the pipeline refills them one step
    # later. Converted tiles are read once, before the step ends, and free at once, as are
    # scaled steps' (their sums are read in the step).
    scaled = blocks.scaled_steps
    lhs_delay = 1 if lhs_converted is None and not scaled else 0
    rhs_delay = 1 if rhs_converted is None and not scaled else 0

    rhs_spec = (plgpu.BlockSpec((bn, bk), lambda i: (0, i), delay_release=rhs_delay)
                if transpose_rhs else
                plgpu.BlockSpec((bk, bn), lambda i: (i, 0), delay_release=rhs_delay))
    in_specs = [plgpu.BlockSpec((bm, bk), lambda i: (0, i), delay_release=lhs_delay),
                *[rhs_spec] * halves]
    operand_refs = [rows_lhs_ref, *rhs_views]
    if tile_scales is not None:
        in_specs.append(plgpu.BlockSpec((bk,), lambda i: (i,)))
        operand_refs.append(tile_scales)
    if not scaled:
        plgpu.emit_pipeline(step, grid=(k_tiles,), in_specs=in_specs,
                            max_concurrent_steps=max(blocks.stages, 2))(*operand_refs)
        return tuple(kernel_parts.sums(acc) for acc in accs)
    # A step's scale vectors: lhs's for the row tile, rhs's for each column tile.
    if lhs_steps is not None:
        in_specs.append(plgpu.BlockSpec((None, bm), lambda i: (i, 0)))
        operand_refs.append(lhs_steps)
    if rhs_steps is not None:
        in_specs += [plgpu.BlockSpec((None, bn), lambda i, c=c: (i, c)) for c in column_tiles]
        operand_refs += [rhs_steps] * halves
    zeros = tuple(kernel_parts.wgmma_zeros(shape, interpret) for _ in range(halves))
    return plgpu.emit_pipeline(scaled_step, grid=(k_tiles,), in_specs=in_specs,
                               max_concurrent_steps=max(blocks.stages, 2),
                               init_carry=zeros)(*operand_refs)


def _epilogue(spec: Epilogue, totals, shape, row_scale, column_scale, bias) -> jax.Array:
    """The float32 output tile from each accumulator's sums: the row and column scales of
    quantized operands, the group's bias, then the activation or the gate of (gate, up).
    `column_scale` and `bias` load the group's vector for a half (0: gate or the only one)."""
    finished = []
    for half, total in enumerate(totals):
        if row_scale is not None:
            total = total * kernel_parts.broadcast_rows(row_scale, shape)
        if column_scale is not None:
            total = total * kernel_parts.broadcast_columns(column_scale(half), shape)
        if bias is not None:
            total = total + kernel_parts.broadcast_columns(bias(half), shape)
        finished.append(total)
    if spec.glu is None:
        return spec.activate(finished[0], erf=polynomial_erf.erf)
    return spec.gated(*finished, erf=polynomial_erf.erf)
