"""Tiles of the Mosaic GPU grouped matmuls: the heuristic and the `tiling` override.

A `tiling` is `(block_m, block_k, block_n[, stages])` (megablox's order; `m` is the grouped
axis for both ops: gmm's output rows, tgmm's summed rows), a callable `(m, k, n) -> tuple |
None`, or None for the heuristic. `stages` is how many TMA loads the pipeline keeps in flight.

What Hopper's instructions fix: a warpgroup's wgmma writes 64 rows at a time, so the output
tile's rows (gmm's block_m, tgmm's block_k) are 64 or 128; its columns (block_n) at most 256;
the contraction block at least 32 bytes per row (one wgmma step of 16-bit values is 16 of
them). The heuristic reads shapes and dtypes only, never group sizes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.problem import Kernel, Problem

OUTPUT_ROWS = (64, 128)
MIN_BLOCK = 16
MAX_COLUMNS = 256
MAX_CONTRACTION = 256
MAX_STAGES = 8
# One TMA row of 128 bytes is the widest swizzle: the contraction block the heuristic takes.
SWIZZLE_BYTES = 128
# One wgmma instruction's contraction: 16 values of 16 bits, 32 of 8 bits.
MIN_STEP_BYTES = 32
TILING_FORM = "(block_m, block_k, block_n[, stages])"


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    block_m: int
    block_k: int
    block_n: int
    stages: int = 4

    def as_tiling(self) -> tuple[int, int, int, int]:
        return (self.block_m, self.block_k, self.block_n, self.stages)


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def _next_power_of_two(value: int) -> int:
    return 1 << max(int(value) - 1, 0).bit_length()


def output_rows_block(kernel: Kernel) -> str:
    """The block that is the output tile's rows: the wgmma's M."""
    return "block_k" if kernel is Kernel.TGMM else "block_m"


def contraction_block(kernel: Kernel) -> str:
    return "block_m" if kernel is Kernel.TGMM else "block_k"


def validate(config: BlockConfig, kernel: Kernel, source: Any) -> BlockConfig:
    """Raises a ValueError naming the broken rule; `source` is what the user passed."""
    rows = output_rows_block(kernel)
    for name in ("block_m", "block_k", "block_n"):
        size = getattr(config, name)
        if not _power_of_two(size):
            raise ValueError(f"tiling {source!r}: {name}={size} must be a power of two; "
                             f"tiling is {TILING_FORM}")
        if name == rows and size not in OUTPUT_ROWS:
            raise ValueError(f"tiling {source!r}: {name}={size} is the output tile's rows, "
                             f"which wgmma writes 64 at a time: one of {OUTPUT_ROWS}")
        limit = MAX_COLUMNS if name == "block_n" else MAX_CONTRACTION
        if name != rows and not MIN_BLOCK <= size <= limit:
            raise ValueError(f"tiling {source!r}: {name}={size} must lie in "
                             f"[{MIN_BLOCK}, {limit}]")
    if not 1 <= config.stages <= MAX_STAGES:
        raise ValueError(f"tiling {source!r}: stages={config.stages} must lie in "
                         f"[1, {MAX_STAGES}]")
    return config


def check_static(problem: Problem) -> None:
    """A ValueError for a symbolic m, k or n (shape-polymorphic export): TMA boxes, the grid of
    work and the padding to whole tiles are all static. (The registry routes such calls
    elsewhere: these kernels do not list the symbolic_shapes feature.)"""
    for name in ("m", "k", "n"):
        if not is_static(getattr(problem, name)):
            raise ValueError(f"the Mosaic GPU kernels take static shapes only; {name} is the "
                             f"symbolic dimension {getattr(problem, name)}")


def from_tiling(tiling: Any, problem: Problem) -> BlockConfig:
    """The config a call uses: `tiling` when it names one, else the heuristic's."""
    check_static(problem)
    chosen = tiling(problem.m, problem.k, problem.n) if callable(tiling) else tiling
    if chosen is None:
        return heuristic(problem)
    if isinstance(chosen, BlockConfig):
        return validate(chosen, problem.kernel, chosen)
    if not isinstance(chosen, (tuple, list)) or not 3 <= len(chosen) <= 4 or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in chosen):
        raise ValueError(f"tiling {chosen!r} must be a tuple of ints {TILING_FORM}")
    values = [int(v) for v in chosen]
    stages = values[3] if len(values) == 4 else heuristic(problem).stages
    config = validate(BlockConfig(*values[:3], stages), problem.kernel, chosen)
    name = contraction_block(problem.kernel)
    if getattr(config, name) < min_contraction(problem):
        raise ValueError(f"tiling {chosen!r}: {name}={getattr(config, name)} is the "
                         f"contraction step, which wgmma takes {MIN_STEP_BYTES} bytes at a "
                         f"time: at least {min_contraction(problem)} for these operands")
    return config


def operand_bytes(problem: Problem) -> int:
    """Bytes per element of the tiles the kernel multiplies (kernel_dtype's choice)."""
    return np.dtype(kernel_dtype(problem.lhs_dtype, problem.rhs_dtype)).itemsize


# The operand types wgmma multiplies as stored, both operands of one type.
_WGMMA_TYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")


def kernel_dtype(lhs_dtype: Any, rhs_dtype: Any) -> np.dtype:
    """The one dtype both tiles are multiplied in: their own when they share a wgmma type; else
    the narrowest float that holds both exactly (bfloat16 for 8-bit values, float32 beside a
    float32 operand or for float16 with bfloat16)."""
    lhs, rhs = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
    if lhs == rhs and lhs.name in _WGMMA_TYPES:
        return lhs
    if "float32" in (lhs.name, rhs.name) or {lhs.name, rhs.name} == {"float16", "bfloat16"}:
        return np.dtype(np.float32)
    if "float16" in (lhs.name, rhs.name):
        return np.dtype(np.float16)
    return np.dtype("bfloat16")


def min_contraction(problem: Problem) -> int:
    return max(MIN_BLOCK, MIN_STEP_BYTES // operand_bytes(problem))


def heuristic(problem: Problem) -> BlockConfig:
    """Output tiles of 64 rows when a group's expected rows fit them (fine-grained MoE: a
    64-row group does not pay for a half-empty 128-row tile), else 128; 128 columns; one
    128-byte row of contraction per step; 4 stages in flight (at most 128 KiB of shared
    memory). Each block then shrinks to the problem."""
    width = operand_bytes(problem)
    contraction = SWIZZLE_BYTES // width
    if problem.kernel is Kernel.TGMM:
        blocks = BlockConfig(block_m=contraction, block_k=128 if problem.k >= 128 else 64,
                             block_n=128)
    else:
        rows_per_group = problem.m / max(problem.num_groups, 1)
        blocks = BlockConfig(block_m=64 if rows_per_group <= 64 else 128, block_k=contraction,
                             block_n=128)
    return fitted(blocks, problem)


def fitted(config: BlockConfig, problem: Problem) -> BlockConfig:
    """`config` with each block but the output rows cut to the smallest power of two covering
    its dimension (at least MIN_BLOCK), and 64 output rows where 64 cover them."""
    sizes = {"block_m": problem.m, "block_k": problem.k, "block_n": problem.n}
    rows = output_rows_block(problem.kernel)
    fitted_blocks = {}
    for name, size in sizes.items():
        block = getattr(config, name)
        least = min_contraction(problem) if name == contraction_block(problem.kernel) else MIN_BLOCK
        if name == rows:
            fitted_blocks[name] = 64 if size <= 64 else block
        else:
            fitted_blocks[name] = max(least, min(block, _next_power_of_two(size)))
    return dataclasses.replace(config, **fitted_blocks)
