"""The Mosaic GPU kernels' candidate tiles for kernelhub.tuning.

Around the heuristic (kernelhub/_pallas/mosaic_gpu/heuristic.py): 64- and 128-row output tiles, 64
to 256 columns, one or two 128-byte rows of contraction per step, 3 to 8 stages in flight, four
warp-specialized tilings (two compute warpgroups: gmm_warp_specialized.py,
tgmm_warp_specialized.py), for tgmm two that sum spans of 8 groups in one pipeline (group_spans.py),
for every kernel four to six with two to four programs per SM (each with its share of the shared
memory), for a call with an 8-bit operand (operand_types.upcast_applies) each tiling with and
without upcast (config.py; tgmm's warp-specialized ones without); each fitted to the problem as the
heuristic's own is, and kept only where it is legal.
"""

from __future__ import annotations

import dataclasses
import functools

from kernelhub._grouped_matmul.epilogue import Epilogue
from kernelhub._grouped_matmul.passes import TuningSpace
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas.mosaic_gpu import block_rules, config, heuristic, operand_types

# (output rows, contraction in 128-byte rows, columns, stages, compute warpgroups). Left out
# since the H100 tune of 2026-11-27, which timed each at four MoE shapes in every pass:
# (128, 1, 256, 3, 1), at best 0.46-0.54 of the winner's speed wherever it ran (a 128 x 256
# float32 accumulator takes all of one warpgroup's registers).
_CANDIDATES = (
    (64, 1, 128, 4, 1), (64, 1, 256, 3, 1), (64, 2, 128, 3, 1), (128, 1, 128, 4, 1),
    (128, 2, 128, 3, 1), (128, 1, 64, 5, 1), (64, 1, 64, 5, 1),
    (64, 1, 256, 4, 2), (128, 1, 256, 3, 2), (64, 1, 128, 5, 2),
    # Narrow and deep: 64 columns, two 128-byte rows of contraction per step (tokamax's H100
    # table settles on this shape for its sm90 kernel at every MoE shape it lists).
    (128, 2, 64, 4, 1), (64, 2, 64, 4, 1),
    # Deep pipelines: at 64 rows per expert the loads are the work, and an SM keeps about
    # `stages - 1` of them in flight (one buffer waits for its wgmma): 6 and 8 stages of 24 KiB
    # hold 120-168 KiB in flight against HBM's loaded latency, where 4 hold 72.
    (64, 1, 128, 6, 1), (64, 1, 128, 8, 1), (64, 1, 128, 8, 2),
)


# tgmm only: (output rows, contraction rows, columns, stages, groups per work item): one
# pipeline over several groups' chunks (group_spans.py), where one group's few rows leave the
# per-group pipeline nothing to overlap. (Spans of 32 groups were left out after the same
# tune: 0.73-0.78 of the winner, behind spans of 8.)
_TGMM_SPANS = ((64, 1, 128, 4, 8), (128, 1, 128, 4, 8))

# Programs sharing an SM (config.py's programs_per_sm), each with its share of the shared
# memory: (output rows, contraction in 128-byte rows, columns, stages, groups per work item,
# programs per SM). A program of the persistent grid waits out each work item's first load;
# another program on the SM keeps HBM busy meanwhile. Two per SM won every fine-grained tgmm
# of the H100 tune of 2026-11-27 (1.14x to 1.62x); three and four, in tiles whose float32 sums
# leave each program 128 or 170 registers per thread, test how far that goes. The last gmm
# tiling is tokamax's sm90 default for 16-bit operands (64 x 64 outputs, 128 contraction rows,
# 2 stages, one output tile per block and the hardware packing blocks onto SMs, here three per
# SM): its forward led ours at DeepSeek-V3 and GPT-OSS on the H100 of 2026-11-27 (.54 and .72
# of the roofline against .47 and .61), and no tune has timed that shape here.
_SHARED_SM_GMM = ((64, 1, 128, 3, 1, 2), (64, 1, 128, 4, 1, 2), (128, 1, 128, 3, 1, 2),
                  (64, 1, 128, 2, 1, 3), (64, 1, 64, 3, 1, 4), (64, 2, 64, 2, 1, 3))
_SHARED_SM_TGMM = ((128, 1, 128, 2, 1, 2), (64, 1, 128, 2, 1, 2), (64, 1, 128, 3, 1, 2),
                   (128, 1, 128, 2, 8, 2), (64, 1, 128, 2, 1, 3), (64, 1, 64, 2, 1, 4))


def _tiling(rows: int, contraction: int, columns: int, stages: int, warpgroups: int,
            problem: Problem, span: int = 1, programs: int = 1) -> block_rules.BlockConfig:
    step = contraction * block_rules.SWIZZLE_BYTES // operand_types.operand_bytes(problem)
    if problem.kernel is Kernel.TGMM:
        return block_rules.BlockConfig(block_m=step, block_k=rows, block_n=columns, stages=stages,
                                  compute_warpgroups=warpgroups, group_span=span,
                                  programs_per_sm=programs)
    return block_rules.BlockConfig(block_m=rows, block_k=step, block_n=columns, stages=stages,
                              compute_warpgroups=warpgroups, programs_per_sm=programs)


def _candidates(problem: Problem) -> list[tuple[int, ...]]:
    tilings = [_tiling(*c, problem) for c in _CANDIDATES]
    tgmm = problem.kernel is Kernel.TGMM
    if tgmm:
        tilings += [_tiling(*c[:4], 1, problem, span=c[4]) for c in _TGMM_SPANS]
    tilings += [_tiling(*c[:4], 1, problem, span=c[4], programs=c[5])
                for c in (_SHARED_SM_TGMM if tgmm else _SHARED_SM_GMM)]
    fitted = [heuristic.fitted(tiling, problem) for tiling in tilings]
    if operand_types.upcast_applies(problem):
        # An 8-bit operand: each tiling both ways (tgmm's warp-specialized ones copy first),
        # conversions of the tiles as stored and a copy first (the weights K-major for 8-bit
        # wgmma, or the 8-bit operand widened); the roofline's choice, roofline.upcast_pays, is
        # only an estimate.
        both = lambda tiling: (  # noqa: E731
            tiling.compute_warpgroups == 1 or problem.kernel is not Kernel.TGMM)
        fitted = [heuristic.fitted(dataclasses.replace(tiling, upcast=upcast), problem)
                  for tiling in fitted
                  for upcast in ((False, True) if both(tiling) else (False,))]
    tilings = [tiling.as_tiling() for tiling in fitted]
    return [t for t in dict.fromkeys(tilings) if _accepts(t, problem)]


def _default(problem: Problem, warp_specialize: bool = True) -> tuple[int, ...]:
    return heuristic.heuristic(problem, warp_specialize=warp_specialize).as_tiling()


def _accepts(tiling: tuple[int, ...], problem: Problem, epilogue: Epilogue | None = None
             ) -> bool:
    # A gated unit reads two weight tiles a step and sums two accumulators, where the tables
    # were tuned with one: stages that fit beside one weight tile may not fit beside two, and
    # a warpgroup's registers that hold one sum of a tile may not hold two (the heuristic's
    # bound; an explicit tiling is the caller's).
    gated = epilogue is not None and epilogue.glu is not None
    try:
        blocks = config.from_tiling(tiling, problem, 2 if gated else 1)
    except ValueError:
        return False
    if not gated:
        return True
    # Columns whose tiles fit the weights but not each half of them would pad both halves, a
    # copy of the weights that the plain call's time leaves out (GPT-OSS's 2 x 2880 columns
    # in tiles of 128).
    columns = blocks.block_n
    pads_halves = (problem.n // 2) % columns != 0 and problem.n % columns == 0
    return not pads_halves and (block_rules.accumulator_elements(blocks, problem, 2)
                                <= block_rules.ACCUMULATOR_ELEMENTS)


def _times_epilogue(epilogue: Epilogue, transpose_rhs: bool) -> bool:
    """An interleaved gated unit's weights [G, k, 2n] are gathered into the concatenated
    layout before the kernel (grouped_matmul.py): a copy of the weights, which no table entry
    times, and which at GPT-OSS's shape costs more than the kernel. Such a call is not given
    the kernel's time, so the tables never choose it over the Triton kernel, which splits the
    pairs in registers. Interleaved weights [G, 2n, k] (transpose_rhs, as GPT-OSS's
    checkpoints hold them) are read in place: timed like the plain call."""
    return not epilogue.interleaved or transpose_rhs


def space(implementation: str) -> TuningSpace:
    # Interpreted, the default is the tiling the interpreted kernels' heuristic gives (one
    # compute warpgroup: heuristic.heuristic).
    default = functools.partial(_default,
                                warp_specialize=not implementation.endswith("-interpret"))
    return TuningSpace(implementation, _candidates, default, _accepts,
                       times_epilogue=_times_epilogue)
