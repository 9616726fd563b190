"""Tilings cut to a call's scale blocks (scale_blocks.py): contraction steps that each lie
inside one block (`within_scale_block`), output tiles that each lie inside one
(`within_output_block`), and tiles refitted to shared memory where a call multiplies wider
types than its table key's (`within_blocks`)."""

from __future__ import annotations

import dataclasses

from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas.mosaic_gpu import block_rules, operand_types, shared_memory
from kernelhub._pallas.mosaic_gpu.block_rules import BlockConfig


def scale_steps_fit(problem: Problem, scale_block: int) -> bool:
    """Whether gmm's contraction steps can each lie inside one scale block of `scale_block`
    elements: a power of two dividing it is a legal block_k (block_rules.MIN_STEP_BYTES)."""
    return scale_block & -scale_block >= block_rules.min_contraction(problem)


def within_scale_block(config: BlockConfig, scale_block: int, problem: Problem,
                       weight_tiles: int = 1) -> BlockConfig:
    """`config` for a gmm whose steps are scaled (scale blocks along k, `scale_steps_fit`):
    block_k cut to a power of two dividing `scale_block`, so that each step lies inside one
    block of every scaled operand; each compute warpgroup's columns, then block_m, cut until a
    step's sums and the scaled totals together fit the heuristic's registers (2 x
    ACCUMULATOR_ELEMENTS: a 128 x 128 float32 total beside the step's sums would spill), so a
    warp-specialized tile of 128 x 256 becomes 128 x 128, two warpgroups of 64 columns, one
    scaling its step's sums while the other multiplies (gmm_warp_specialized.py); and stages,
    not below 2, until the step's scale vectors fit beside them. Cut whatever the tiling's
    source (a table tuned without scale blocks may name it), as the Triton kernels' blocks
    are; an upcast that the cut leaves converting tiles too small to convert
    (block_rules.conversion_problem: blocks of 32 along k of weights [G, k, n]) becomes a copy
    first (upcast=0), the blocks' doing as the cut is."""
    step = min(config.block_k, scale_block & -scale_block)
    if step < config.block_k and block_rules.conversion_problem(
            dataclasses.replace(config, block_k=step), problem) is not None:
        config = dataclasses.replace(config, upcast=False)
    block_m, columns = config.block_m, config.warpgroup_columns
    least = block_rules.min_columns(problem, config.compute_warpgroups)
    registers = block_rules.ACCUMULATOR_ELEMENTS
    while 2 * weight_tiles * block_m * columns > registers and columns > least:
        columns //= 2
    if 2 * weight_tiles * block_m * columns > registers:
        block_m = min(block_rules.OUTPUT_ROWS)
    return shared_memory.stages_that_fit(
        dataclasses.replace(config, block_m=block_m, block_k=step,
                            block_n=columns * config.compute_warpgroups, scaled_steps=True),
        problem, weight_tiles)


def output_block_fits(problem: Problem, output_block: int) -> bool:
    """Whether the output tiles can each lie inside one scale block of `output_block` output
    columns (gmm's weights) or rows (tgmm's lhs): a power of two dividing it is a legal
    block_n, or tgmm's block_k."""
    if problem.kernel is Kernel.TGMM:
        least = min(block_rules.OUTPUT_ROWS)
    else:
        least = block_rules.min_columns(problem)
    return output_block & -output_block >= least


def within_output_block(config: BlockConfig, output_block: int, problem: Problem
                        ) -> BlockConfig:
    """`config` for a call whose scale blocks run along the output tile (`output_block_fits`):
    gmm's block_n, or tgmm's block_k, cut to a power of two dividing the block, so that an
    output tile's columns (rows) share their scales along the contraction; one compute
    warpgroup, a warp-specialized tiling keeping a warpgroup's columns (the warp-specialized
    bodies scale no tiles); tgmm one group a work item (group_span 1) and its 8-bit lhs
    converted per chunk (upcast), where the scales are applied; stages cut, not below 2, until
    the scaled float32 copies of the lhs tiles fit. Cut whatever the tiling's source, as
    `within_scale_block`."""
    block = output_block & -output_block
    cut = dict(compute_warpgroups=1, scaled_lhs_tiles=True)
    if problem.kernel is Kernel.TGMM:
        cut.update(block_k=min(config.block_k, block), block_n=config.warpgroup_columns,
                   group_span=1, upcast=True)
    else:
        cut.update(block_n=min(config.warpgroup_columns, block))
    return shared_memory.stages_that_fit(dataclasses.replace(config, **cut), problem)


def within_blocks(config: BlockConfig, problem: Problem, weight_tiles: int,
                  scale_block: int | None, output_block: int | None,
                  wider_than_key: bool) -> BlockConfig:
    """`config` cut to a call's scale blocks along the contraction (`scale_block`) and along
    the output tile (`output_block`), each None where the call has none; where its tiles are
    wider than its table key's types (`wider_than_key`), refitted to shared memory."""
    if scale_block is not None:
        config = within_scale_block(config, scale_block, problem, weight_tiles)
    if output_block is not None:
        config = within_output_block(config, output_block, problem)
    if not wider_than_key:
        return config
    if config.upcast and not operand_types.upcast_applies(problem):
        # An upcast for the key's types, which the widened tiles do not take.
        config = dataclasses.replace(config, upcast=None)
    return _fitting(config, problem, weight_tiles)


def _fitting(config: BlockConfig, problem: Problem, weight_tiles: int) -> BlockConfig:
    """`config` with fewer stages (not below 2), then its contraction block halved (a power of
    two dividing the scale block still), its programs per SM cut, its columns and output rows
    halved, until shared memory holds it: a call with scale blocks multiplies wider tiles than
    its key's types (float32 copies of 8-bit tiles, a float32 cotangent, operands widened
    first), which a table's tiling for that key did not count."""
    contraction = block_rules.contraction_block(problem.kernel)
    rows = block_rules.output_rows_block(problem.kernel)
    least_columns = (block_rules.min_columns(problem, config.compute_warpgroups)
                     * config.compute_warpgroups)
    config = shared_memory.stages_that_fit(config, problem, weight_tiles)
    while not shared_memory.fits(config, problem, weight_tiles):
        if getattr(config, contraction) // 2 >= block_rules.min_contraction(problem):
            config = dataclasses.replace(config,
                                         **{contraction: getattr(config, contraction) // 2})
        elif config.programs_per_sm > 1:
            config = dataclasses.replace(config, programs_per_sm=config.programs_per_sm - 1)
        elif config.block_n // 2 >= least_columns:
            config = dataclasses.replace(config, block_n=config.block_n // 2)
        elif getattr(config, rows) > min(block_rules.OUTPUT_ROWS):
            config = dataclasses.replace(config, **{rows: min(block_rules.OUTPUT_ROWS)})
        else:
            return config
        config = shared_memory.stages_that_fit(config, problem, weight_tiles)
    return config
