"""Block sizes of the Pallas TPU kernels: the rules a tiling must follow and the default choice.

A tiling is (tm, tk, tn) for every kernel, as in megablox: tm rows of the grouped axis (the
rows of gmm, the contraction of tgmm), tk of gmm's contraction (tgmm's output rows), tn of the
output columns. The kernels that use them (kernelhub/_pallas/tpu/grouped_matmul.py and
transposed_grouped_matmul.py) differ in which of them lie on a TPU vector's lanes (128 wide)
and which on its sublanes (8 rows of 32 bits, so 16 rows of a 16-bit type), and a block's last
two dimensions must be multiples of those or span the whole array axis. A tile larger than its
axis is cut to the axis, which is always legal.

The default is chosen per kernel, shape and TPU generation (`hardware.Chip`) by a roofline
estimate over candidate tilings whose buffers fit the generation's VMEM; see docs/tpu.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas import four_bit_bits
from kernelhub._pallas.tpu import mxu
from kernelhub._pallas.tpu.hardware import Chip

LANES = 128
GRID_STEP_SECONDS = 0.35e-6  # fixed cost of one grid step on a TensorCore


@dataclasses.dataclass(frozen=True)
class Tiles:
    tm: int
    tk: int
    tn: int

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.tm, self.tk, self.tn)


def row_axis_on_lanes(problem: Problem) -> bool:
    """tgmm reads lhs as [k, m] blocks (tk, tm): its tm runs along the lanes."""
    return problem.kernel is Kernel.TGMM


def compute_bytes(problem: Problem) -> int:
    """Bytes per element of an operand tile cast for the MXU, for the VMEM estimate: bf16 x bf16
    as loaded; any other pair counted as float32, the widest cast (mxu.compute_dtype's choice
    depends on the chip, which the VMEM estimate does not take: it stays an upper bound)."""
    both_bf16 = np.dtype(problem.lhs_dtype) == np.dtype(problem.rhs_dtype) == np.dtype("bfloat16")
    return 2 if both_bf16 else 4


def sublanes(dtype: Any) -> int:
    """Rows of `dtype` in one vector register: 8 for 32-bit types, 16 for 16-bit ones, 64 for
    4-bit ones (packed; numpy gives them an itemsize of one byte)."""
    return 8 * (32 // four_bit_bits.stored_bits(dtype))


def row_granule(problem: Problem) -> int:
    """What tm must be a multiple of (unless it spans all m rows)."""
    if row_axis_on_lanes(problem):
        return LANES
    return max(sublanes(problem.lhs_dtype), sublanes(problem.out_dtype))


def depth_granule(problem: Problem) -> int:
    """What tk must be a multiple of (unless it spans all k)."""
    if row_axis_on_lanes(problem):  # tgmm: tk is the sublane axis of lhs and out blocks
        return max(sublanes(problem.lhs_dtype), sublanes(problem.out_dtype))
    return LANES


def _clamp(tiles: Tiles, problem: Problem) -> Tiles:
    # A symbolic m (shape-polymorphic export) keeps its tile: its blocks run past the rows.
    tm = min(tiles.tm, problem.m) if is_static(problem.m) else tiles.tm
    return Tiles(tm, min(tiles.tk, problem.k), min(tiles.tn, problem.n))


def check(tiling: Any, problem: Problem, source: str = "tiling") -> Tiles:
    """`tiling` as Tiles fitted to the problem, or a ValueError naming the rule it breaks."""
    if not (isinstance(tiling, (tuple, list)) and len(tiling) == 3 and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t > 0 for t in tiling)):
        raise ValueError(
            f"{source} for the Pallas TPU kernels must be three positive ints (tm, tk, tn), "
            f"got {tiling!r}"
        )
    tiles = _clamp(Tiles(*(int(t) for t in tiling)), problem)
    rules = (
        ("tm", tiles.tm, problem.m, "m", row_granule(problem)),
        ("tk", tiles.tk, problem.k, "k", depth_granule(problem)),
        ("tn", tiles.tn, problem.n, "n", LANES),
    )
    for name, tile, axis, axis_name, granule in rules:
        if not is_static(axis) and tile % granule:
            raise ValueError(
                f"{source}={tuple(tiling)!r}: {name}={tile} must be a multiple of {granule}: "
                f"{axis_name} is symbolic ({axis}), so no tile can span it")
        if is_static(axis) and tile != axis and tile % granule:
            where = "lanes" if granule == LANES else "sublanes"
            raise ValueError(
                f"{source}={tuple(tiling)!r}: {name}={tile} must be a multiple of {granule} (it "
                f"runs along the TPU's {where} in {problem.kernel.value}) or at least "
                f"{axis_name}={axis}"
            )
    return tiles


def resolve(tiling: Any, problem: Problem, default: Callable[[Problem], Tiles]) -> Tiles:
    """The tiles a kernel uses: a tuple, a callable's answer, or `default` for None."""
    source = "tiling"
    if callable(tiling):
        source = f"tiling({problem.m}, {problem.k}, {problem.n})"
        tiling = tiling(problem.m, problem.k, problem.n)
    if tiling is None:
        if problem.static:
            return default(problem)
        # The default for a symbolic m is the default for NOMINAL_ROWS rows, whose tm is a
        # multiple of its granule, as a tile that cannot be cut to m must be.
        return _clamp(default(dataclasses.replace(problem, m=NOMINAL_ROWS)), problem)
    return check(tiling, problem, source)


# A symbolic m (shape-polymorphic export) gets the default tiles of this many rows: more than
# any whole-axis candidate (_ROW_CANDIDATES), and a common count of routed tokens.
NOMINAL_ROWS = 4096


# --- the default on a TPU -------------------------------------------------------------------

_ROW_CANDIDATES = (128, 256, 512, 1024)
_LANE_CANDIDATES = tuple(LANES * f for f in (1, 2, 3, 4, 6, 8, 12, 16))


def _axis_candidates(axis: int, granule: int, preferred: tuple[int, ...]) -> list[int]:
    """Legal tiles for an axis: the preferred sizes below it, and the whole axis when small."""
    sizes = {t for t in preferred if t < axis and t % granule == 0}
    if axis <= preferred[-1]:
        sizes.add(axis)
    return sorted(sizes)


def vmem_bytes(tiles: Tiles, problem: Problem) -> int:
    """VMEM the kernel's buffers take: double-buffered blocks, the accumulator, temporaries."""
    tm, tk, tn = tiles.as_tuple()
    if row_axis_on_lanes(problem):
        inputs, out = tk * tm + tm * tn, tk * tn
    else:
        inputs, out = tm * tk + tk * tn, tm * tn
    out_buffers = 2 * (2 if problem.has_existing else 1)
    return (2 * inputs * problem.input_bytes  # input blocks, double-buffered
            + out_buffers * out * problem.output_bytes  # output (and existing_out) blocks
            + 2 * out * 4  # float32 accumulator and the product added to it
            + inputs * compute_bytes(problem))  # operands cast and masked for the MXU


def estimated_seconds(tiles: Tiles, problem: Problem, chip: Chip) -> float:
    """A roofline estimate of the kernel's time, only used to rank tilings.

    Assumes tokens spread evenly over the groups; counts the grid steps that multiply (each
    bound by the MXU or by HBM), the steps that only pass by, and the output traffic.
    """
    tm, tk, tn = tiles.as_tuple()
    p = problem
    on_lanes = row_axis_on_lanes(p)
    mxu_fill = min(1.0, tn / chip.mxu) * min(1.0, (tm if on_lanes else tk) / chip.mxu)
    flops_per_s = mxu.products_per_second(p.lhs_dtype, p.rhs_dtype, chip) * mxu_fill
    m_tiles = math.ceil(p.m / tm)
    items = m_tiles + p.local_groups - 1  # the schedule's length (metadata.py)
    busy = min(math.ceil(p.m * p.local_groups / p.num_groups / tm) + p.local_groups - 1, items)
    k_tiles, n_tiles = math.ceil(p.k / tk), math.ceil(p.n / tn)
    step_bytes = (tm * tk + tk * tn if not on_lanes else tk * tm + tm * tn) * p.input_bytes
    step = max(2 * tm * tk * tn / flops_per_s, step_bytes / chip.hbm_bytes_per_s)
    existing = 2 if p.has_existing else 1
    if on_lanes:  # grid (n, k, items): each output block [group, tk, tn] written once
        parallel_blocks = n_tiles * k_tiles
        per_block = busy * step + items * GRID_STEP_SECONDS + (
            p.local_groups * tk * tn * p.output_bytes * existing / chip.hbm_bytes_per_s)
    else:  # grid (n, items, k): each output block [tm, tn] written once
        parallel_blocks = n_tiles
        per_block = busy * k_tiles * step + items * k_tiles * GRID_STEP_SECONDS + (
            m_tiles * tm * tn * p.output_bytes * existing / chip.hbm_bytes_per_s)
    # Megacore chips split the parallel axes between their cores.
    return per_block * math.ceil(parallel_blocks / chip.cores)


def legal_tilings(problem: Problem) -> list[tuple[int, int, int]]:
    """The (tm, tk, tn) the default and the autotuner choose among, smallest first."""
    on_lanes = row_axis_on_lanes(problem)
    row_step, depth_step = row_granule(problem), depth_granule(problem)
    row_sizes = _ROW_CANDIDATES if on_lanes else (row_step, 64, *_ROW_CANDIDATES)
    depth_sizes = (depth_step, 64, *_ROW_CANDIDATES, 2048) if on_lanes else _LANE_CANDIDATES
    rows = _axis_candidates(problem.m, row_step, row_sizes)
    depth = _axis_candidates(problem.k, depth_step, depth_sizes)
    cols = _axis_candidates(problem.n, LANES, _LANE_CANDIDATES)
    return list(itertools.product(rows, depth, cols))


def default_for_chip(problem: Problem, chip: Chip) -> Tiles:
    """The fitting tiling with the lowest estimated time (ties: the smaller footprint)."""
    best, best_key = None, None
    for tm, tk, tn in legal_tilings(problem):
        tiles = Tiles(tm, tk, tn)
        footprint = vmem_bytes(tiles, problem)
        if footprint > chip.tile_budget_bytes:
            continue
        key = (estimated_seconds(tiles, problem, chip), footprint)
        if best_key is None or key < best_key:
            best, best_key = tiles, key
    if best is None:  # nothing fits: the smallest legal tiles
        best = Tiles(*next(iter(legal_tilings(problem))))
    return best


# --- the default in interpret mode ----------------------------------------------------------


def default_for_interpret(problem: Problem) -> Tiles:
    """Small legal tiles, so that emulating test-sized problems walks a real schedule.

    About one group's rows per row tile gives several row tiles and tiles shared by groups;
    emulation costs grow with both the grid's steps and the blocks' sizes, hence the caps.
    """
    granule = row_granule(problem)
    expected_rows = max(problem.m // problem.num_groups, 1)
    tm = granule
    while tm * 2 <= min(expected_rows, 256):
        tm *= 2
    depth_cap = 256 if row_axis_on_lanes(problem) else 512
    return _clamp(Tiles(tm, depth_cap, 512), problem)
