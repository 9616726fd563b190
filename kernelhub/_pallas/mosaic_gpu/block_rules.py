"""The blocks of a Mosaic GPU grouped matmul (`BlockConfig`) and the rules Hopper sets on them.

Each rule below was found by lowering or running on an H100, but for the two choices:
- a warpgroup's wgmma writes 64 rows at a time, so the output tile's rows (gmm's block_m,
  tgmm's block_k) are 64 or 128; its columns (block_n) at most 256;
- the contraction block is at least 32 bytes per row (one wgmma step of 16-bit values is 16
  of them);
- gmm's TMA stores a visit's rows starting at any row of the shared-memory tile, and TMA reads
  shared memory only at 128-byte aligned addresses: an output row is a multiple of 128 bytes
  (block_n of 64 for 16-bit outputs, 32 for float32);
- tgmm zeroes other groups' rows of its [block_m, block_n] weight-side tile in registers, in
  wgmma's operand layout, whose tiles are 64 rows: block_m is at least 64, and block_n too
  where that tile is stored K-major ([block_n, block_m]: float32, fp8 and int8);
- a tile the tiling's upcast converts in shared memory has at least 64 rows: for fewer, Mosaic
  GPU's layout inference finds no register layout (lowering for sm90 fails). gmm's 8-bit or
  4-bit weights meet it: tiles of block_k rows from weights [G, k, n] (32 where scale blocks
  of 32 cut it), of block_n rows (a compute warpgroup's share) from [G, n, k] (32 beside a
  float32 output at n of 32 or less); every other converted tile's rows are a row block or
  columns kept at 64. And a 4-bit tile read as stored has at least 32 values along its minor
  axis: TMA's rows, and the strides of the arrays it reads, are multiples of 16 bytes
  (`conversion_problem`);
- (a choice, not found by a fault) a warp-specialized tgmm's compute warpgroups each multiply
  a column half of the shared weight-side tile, kept to at least 64 columns (whole 128-byte
  swizzled rows of 16-bit values): narrower halves lower, but no GPU has run them;
- the pipeline's stages, the output tile and a little more fit one block's 227 KiB of shared
  memory (a warp-specialized kernel's output tiles, beside its pipeline, in 64-row pieces
  where whole ones do not fit: shared_memory.output_tile_rows);
- (a choice) the heuristic gives one warpgroup at most 128 x 128 float32 sums, 128 of the 255
  registers a thread has (a gated unit's two sums share them).

config.validate checks a tiling against these rules; the heuristic (heuristic.py) and the
tuning candidates keep them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas import four_bit_bits
from kernelhub._pallas.mosaic_gpu import operand_types

OUTPUT_ROWS = (64, 128)
MIN_BLOCK = 16
MAX_COLUMNS = 256
MAX_CONTRACTION = 256
MAX_STAGES = 8
# One TMA row of 128 bytes is the widest swizzle: the contraction block the heuristic takes.
SWIZZLE_BYTES = 128
# One wgmma instruction's contraction: 16 values of 16 bits, 32 of 8 bits.
MIN_STEP_BYTES = 32
# TMA's shared-memory side is addressed in 128-byte units: gmm's output rows are a whole one.
TMA_ROW_BYTES = 128
# gmm's row tiles start at multiples of this many rows (visits.py's row_align): TMA copies a
# tile to shared memory in swizzled groups of 8 rows, and the global rows are cut the same way.
ROW_ALIGN = 8
# Rows of a tile of wgmma's operand layout (tgmm's register masks).
LAYOUT_ROWS = 64
MAX_PROGRAMS_PER_SM = 4
# Streaming multiprocessors of an H100 SXM and an H200: the persistent grid's programs per
# programs_per_sm, and the heuristic's measure of whether a problem has work for more.
HOPPER_SMS = 132
# The float32 sums the heuristic gives one warpgroup: 128 registers of each of its threads,
# of the 255 a thread can have (a gated unit's two sums share them).
ACCUMULATOR_ELEMENTS = 128 * 128


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """One call's blocks: the tiling's entries (config.py says each), and two flags that a
    call's scale blocks set."""

    block_m: int
    block_k: int
    block_n: int
    stages: int = 4
    compute_warpgroups: int = 1
    group_span: int = 1
    upcast: bool | None = None  # None: not an 8-bit gmm of weights [G, k, n], or not decided
    programs_per_sm: int = 1
    # Not part of the tiling: set for a gmm with scale blocks along k
    # (`scale_fitting.within_scale_block`), or a call whose output tiles lie inside one scale block
    # (`scale_fitting.within_output_block`).
    scaled_steps: bool = False
    scaled_lhs_tiles: bool = False

    def as_tiling(self) -> tuple[int, ...]:
        tiling = (self.block_m, self.block_k, self.block_n, self.stages)
        if self.programs_per_sm != 1:
            return (*tiling, self.compute_warpgroups, self.group_span, int(bool(self.upcast)),
                    self.programs_per_sm)
        if self.upcast is not None:
            return (*tiling, self.compute_warpgroups, self.group_span, int(self.upcast))
        if self.group_span != 1:
            return (*tiling, self.compute_warpgroups, self.group_span)
        return tiling if self.compute_warpgroups == 1 else (*tiling, self.compute_warpgroups)

    @property
    def warpgroup_columns(self) -> int:
        """The output columns one compute warpgroup sums."""
        return self.block_n // self.compute_warpgroups


def power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def next_power_of_two(value: int) -> int:
    return 1 << max(int(value) - 1, 0).bit_length()


def output_rows_block(kernel: Kernel) -> str:
    """The block that is the output tile's rows: the wgmma's M."""
    return "block_k" if kernel is Kernel.TGMM else "block_m"


def contraction_block(kernel: Kernel) -> str:
    return "block_m" if kernel is Kernel.TGMM else "block_k"


def round_up(size: int, block: int) -> int:
    """`size` rounded up to a multiple of `block`."""
    return -(-size // block) * block


def accumulator_elements(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> int:
    """The float32 sums one compute warpgroup holds: its share of the output tile, once per
    weight tile (against ACCUMULATOR_ELEMENTS, the heuristic's bound)."""
    rows = getattr(config, output_rows_block(problem.kernel))
    return weight_tiles * rows * config.block_n // config.compute_warpgroups


def min_contraction(problem: Problem) -> int:
    least = max(MIN_BLOCK, MIN_STEP_BYTES // operand_types.operand_bytes(problem))
    return max(least, LAYOUT_ROWS) if problem.kernel is Kernel.TGMM else least


def min_columns(problem: Problem, compute_warpgroups: int = 1) -> int:
    """The least columns of a compute warpgroup (block_n with one; the rules in this module's
    docstring)."""
    if problem.kernel is not Kernel.TGMM:
        return max(MIN_BLOCK, TMA_ROW_BYTES // np.dtype(problem.out_dtype).itemsize)
    k_major = operand_types.problem_dtype(problem).name in operand_types.K_MAJOR_ONLY
    return LAYOUT_ROWS if k_major or compute_warpgroups > 1 else MIN_BLOCK


# The least values along a 4-bit tile's minor axis: 16 bytes, TMA's least row (and the least
# multiple of the array strides it reads).
FOUR_BIT_ROW_VALUES = 32


def conversion_problem(config: BlockConfig, problem: Problem) -> str | None:
    """Why the tiles `config`'s upcast converts in shared memory break a rule of this module's
    docstring (a converted tile of fewer than LAYOUT_ROWS rows, a 4-bit tile of fewer than
    FOUR_BIT_ROW_VALUES values along its minor axis), or None: also without an upcast."""
    if not config.upcast:
        return None
    for name, dtype, rows, minor in _stored_tiles(config, problem):
        if np.dtype(dtype).itemsize == 1 and rows < LAYOUT_ROWS:
            return (f"the {dtype} {name} tiles it converts have {rows} rows, and converting "
                    f"takes {LAYOUT_ROWS} or more")
        if four_bit_bits.stored_bits(dtype) == 4 and minor < FOUR_BIT_ROW_VALUES:
            return (f"the {dtype} {name} tiles it reads have {minor} values along their minor "
                    f"axis, and TMA takes {FOUR_BIT_ROW_VALUES} or more of 4-bit values")
    return None


def _stored_tiles(config: BlockConfig, problem: Problem) -> list[tuple[str, str, int, int]]:
    """(operand, dtype, rows one compute warpgroup converts, values along the minor axis) of
    each operand's tile as an upcast kernel reads it: gmm's weights transposed where the
    converted type is K-major only, tgmm's as operand_types.tgmm_tiles lays them."""
    bm, bk, bn = config.block_m, config.block_k, config.block_n
    converted = operand_types.converted_dtype(problem.lhs_dtype, problem.rhs_dtype)
    k_major = converted is not None and converted.name in operand_types.K_MAJOR_ONLY
    if problem.kernel is Kernel.TGMM:
        lhs, rhs = operand_types.tgmm_tiles(k_major, bm, bk, bn)
    else:
        lhs = (bm, bk)
        if problem.kernel is Kernel.GMM_TRANSPOSED_RHS or k_major:
            rhs = (bn // config.compute_warpgroups, bk)
        else:
            rhs = (bk, bn)
    return [("lhs", problem.lhs_dtype, *lhs), ("weight" if problem.kernel is not Kernel.TGMM
                                                else "rhs", problem.rhs_dtype, *rhs)]
