"""The Pallas TPU kernels' candidate tilings for kernelhub.tuning.

On a TPU: the tilings whose buffers fit the chip's VMEM budget that the cost model
(kernelhub/_pallas/tpu/tiling.py) ranks best, so a measurement settles what the model cannot
know (the real group sizes, Mosaic's code for each block shape). In interpret mode, where
timing says nothing about a TPU, the interpret default and one other legal tiling, enough to
exercise the tuner.
"""

from __future__ import annotations

import itertools

from kernelhub._grouped_matmul.passes import TuningSpace
from kernelhub._grouped_matmul.problem import Problem
from kernelhub._pallas.tpu import tiling as tiling_lib

# How many of the cost model's best tilings are timed.
MODEL_CANDIDATES = 8


def _accepts(tiling: tuple[int, ...], problem: Problem, epilogue: object = None) -> bool:
    # (A fused epilogue changes no rule of these kernels' tilings.)
    try:
        tiling_lib.check(tiling, problem)
    except ValueError:
        return False
    return True


def _chip_default(problem: Problem) -> tuple[int, ...]:
    from kernelhub._pallas.tpu import hardware

    return tiling_lib.default_for_chip(problem, hardware.target_chip()).as_tuple()


def _chip_candidates(problem: Problem) -> list[tuple[int, ...]]:
    from kernelhub._pallas.tpu import hardware

    chip = hardware.target_chip()
    ranked = []
    for tiles in itertools.starmap(tiling_lib.Tiles, tiling_lib.legal_tilings(problem)):
        footprint = tiling_lib.vmem_bytes(tiles, problem)
        if footprint <= chip.tile_budget_bytes:
            ranked.append((tiling_lib.estimated_seconds(tiles, problem, chip), footprint,
                           tiles.as_tuple()))
    return [tiles for _, _, tiles in sorted(ranked)[:MODEL_CANDIDATES]]


def _interpret_default(problem: Problem) -> tuple[int, ...]:
    return tiling_lib.default_for_interpret(problem).as_tuple()


def _interpret_candidates(problem: Problem) -> list[tuple[int, ...]]:
    tm, tk, tn = _interpret_default(problem)
    other = (tm * 2, tk, tn)
    return [other] if _accepts(other, problem) else []


CHIP = TuningSpace("pallas", _chip_candidates, _chip_default, _accepts)
INTERPRET = TuningSpace("pallas-interpret", _interpret_candidates, _interpret_default, _accepts)
