"""Block configurations of the Triton grouped matmuls: the heuristic and the `tiling` override.

A `tiling` for these kernels is a tuple `(block_m, block_k, block_n)`, optionally followed by
`num_warps` and `num_stages` (megablox's order, so a megablox tiling carries over), or a
callable `(m, k, n) -> tuple | None`, or None for the heuristic. `m` is always the grouped
(row) dimension: gmm's output rows, tgmm's summed rows.

The heuristic is static (shapes and dtypes only): the kernels never read group sizes on the host.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.contraction_scales import largest_power_of_two_dividing
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub.quantization import EXACT_IN_BFLOAT16

# tl.dot needs every operand dimension to be at least 16.
MIN_BLOCK = 16
# A larger tile no longer fits one streaming multiprocessor's registers and shared memory.
MAX_BLOCK = 1024
MAX_WARPS = 32  # 1024 threads, CUDA's limit per block
MAX_STAGES = 8
TILING_FORM = "(block_m, block_k, block_n[, num_warps[, num_stages]])"

# About twice the SMs of an H100/H200 (132): below this many programs a GPU idles.
_ENOUGH_PROGRAMS = 264


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """One kernel launch's tile shape and Triton compiler settings."""

    block_m: int
    block_k: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 3

    def as_tiling(self) -> tuple[int, int, int, int, int]:
        return (self.block_m, self.block_k, self.block_n, self.num_warps, self.num_stages)


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def _next_power_of_two(value: int) -> int:
    return 1 << max(int(value) - 1, 0).bit_length()


def check_static(problem: Problem) -> None:
    """Raises a ValueError for a symbolic m, k or n (shape-polymorphic export): jax's Pallas
    Triton lowering takes no symbolic dimension, neither in an operand's shape nor in the grid."""
    for name, size in (("m", problem.m), ("k", problem.k), ("n", problem.n)):
        if not is_static(size):
            raise ValueError(
                f"the Triton kernels (the 'cuda' target) cannot lower a symbolic {name} "
                f"({size}): jax's Pallas Triton lowering takes static shapes only. Export for "
                f"'cuda' with concrete shapes, or pin kernelhub's XLA implementation "
                f"(kernelhub.get(op, platform='xla') or KERNELHUB_PLATFORM=xla), which lowers "
                f"symbolic sizes for every target; kernelhub.export lowers a symbolic m for "
                f"'cpu' and 'tpu' as they are")


def validate(config: BlockConfig, source: Any) -> BlockConfig:
    """Raises a ValueError naming the broken rule; `source` is what the user passed."""
    for name in ("block_m", "block_k", "block_n"):
        size = getattr(config, name)
        if not _is_power_of_two(size):
            raise ValueError(
                f"tiling {source!r}: {name}={size} must be a power of two (Triton's rule for "
                f"block shapes); tiling is {TILING_FORM}"
            )
        if not MIN_BLOCK <= size <= MAX_BLOCK:
            raise ValueError(
                f"tiling {source!r}: {name}={size} must lie in [{MIN_BLOCK}, {MAX_BLOCK}] "
                f"(Triton's dot needs at least {MIN_BLOCK}); tiling is {TILING_FORM}"
            )
    if not (_is_power_of_two(config.num_warps) and config.num_warps <= MAX_WARPS):
        raise ValueError(
            f"tiling {source!r}: num_warps={config.num_warps} must be a power of two in "
            f"[1, {MAX_WARPS}]"
        )
    if not 1 <= config.num_stages <= MAX_STAGES:
        raise ValueError(
            f"tiling {source!r}: num_stages={config.num_stages} must lie in [1, {MAX_STAGES}]"
        )
    return config


def from_tiling(tiling: Any, m: int, k: int, n: int, default: BlockConfig) -> BlockConfig:
    """The config a call uses: `tiling` when it names one, else `default` (the heuristic's)."""
    chosen = tiling(m, k, n) if callable(tiling) else tiling
    if chosen is None:
        return default
    if isinstance(chosen, BlockConfig):
        return validate(chosen, chosen)
    if not isinstance(chosen, (tuple, list)) or not 3 <= len(chosen) <= 5 or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in chosen
    ):
        raise ValueError(f"tiling {chosen!r} must be a tuple of ints {TILING_FORM}")
    block_m, block_k, block_n, *compiler = (int(v) for v in chosen)
    num_warps = compiler[0] if len(compiler) > 0 else default.num_warps
    num_stages = compiler[1] if len(compiler) > 1 else default.num_stages
    return validate(BlockConfig(block_m, block_k, block_n, num_warps, num_stages), chosen)


def within_scale_blocks(config: BlockConfig, common_block: int, contraction: str) -> BlockConfig:
    """`config` with its contraction block (`contraction`: "block_k" for gmm, "block_m" for
    tgmm) cut to a power of two dividing `common_block`, so that every contraction step lies
    inside one scale block of each scaled operand (kernelhub/_grouped_matmul/contraction_scales.py)."""
    step = largest_power_of_two_dividing(common_block)
    if step < MIN_BLOCK:
        raise ValueError(
            f"scale blocks of {common_block} elements along the contraction: the Triton kernels "
            f"need scale blocks whose length is a multiple of {MIN_BLOCK}")
    return dataclasses.replace(config, **{contraction: min(getattr(config, contraction), step)})


def within_all_scale_blocks(config: BlockConfig, scales: Any, output_blocks: Any,
                            contraction: str, rows: str) -> BlockConfig:
    """`config` cut so that each contraction step lies inside one block of every operand with
    contraction scale blocks (`scales`, or None), and each output tile inside one block of an
    operand blocked along it (`output_blocks`): its rows (`rows`: "block_m" for gmm, "block_k"
    for tgmm) for lhs, its columns for rhs."""
    if scales is not None:
        config = within_scale_blocks(config, scales.common_block, contraction)
    for name, block in zip((rows, "block_n"), output_blocks.operand_blocks):
        if block is not None:
            config = within_scale_blocks(config, block, name)
    return config


def gated_output_tile(config: BlockConfig, n_out: int) -> BlockConfig:
    """The config of a gated (glu) gmm from the config for its rhs: block_n counts the rhs
    columns a program reads, gate and up tiles together, so its output tile has half of them
    (at least MIN_BLOCK, at most what covers the n_out output columns). Its float32 sums of
    gate and up then take the registers, and its rhs tiles the shared memory, of the same
    tiling without a gate."""
    return dataclasses.replace(config, block_n=_fit(max(config.block_n // 2, MIN_BLOCK), n_out))


def _fit(block: int, dim: int) -> int:
    """Shrinks a block to the smallest power of two covering `dim` (never below MIN_BLOCK)."""
    return max(MIN_BLOCK, min(block, _next_power_of_two(dim)))


def fitted(config: BlockConfig, m: int, k: int, n: int) -> BlockConfig:
    block_m, block_k, block_n = _fit(config.block_m, m), _fit(config.block_k, k), _fit(config.block_n, n)
    # Small tiles have too little work for 8 warps.
    num_warps = config.num_warps if block_m * block_n >= 128 * 256 else min(config.num_warps, 4)
    return BlockConfig(block_m, block_k, block_n, num_warps, config.num_stages)


def itemsize(problem: Problem) -> int:
    """Bytes per element the heuristics size blocks by: int8 and fp8 count as the bf16 they
    widen to when not multiplied as stored (kernelhub/_pallas/gpu/_tiles.py)."""
    return max(2 if np.dtype(d) in EXACT_IN_BFLOAT16 else np.dtype(d).itemsize
               for d in (problem.lhs_dtype, problem.rhs_dtype))


def heuristic(problem: Problem) -> BlockConfig:
    """The heuristic's block config for the problem's kernel."""
    return (tgmm_heuristic if problem.kernel is Kernel.TGMM else gmm_heuristic)(problem)


def gmm_heuristic(problem: Problem) -> BlockConfig:
    """Tiles for grouped_matmul's [m, k] x [k, n] per group.

    block_m follows the expected rows per group, since a group smaller than a tile wastes the
    rest of it (DeepSeek/Qwen-like: 64 rows per expert on average); wgmma wants at least 64.
    Wide 128x256 tiles with 8 warps when groups are large and n is wide (Mixtral-like), which
    halves the reloads of lhs; 16-bit inputs take block_k 64, float32 half that (same bytes).
    """
    m, k, n = problem.m, problem.k, problem.n
    rows_per_group = max(1, m // max(problem.num_groups, 1))
    block_m = min(128, max(64, _next_power_of_two(rows_per_group)))
    narrow = itemsize(problem) <= 2
    block_k = 64 if narrow else 32
    wide = narrow and block_m == 128 and n >= 2048
    block_n = 256 if wide else 128
    config = BlockConfig(block_m, block_k, block_n, num_warps=8 if wide else 4,
                         num_stages=3 if wide else 4)
    return fitted(config, m, k, n)


def tgmm_heuristic(problem: Problem) -> BlockConfig:
    """Tiles for transposed_grouped_matmul: a (block_k x block_n) output tile per program, summing
    block_m rows per step.

    Every (group, k-tile, n-tile) is one program; when that gives too few programs to fill the
    GPU (few groups, small k and n), the output tiles shrink to 64.

    Steps of 32 rows in 3 stages for every dtype: a program's pipeline is short (one group's
    rows), so what hides its loads is other programs on the same SM, and small stages let
    more of them in. On an H200 (benchmarks/gpu/2026-11-27-h200/, bf16) the tuner picked
    32-row steps at all four MoE shapes, 1.35x to 1.9x faster than 64-row steps in 4 stages;
    3 stages won at the fine-grained shapes and came within 3% of 4 at Mixtral's.
    """
    m, k, n = problem.m, problem.k, problem.n
    block_m = 32
    block_k = block_n = 128
    programs = problem.num_groups * -(-k // block_k) * -(-n // block_n)
    if programs < _ENOUGH_PROGRAMS:
        block_k = block_n = 64
    config = BlockConfig(block_m, block_k, block_n, num_warps=4, num_stages=3)
    return fitted(config, m, k, n)
