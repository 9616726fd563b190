"""The Triton kernels' candidate block configs for kernelhub.tuning.

A short list around the heuristic (kernelhub/_pallas/gpu/config.py): narrower and wider output
tiles, deeper k blocks, 4 or 8 warps, 3 or 4 pipeline stages. Each is fitted to the problem as
the heuristic's own is, so small problems get legal tiles. float32 operands take half the
contraction block (block_k in gmm, block_m in tgmm: the same bytes per stage). Tiles multiplied
as stored (int8 x int8, fp8 x fp8 on 8-bit wgmma, kernelhub/_pallas/gpu/_tiles.py) also try twice
the contraction block (the same bytes again), with 8 warps on 128-row output tiles; the heuristic
itself sizes them as bf16 until a GPU has timed both.
"""

from __future__ import annotations

import dataclasses

from kernelhub._pallas.gpu import _narrow_dot, config
from kernelhub._grouped_matmul.passes import TuningSpace
from kernelhub._grouped_matmul.problem import Kernel, Problem

# (block_m, block_k, block_n, num_warps, num_stages) for 16-bit operands.
_GMM_CONFIGS = (
    (64, 64, 128, 4, 4), (64, 64, 256, 8, 3), (64, 128, 128, 4, 3), (128, 64, 64, 4, 4),
    (128, 64, 128, 4, 4), (128, 64, 128, 8, 3), (128, 64, 256, 8, 3), (128, 128, 128, 8, 3),
    (128, 32, 128, 4, 4), (256, 64, 128, 8, 3),
)
_TGMM_CONFIGS = (
    (64, 64, 64, 4, 4), (64, 128, 128, 4, 4), (64, 128, 128, 8, 3), (32, 128, 128, 4, 3),
    (128, 128, 128, 8, 3), (64, 64, 128, 4, 4), (64, 128, 256, 8, 3), (128, 64, 64, 4, 4),
    # 32 summed rows a step (the heuristic's, since the H200 tune of 2026-11-27 picked them at
    # every MoE shape) in 2 to 4 stages, under 128 x 128 and 128 x 256 output tiles.
    (32, 128, 128, 4, 4), (32, 128, 256, 8, 4), (32, 128, 128, 4, 2), (32, 128, 256, 8, 3),
)


def _default(problem: Problem) -> tuple[int, ...]:
    return config.heuristic(problem).as_tiling()


def _eight_bit(problem: Problem) -> bool:
    """Whether both operands are 8-bit types the kernels can multiply as stored."""
    return _narrow_dot.accumulator_dtype(problem.lhs_dtype, problem.rhs_dtype) is not None


def _scaled(block_config: tuple[int, ...], axis: int, factor: float) -> tuple[int, ...]:
    scaled = list(block_config)
    scaled[axis] = min(config.MAX_BLOCK, max(config.MIN_BLOCK, int(scaled[axis] * factor)))
    return tuple(scaled)


def _candidates(problem: Problem) -> list[tuple[int, ...]]:
    # Which block is the contraction and which the output's rows: gmm sums over block_k and
    # writes block_m rows; tgmm sums over block_m rows and writes block_k rows.
    contraction, out_rows = (0, 1) if problem.kernel is Kernel.TGMM else (1, 0)
    configs = _TGMM_CONFIGS if problem.kernel is Kernel.TGMM else _GMM_CONFIGS
    if config.itemsize(problem) > 2:
        configs = tuple(_scaled(c, contraction, 0.5) for c in configs)
    fitted = [config.fitted(config.BlockConfig(*c), problem.m, problem.k, problem.n)
              for c in configs]
    if _eight_bit(problem):
        deeper = [config.fitted(config.BlockConfig(*_scaled(c, contraction, 2)),
                                problem.m, problem.k, problem.n) for c in configs]
        # After fitting, so 128-row tiles keep 8 warps even where `fitted` would halve them.
        fitted += [dataclasses.replace(c, num_warps=8) if c.as_tiling()[out_rows] >= 128 else c
                   for c in deeper]
    return list(dict.fromkeys(c.as_tiling() for c in fitted))


def _accepts(tiling: tuple[int, ...], problem: Problem, epilogue: object = None) -> bool:
    # (A fused epilogue changes no rule of these kernels' tilings.)
    try:
        config.from_tiling(tiling, problem.m, problem.k, problem.n, config.heuristic(problem))
    except ValueError:
        return False
    return True


def space(implementation: str) -> TuningSpace:
    return TuningSpace(implementation, _candidates, _default, _accepts)
