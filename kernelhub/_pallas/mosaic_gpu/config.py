"""The tiles a Mosaic GPU call runs (`from_tiling`): its `tiling`, checked, else the heuristic's.

A `tiling` is `(block_m, block_k, block_n[, stages[, compute_warpgroups[, group_span[, upcast[,
programs_per_sm]]]]])` (megablox's order; `m` is the grouped axis for both ops: gmm's output rows,
tgmm's summed rows), a callable `(m, k, n) -> tuple | None`, or None for the heuristic. `stages` is
how many TMA loads the pipeline keeps in flight. `compute_warpgroups=2` warp-specializes the
program: a memory warpgroup loads for two compute warpgroups, each of block_n / 2 columns
(gmm_warp_specialized.py, tgmm_warp_specialized.py). `group_span` (tgmm only) is how many
consecutive groups one work item sums through one pipeline, storing a tile at each group's end
(group_spans.py); 1 runs a pipeline per group. `upcast` (an 8-bit operand,
`operand_types.upcast_applies`; in tgmm one compute warpgroup): 1 converts each step's 8-bit tiles
in shared memory to a 16-bit type (`operand_types.converted_dtype`) and multiplies on 16-bit wgmma,
which reads every operand as stored (beside a float32 operand: to float32, for float32 wgmma, which
reads both K-major); 0 copies first: two 8-bit operands of one kind are multiplied as stored on
8-bit wgmma, which reads B only K-major, so gmm's weights [G, k, n] are transposed to [G, n, k] (a
copy of all of them), and an 8-bit operand beside a 16-bit one, or of another 8-bit kind, is widened
whole to bf16 (float32 beside float32; a copy of it). Left out, the roofline decides
(`roofline.upcast_pays`); where it does not apply, 0 is the same as leaving it out.
`programs_per_sm` (1 to 4; above 1, one compute warpgroup only) is how many programs of the
persistent grid share an SM: each has its share of the SM's shared memory, and one program's loads
are in flight while another waits, where a work item is too short for its own pipeline to overlap
anything (tgmm at 64 rows per expert: one chunk per item; on the H100 of 2026-11-27 two per SM ran
those tgmms 1.14x to 1.62x faster). Programs whose registers do not fit the SM together run one
after another: correct, only slower. A call with scale blocks (scale_blocks.py) cuts whatever tiling
it gets to fit them (`scale_fitting.within_scale_block`, `scale_fitting.within_output_block`).

The rules a tiling must keep are block_rules.py's (each broken one a ValueError naming it,
`validate`); the heuristic's tiles are heuristic.py's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas.mosaic_gpu import (heuristic, operand_types, roofline, scale_fitting,
                                          shared_memory)
from kernelhub._pallas.mosaic_gpu.block_rules import (LAYOUT_ROWS, MAX_COLUMNS, MAX_CONTRACTION,
                                                      MAX_PROGRAMS_PER_SM, MAX_STAGES, MIN_BLOCK,
                                                      MIN_STEP_BYTES, OUTPUT_ROWS, TMA_ROW_BYTES,
                                                      BlockConfig, contraction_block,
                                                      conversion_problem, min_columns,
                                                      min_contraction, output_rows_block,
                                                      power_of_two)

TILING_FORM = ("(block_m, block_k, block_n[, stages[, compute_warpgroups[, group_span[, "
               "upcast[, programs_per_sm]]]]])")


def validate(config: BlockConfig, problem: Problem, source: Any,
             weight_tiles: int = 1) -> BlockConfig:
    """Raises a ValueError naming the broken rule; `source` is what the user passed,
    `weight_tiles` the weight tiles a gmm step loads (2 for a gated unit)."""
    kernel = problem.kernel
    rows = output_rows_block(kernel)
    for name in ("block_m", "block_k", "block_n"):
        size = getattr(config, name)
        if not power_of_two(size):
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
    if config.compute_warpgroups not in (1, 2):
        raise ValueError(f"tiling {source!r}: compute_warpgroups={config.compute_warpgroups} "
                         f"must be 1 or 2")
    if config.compute_warpgroups == 2 and config.group_span != 1:
        raise ValueError(f"tiling {source!r}: compute_warpgroups=2 sums one group per work "
                         f"item; group_span={config.group_span} takes 1 compute warpgroup")
    if config.group_span < 1 or (config.group_span != 1 and kernel is not Kernel.TGMM):
        raise ValueError(f"tiling {source!r}: group_span={config.group_span} must be at least "
                         f"1, and 1 for gmm (tgmm's groups per work item)")
    if config.upcast is not None:
        _check_upcast(config, problem, source)
    if config.programs_per_sm not in range(1, MAX_PROGRAMS_PER_SM + 1) or (
            config.programs_per_sm > 1 and config.compute_warpgroups != 1):
        raise ValueError(f"tiling {source!r}: programs_per_sm={config.programs_per_sm} must be "
                         f"1 to {MAX_PROGRAMS_PER_SM} with one compute warpgroup, and 1 with "
                         f"two (the registers of two programs of three warpgroups do not fit "
                         f"one SM)")
    name = contraction_block(kernel)
    if getattr(config, name) < min_contraction(problem):
        raise ValueError(f"tiling {source!r}: {name}={getattr(config, name)} is the "
                         f"contraction step, at least {min_contraction(problem)} here: "
                         + ("tgmm zeroes other groups' rows of it in wgmma's layout, "
                            f"{LAYOUT_ROWS} rows at a time" if kernel is Kernel.TGMM else
                            f"wgmma takes {MIN_STEP_BYTES} bytes at a time"))
    least = min_columns(problem, config.compute_warpgroups)
    if config.warpgroup_columns < least:
        each = "" if config.compute_warpgroups == 1 else (
            f" for each of the {config.compute_warpgroups} compute warpgroups' halves")
        raise ValueError(f"tiling {source!r}: block_n={config.block_n} must be at least "
                         f"{least * config.compute_warpgroups}{each} here: " + (
                             f"an output row is a multiple of {TMA_ROW_BYTES} bytes, where "
                             f"TMA stores from (a {problem.out_dtype} output)"
                             if kernel is not Kernel.TGMM else
                             f"each compute warpgroup multiplies its own {LAYOUT_ROWS} or more "
                             f"columns of the tile" if config.compute_warpgroups > 1 else
                             f"{problem.rhs_dtype} weights are tiled [block_n, block_m], and "
                             f"tgmm masks them in wgmma's layout, {LAYOUT_ROWS} rows at a time"))
    needed = shared_memory.needed(config, problem, weight_tiles)
    if needed > shared_memory.limit(config):
        per = ("block" if config.programs_per_sm == 1 else
               f"program when {config.programs_per_sm} share an SM")
        raise ValueError(f"tiling {source!r}: its {config.stages} stages and output tile take "
                         f"{needed} bytes of shared memory, over Hopper's "
                         f"{shared_memory.limit(config)} per {per}; take fewer stages or "
                         f"smaller blocks")
    return config


def _check_upcast(config: BlockConfig, problem: Problem, source: Any) -> None:
    if not operand_types.upcast_applies(problem):
        raise ValueError(
            f"tiling {source!r}: upcast={int(config.upcast)} is for an 8-bit operand beside a "
            f"16-bit or float32 one (not 8-bit weights [G, k, n] beside float32, which float32 "
            f"wgmma reads only after a transpose) or one of another 8-bit kind, and for two "
            f"8-bit operands of one kind (fp8, or int8 whose sums fit int32) in gmm with "
            f"weights [G, k, n] only (8-bit wgmma reads those only after a copy); this is a "
            f"{problem.kernel} of {problem.lhs_dtype} x {problem.rhs_dtype}: leave it out, or "
            f"0")
    unfit = conversion_problem(config, problem)
    if unfit is not None:
        raise ValueError(f"tiling {source!r}: upcast=1 converts tiles in shared memory, but "
                         f"{unfit}: take larger blocks, or upcast=0")
    if config.upcast and config.compute_warpgroups != 1 and problem.kernel is Kernel.TGMM:
        raise ValueError(f"tiling {source!r}: upcast=1 in tgmm is written for one compute "
                         f"warpgroup; compute_warpgroups={config.compute_warpgroups} takes "
                         f"upcast=0")


# Computations that may hold an XLA CPU client thread while an interpreted kernel's
# warpgroups run: the caller's and the interpreted kernel's own (kernel_parts.launch).
INTERPRETER_CALLERS = 2


def check_static(problem: Problem) -> None:
    """A ValueError for a symbolic m, k or n (shape-polymorphic export): TMA boxes, the grid of
    work and the padding to whole tiles are all static. (The registry routes such calls
    elsewhere: these kernels do not list the symbolic_shapes feature.)"""
    for name in ("m", "k", "n"):
        if not is_static(getattr(problem, name)):
            raise ValueError(f"the Mosaic GPU kernels take static shapes only; {name} is the "
                             f"symbolic dimension {getattr(problem, name)}")


def from_tiling(tiling: Any, problem: Problem, weight_tiles: int = 1, *,
                interpret: bool = False, scale_block: int | None = None,
                output_block: int | None = None, wider_than_key: bool = False
                ) -> BlockConfig:
    """The config a call uses: `tiling` when it names one, else the heuristic's (interpreted, with
    one compute warpgroup: `heuristic.heuristic`). `weight_tiles`: 2 for a gated unit's gmm (two
    accumulators, two weight tiles a step). `scale_block`: the length every scale block along gmm's
    k is made of (ContractionScales.common_block), for which the config is cut
    (`scale_fitting.within_scale_block`); `output_block`: the block along the output tile (gmm's
    weights' columns, tgmm's lhs rows), where each step's lhs tile is scaled
    (`scale_fitting.within_output_block`). `wider_than_key`: a call with scale blocks, whose tiles
    are wider than its table key's types (float32 copies, a float32 cotangent, operands widened
    first): the tiling is fitted to them (scale_fitting.within_blocks)."""
    check_static(problem)
    chosen = tiling(problem.m, problem.k, problem.n) if callable(tiling) else tiling
    if chosen is None:
        config = heuristic.heuristic(problem, weight_tiles,
                                     warp_specialize=not interpret and output_block is None)
        config = scale_fitting.within_blocks(config, problem, weight_tiles, scale_block,
                                             output_block, wider_than_key)
        return _upcast_decided(shared_memory.stages_that_fit(config, problem, weight_tiles),
                               problem, weight_tiles)
    if isinstance(chosen, BlockConfig):
        config = scale_fitting.within_blocks(chosen, problem, weight_tiles, scale_block,
                                             output_block, wider_than_key)
        config = validate(config, problem, chosen, weight_tiles)
        if interpret:
            check_interpretable(config, chosen)
        return _upcast_decided(config, problem, weight_tiles)
    if not isinstance(chosen, (tuple, list)) or not 3 <= len(chosen) <= 8 or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in chosen):
        raise ValueError(f"tiling {chosen!r} must be a tuple of ints {TILING_FORM}")
    values = [int(v) for v in chosen]
    warpgroups = values[4] if len(values) >= 5 else 1
    span = values[5] if len(values) >= 6 else 1
    upcast = None
    if len(values) >= 7:
        if values[6] not in (0, 1):
            raise ValueError(f"tiling {chosen!r}: upcast={values[6]} must be 0 or 1")
        # 0 where upcast does not apply means nothing (it holds the place of programs_per_sm).
        upcast = bool(values[6]) if values[6] or operand_types.upcast_applies(problem) else None
    programs = values[7] if len(values) == 8 else 1
    if len(values) >= 4:
        stages = values[3]
    else:
        # The heuristic's stages where it has as many compute warpgroups, else the default's;
        # as many of them as fit.
        guide = heuristic.heuristic(problem, weight_tiles)
        stages = shared_memory.stages_that_fit(
            BlockConfig(*values[:3], guide.stages if guide.compute_warpgroups == warpgroups
                        else BlockConfig.stages, warpgroups, upcast=upcast),
            problem, weight_tiles).stages
    config = scale_fitting.within_blocks(
        BlockConfig(*values[:3], stages, warpgroups, span, upcast, programs), problem,
        weight_tiles, scale_block, output_block, wider_than_key)
    config = validate(config, problem, chosen, weight_tiles)
    if interpret:
        check_interpretable(config, chosen)
    return _upcast_decided(config, problem, weight_tiles)


def interpreter_threads(warpgroups: int, devices: int = 1) -> int:
    """The XLA CPU client threads an interpreted kernel of `warpgroups` warpgroups a program
    needs, launched from `devices` devices at once: one turn at a time (kernel_parts.launch),
    each waiting device's call holding a thread, and the kernel's own warpgroups and callers."""
    return devices - 1 + warpgroups + INTERPRETER_CALLERS


def check_interpretable(config: BlockConfig, tiling: Any) -> None:
    """Raises ValueError where this host's interpreter could not finish `config`'s program.

    Interpreted, each warpgroup of a warp-specialized program is a computation of its own on
    XLA's CPU client, all of a program's at once, since they wait on each other's barriers;
    the client runs a computation too large to run inline on one of its threads, and the
    computations that launched the kernel may hold one each. With fewer threads the last
    warpgroups never start and the others wait forever: refused rather than hung."""
    if config.compute_warpgroups == 1:
        return
    from kernelhub._core.jax_internals import xla_cpu_client_threads

    needed = interpreter_threads(config.compute_warpgroups + 1)
    threads = xla_cpu_client_threads()
    if threads < needed:
        raise ValueError(
            f"tiling {tiling!r}: interpreted, compute_warpgroups={config.compute_warpgroups} "
            f"runs {config.compute_warpgroups + 1} warpgroups at once, each a computation "
            f"on XLA's CPU client, which has {threads} threads here (the NPROC environment "
            f"variable, else the cores): set NPROC={needed} or more before jax starts, or "
            f"take compute_warpgroups=1")


def check_interpreted_devices(devices: int, warpgroups: int) -> None:
    """Raises ValueError where an interpreted kernel launched from `devices` devices at once
    (under shard_map) could not finish: jax's interpreter simulates one GPU per process, so
    launches take turns, and each device's call waits holding one of XLA's CPU client
    threads; with too few left for the running kernel, every call waits forever (8 devices on
    8 threads hung): refused rather than hung."""
    from kernelhub._core.jax_internals import xla_cpu_client_threads

    needed = interpreter_threads(warpgroups, devices)
    threads = xla_cpu_client_threads()
    if devices > 1 and threads < needed:
        raise ValueError(
            f"the Mosaic GPU interpreter is launched here from {devices} devices at once "
            f"(under shard_map), one kernel at a time, each waiting call holding one of XLA's "
            f"CPU client threads, of which there are {threads} (the NPROC environment "
            f"variable, else the cores): set NPROC={needed} or more before jax starts, use "
            f"fewer devices, or another interpreter (platform='pallas' or 'triton')")


def _upcast_decided(config: BlockConfig, problem: Problem, weight_tiles: int) -> BlockConfig:
    """`config` with `upcast` set where it applies and was left out: roofline.upcast_pays, where the
    float16 tiles fit beside the stages (cut to fit, not below 2) and have the rows conversion
    takes (block_rules.conversion_problem)."""
    if config.upcast is not None or not operand_types.upcast_applies(problem):
        return config
    if roofline.upcast_pays(problem, config.compute_warpgroups):
        upcast = shared_memory.stages_that_fit(dataclasses.replace(config, upcast=True),
                                               problem, weight_tiles)
        if (shared_memory.fits(upcast, problem, weight_tiles)
                and conversion_problem(upcast, problem) is None):
            return upcast
    return dataclasses.replace(config, upcast=False)
