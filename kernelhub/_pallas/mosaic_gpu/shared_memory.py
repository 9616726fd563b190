"""What a Mosaic GPU kernel's blocks take of Hopper's shared memory.

The pipeline's stages of operand tiles (and, with `upcast`, the converted copies; with scale
blocks, each step's scale vectors) and the output tile fit one block's 227 KiB, or a
program's share of the SM where several run on one (`programs_per_sm`). Where they do not, the
stages are cut (`stages_that_fit`), and a warp-specialized kernel keeps its output tiles in
64-row pieces (`output_tile_rows`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas import four_bit_bits
from kernelhub._pallas.mosaic_gpu import block_rules, operand_types
from kernelhub._pallas.mosaic_gpu.block_rules import BlockConfig

# Shared memory one block may take on Hopper (227 KiB), and what the kernels take beside the
# pipeline and the output tile (barriers, the epilogue's vectors).
SHARED_MEMORY_BYTES = 232448
# An SM's shared memory (228 KiB), of which the hardware reserves 1 KiB per resident block:
# what each of several programs per SM may take.
SM_SHARED_MEMORY_BYTES = 233472
BLOCK_RESERVED_BYTES = 1024
SHARED_MEMORY_SLACK = 4096
# Mosaic GPU places each shared-memory allocation at a multiple of this many bytes.
SMEM_ALIGNMENT = 1024


def limit(config: BlockConfig) -> int:
    """The shared memory one program may take: a block's most, or its share of the SM."""
    if config.programs_per_sm == 1:
        return SHARED_MEMORY_BYTES
    return SM_SHARED_MEMORY_BYTES // config.programs_per_sm - BLOCK_RESERVED_BYTES


def needed(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> int:
    """What a kernel with these blocks allocates at its peak, SHARED_MEMORY_SLACK included:
    the pipeline (`_pipeline_bytes`) and the output tile. tgmm keeps its output tile beside
    the pipeline (its store stays in flight); gmm's takes the pipeline's place once the sums
    are done, but for warp specialization, where the compute warpgroups' tiles stay beside it
    (`output_tile_rows` of their rows)."""
    out_width = np.dtype(problem.out_dtype).itemsize
    pipeline = _pipeline_bytes(config, problem, weight_tiles)
    if problem.kernel is Kernel.TGMM or config.compute_warpgroups > 1:
        peak = (pipeline + output_tile_rows(config, problem, weight_tiles) * config.block_n
                * out_width)
    else:
        peak = max(pipeline, config.block_m * config.block_n * out_width)
    return peak + SHARED_MEMORY_SLACK


def fits(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> bool:
    """Whether shared memory holds what `config` allocates (`needed` within `limit`)."""
    return needed(config, problem, weight_tiles) <= limit(config)


def _pipeline_bytes(config: BlockConfig, problem: Problem, weight_tiles: int) -> int:
    """`stages` tiles of each operand (`weight_tiles` weight tiles per gmm step). With upcast, the
    stages hold the tiles as stored (4-bit ones packed two values to a byte, as Mosaic GPU
    allocates them), and the converted copies of a step's 8-bit or 4-bit tiles stay beside
    them: two of each (one being converted while wgmma reads the other) with one compute warpgroup;
    warp-specialized, each compute warpgroup's own copy of the lhs tile and of its columns of the
    weight tiles (it waits for its products at every step). With scale blocks
    (`scale_fitting.within_scale_block`, `scale_fitting.within_output_block`) each step's scale
    vectors too."""
    scales = 0
    stages = max(config.stages, 2)
    if config.scaled_steps:
        # Each step's float32 row and column scales, conservatively for both operands: one
        # buffer of the row scales and one per weight tile, each a whole number of Mosaic GPU's
        # 1024-byte allocation units.
        scales = (block_rules.round_up(stages * config.block_m * 4, SMEM_ALIGNMENT)
                  + weight_tiles * block_rules.round_up(stages * config.block_n * 4,
                                                        SMEM_ALIGNMENT))
    if config.scaled_lhs_tiles and problem.kernel is Kernel.TGMM:
        # Each chunk's float32 scales (the lhs copies are upcast's).
        scales = stages * config.block_m * 4
    elif config.scaled_lhs_tiles:
        # Each step's float32 scales along k, and two float32 copies of the lhs tile.
        scales = (stages + 2 * config.block_m) * config.block_k * 4
    if not config.upcast:
        return scales + (stages * _step_elements(config, problem, weight_tiles)
                         * operand_types.operand_bytes(problem))
    widths = (four_bit_bits.stored_bits(problem.lhs_dtype) / 8,
              four_bit_bits.stored_bits(problem.rhs_dtype) / 8)
    counts = _operand_step_elements(config, problem, weight_tiles)
    pipeline = stages * sum(c * w for c, w in zip(counts, widths))
    converted = operand_types.converted_dtype(problem.lhs_dtype, problem.rhs_dtype).itemsize
    copies = (2, 2) if config.compute_warpgroups == 1 else (config.compute_warpgroups, 1)
    return scales + math.ceil(pipeline) + converted * sum(
        c * n for c, w, n in zip(counts, widths, copies) if w <= 1)


def _step_elements(config: BlockConfig, problem: Problem, weight_tiles: int) -> int:
    """The elements of one pipeline step's tiles."""
    return sum(_operand_step_elements(config, problem, weight_tiles))


def _operand_step_elements(config: BlockConfig, problem: Problem, weight_tiles: int
                           ) -> tuple[int, int]:
    """The elements of one pipeline step's lhs tile and of its rhs tiles."""
    bm, bk, bn = config.block_m, config.block_k, config.block_n
    if problem.kernel is Kernel.TGMM:
        return bk * bm, bm * bn
    return bm * bk, weight_tiles * bk * bn


def output_tile_rows(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> int:
    """Rows of each output tile a warp-specialized kernel keeps in shared memory beside its
    pipeline: all of the tile's (gmm's block_m, tgmm's block_k) where the whole tiles fit,
    else LAYOUT_ROWS (block_rules.py), a piece of the accumulator stored after another (a float32
    128 x 256 tile takes 128 KiB, which 3 stages of 16-bit tiles leave no room for). Every other
    kernel keeps a whole tile."""
    rows = getattr(config, block_rules.output_rows_block(problem.kernel))
    if config.compute_warpgroups == 1 or rows <= block_rules.LAYOUT_ROWS:
        return rows
    whole = rows * config.block_n * np.dtype(problem.out_dtype).itemsize
    pipeline = _pipeline_bytes(config, problem, weight_tiles)
    whole_fits = pipeline + whole + SHARED_MEMORY_SLACK <= limit(config)
    return rows if whole_fits else block_rules.LAYOUT_ROWS


def stages_that_fit(config: BlockConfig, problem: Problem,
                    weight_tiles: int = 1) -> BlockConfig:
    """`config` with its stages cut (not below 2) until shared memory holds it."""
    stages = config.stages
    while stages > 2 and not fits(dataclasses.replace(config, stages=stages), problem,
                                  weight_tiles):
        stages -= 1
    return dataclasses.replace(config, stages=stages)
