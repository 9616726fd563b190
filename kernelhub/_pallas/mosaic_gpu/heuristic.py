"""The tiles a Mosaic GPU call gets when no tiling names them: chosen from shapes and dtypes
only, never group sizes, and fitted to the problem (`fitted`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas.mosaic_gpu import block_rules, operand_types, roofline, shared_memory
from kernelhub._pallas.mosaic_gpu.block_rules import BlockConfig

# The warp-specialized tile the heuristic gives a compute-bound call: 128 output rows by 256
# columns, 128 a compute warpgroup (`roofline.compute_bound`, `_warp_specialized`).
WIDE_ROWS, WIDE_COLUMNS = 128, 256
# Its stages at most: what the tables' warp-specialized tiling ran on the H100 (2026-11-28), and so
# a deeper pipeline never takes the place of whole output tiles (`shared_memory.output_tile_rows`).
WIDE_STAGES = 3


def heuristic(problem: Problem, weight_tiles: int = 1, warp_specialize: bool = True
              ) -> BlockConfig:
    """Output tiles of 64 rows when a group's expected rows fit them (fine-grained MoE: a 64-row
    group does not pay for a half-empty 128-row tile), else 128; 128 columns; one 128-byte row of
    contraction per step; 4 stages in flight (at most 128 KiB of shared memory). Each block then
    shrinks to the problem. A compute-bound call is warp-specialized in 128 x 256 tiles where they
    fit (`_warp_specialized`). A tgmm whose groups' expected rows fill at most two steps, with work
    for two programs on every SM, runs two per SM in 2 or 3 stages (`_shared_sm_tgmm`).
    `weight_tiles`: 2 for a gated unit's gmm. `warp_specialize=False` keeps one compute warpgroup:
    interpret mode's, which is for numerics, and which runs a warp-specialized program only where
    XLA's CPU client has threads for its warpgroups (`config.check_interpretable`), not on a small
    host by default."""
    width = operand_types.operand_bytes(problem)
    contraction = block_rules.SWIZZLE_BYTES // width
    rows_per_group = problem.m / max(problem.num_groups, 1)
    if problem.kernel is Kernel.TGMM:
        blocks = BlockConfig(block_m=contraction, block_k=128 if problem.k >= 128 else 64,
                             block_n=128)
        if problem.static and rows_per_group <= 2 * contraction:
            shared = _shared_sm_tgmm(blocks, problem)
            if shared is not None:
                return shared
    else:
        block_m = 64 if rows_per_group <= 64 else 128
        columns = block_rules.ACCUMULATOR_ELEMENTS // (weight_tiles * block_m)
        blocks = BlockConfig(block_m=block_m, block_k=contraction, block_n=min(128, columns))
    wide = _warp_specialized(blocks, problem, weight_tiles) if warp_specialize else None
    return wide or fitted(blocks, problem, weight_tiles)


def _warp_specialized(blocks: BlockConfig, problem: Problem,
                      weight_tiles: int) -> BlockConfig | None:
    """For a compute-bound call (`roofline.compute_bound`), two compute warpgroups of 128 x 128
    float32 sums, one 128 x 256 output tile, in as many stages as fit (3 of 16-bit values): each
    step's tiles feed twice the multiply-adds of a 128 x 128 tile, and one warpgroup's loads are
    waited for while the other multiplies. On the H100 (2026-11-28) Mixtral's forward and lhs
    gradient ran at .64 and .67 of the roofline so, against .54 in 128 x 128 tiles. A float32 output
    is stored in 64-row pieces (`shared_memory.output_tile_rows`). A gated unit's tile is 128 x 128,
    each compute warpgroup summing its 64 columns of the gate and of the up projection. None where
    the problem is not compute-bound, is smaller than the tile, or the stages (at least 2) and
    output tiles do not fit shared memory."""
    if not roofline.compute_bound(problem):
        return None
    rows = block_rules.output_rows_block(problem.kernel)
    # A gated unit's two sums share a warpgroup's registers: 128 x 128 output tiles.
    columns = WIDE_COLUMNS // weight_tiles
    wide = fitted(dataclasses.replace(blocks, **{rows: WIDE_ROWS}, block_n=columns,
                                      stages=WIDE_STAGES, compute_warpgroups=2), problem,
                  weight_tiles)
    wide = shared_memory.stages_that_fit(wide, problem, weight_tiles)
    if (getattr(wide, rows), wide.block_n) != (WIDE_ROWS, columns):
        return None
    if not shared_memory.fits(wide, problem, weight_tiles):
        return None
    return wide


def _shared_sm_tgmm(blocks: BlockConfig, problem: Problem) -> BlockConfig | None:
    """Two tgmm programs per SM, for groups of one or two chunks: each work item's pipeline
    has nothing to overlap its first load with, so another program's loads fill the wait (the
    H100 tune of 2026-11-27: 1.30x at DeepSeek-V3, 1.14x at Qwen3-MoE, 1.62x at GPT-OSS, with
    128 output rows in 2 stages or 64 in 3). None where the output tiles are fewer than two per
    SM, or neither fits half the shared memory."""
    for rows, stages in ((blocks.block_k, 2), (64, 3)):
        shared = fitted(dataclasses.replace(blocks, block_k=rows, stages=stages,
                                            programs_per_sm=2), problem)
        if shared.block_k != rows:
            continue  # fitted to fewer rows (GPT-OSS's 2880): the next, deeper, is that one
        tiles = (problem.local_groups * -(-problem.k // shared.block_k)
                 * -(-problem.n // shared.block_n))
        if tiles < 2 * block_rules.HOPPER_SMS:
            return None
        if shared_memory.fits(shared, problem):
            return shared
    return None


def fitted(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> BlockConfig:
    """`config` with each block but the output rows cut to the smallest power of two covering
    its dimension (at least its rule's least), 64 output rows where 64 cover them, and fewer
    stages where shared memory needs it. A dimension longer than its block and not a multiple
    of it takes the largest smaller block that divides it, down to the rule's least (k and n,
    not m): the kernels pad operands to whole tiles, and at GPT-OSS's 2880 a 128 block padded
    the whole weights (the lhs gradient) or the whole [G, k, n] output (tgmm), a copy that
    cost more than the kernel (the 2026-11-27 H100 scoreboard: 0.25 of the roofline against
    0.66). A gated unit (`weight_tiles` 2) pads each half of the weights' columns, so its
    columns' block divides the output's columns, half the weights' (GPT-OSS's 2 x 2880)."""
    sizes = {"block_m": problem.m, "block_k": problem.k,
             "block_n": problem.n // weight_tiles}
    rows = block_rules.output_rows_block(problem.kernel)
    least = {block_rules.contraction_block(problem.kernel): block_rules.min_contraction(problem),
             "block_n": (block_rules.min_columns(problem, config.compute_warpgroups)
                         * config.compute_warpgroups),
             rows: min(block_rules.OUTPUT_ROWS)}
    fitted_blocks = {}
    for name, size in sizes.items():
        block = getattr(config, name)
        floor = least.get(name, block_rules.MIN_BLOCK)
        if name == rows:
            block = 64 if size <= 64 else block
        else:
            block = max(floor, min(block, block_rules.next_power_of_two(size)))
        if name != "block_m":
            # Padding m copies activations only (gmm's lhs and output rows, tgmm's operands'
            # rows), less than smaller tiles would cost a compute-bound kernel: block_m keeps
            # its size. k and n also pad the weights or tgmm's [G, k, n] output.
            block = _dividing(block, size, floor)
        fitted_blocks[name] = block
    span = min(config.group_span, max(int(problem.local_groups), 1))
    return shared_memory.stages_that_fit(
        dataclasses.replace(config, **fitted_blocks, group_span=span), problem, weight_tiles)


def _dividing(block: int, size: Any, floor: int) -> int:
    """The largest power of two from `block` down to `floor` that divides `size`, where `size`
    spans more than one block and `block` does not divide it; else `block`."""
    if not is_static(size) or size <= block or size % block == 0:
        return block
    smaller = block // 2
    while smaller >= floor:
        if size % smaller == 0:
            return smaller
        smaller //= 2
    return block
