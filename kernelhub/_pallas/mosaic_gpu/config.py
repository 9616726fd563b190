"""Tiles of the Mosaic GPU grouped matmuls: the heuristic and the `tiling` override.

A `tiling` is `(block_m, block_k, block_n[, stages[, compute_warpgroups[, group_span[, upcast[,
programs_per_sm]]]]])` (megablox's order; `m` is the grouped axis for both ops: gmm's output rows,
tgmm's summed rows), a callable `(m, k, n) -> tuple | None`, or None for the heuristic. `stages` is
how many TMA loads the pipeline keeps in flight. `compute_warpgroups=2` warp-specializes the
program: a memory warpgroup loads for two compute warpgroups, each of block_n / 2 columns
(gmm_warp_specialized.py, tgmm_warp_specialized.py). `group_span` (tgmm only) is how many
consecutive groups one work item sums through one pipeline, storing a tile at each group's end
(group_spans.py); 1 runs a pipeline per group. `upcast` (an 8-bit operand, `upcast_applies`; in tgmm
one compute warpgroup): 1 converts each step's 8-bit tiles in shared memory to a 16-bit type
(`converted_dtype`) and multiplies on 16-bit wgmma, which reads every operand as stored (beside a
float32 operand: to float32, for float32 wgmma, which reads both K-major); 0 copies first: two 8-bit
operands of one kind are multiplied as stored on 8-bit wgmma, which reads B only K-major, so gmm's
weights [G, k, n] are transposed to [G, n, k] (a copy of all of them), and an 8-bit operand beside a
16-bit one, or of another 8-bit kind, is widened whole to bf16 (float32 beside float32; a copy of
it). Left out, the roofline decides (`upcast_pays`); where it does not apply, 0 is the same as
leaving it out. `programs_per_sm` (1 to 4; above 1, one compute warpgroup only) is how many programs
of the persistent grid share an SM: each has its share of the SM's shared memory, and one program's
loads are in flight while another waits, where a work item is too short for its own pipeline to
overlap anything (tgmm at 64 rows per expert: one chunk per item; on the H100 of 2026-11-27 two per
SM ran those tgmms 1.14x to 1.62x faster). Programs whose registers do not fit the SM together run
one after another: correct, only slower. A call with scale blocks (scale_blocks.py) cuts whatever
tiling it gets to fit them (`within_scale_block`, `within_output_block`).

What Hopper fixes (each rule below found by lowering or running on an H100):
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
- (a choice, not found by a fault) a warp-specialized tgmm's compute warpgroups each multiply
  a column half of the shared weight-side tile, kept to at least 64 columns (whole 128-byte
  swizzled rows of 16-bit values): narrower halves lower, but no GPU has run them;
- the pipeline's stages, the output tile and a little more fit one block's 227 KiB of shared
  memory (a warp-specialized kernel's output tiles, beside its pipeline, in 64-row pieces
  where whole ones do not fit: `output_tile_rows`);
- (a choice) the heuristic gives one warpgroup at most 128 x 128 float32 sums, 128 of the 255
  registers a thread has (a gated unit's two sums share them).
The heuristic reads shapes and dtypes only, never group sizes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kernelhub import quantization
from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul import gpu_peaks
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
# TMA's shared-memory side is addressed in 128-byte units: gmm's output rows are a whole one.
TMA_ROW_BYTES = 128
# gmm's row tiles start at multiples of this many rows (visits.py's row_align): TMA copies a
# tile to shared memory in swizzled groups of 8 rows, and the global rows are cut the same way.
ROW_ALIGN = 8
# Rows of a tile of wgmma's operand layout (tgmm's register masks).
LAYOUT_ROWS = 64
# Shared memory one block may take on Hopper (227 KiB), and what the kernels take beside the
# pipeline and the output tile (barriers, the epilogue's vectors).
SHARED_MEMORY_BYTES = 232448
# An SM's shared memory (228 KiB), of which the hardware reserves 1 KiB per resident block:
# what each of several programs per SM may take.
SM_SHARED_MEMORY_BYTES = 233472
BLOCK_RESERVED_BYTES = 1024
MAX_PROGRAMS_PER_SM = 4
# Streaming multiprocessors of an H100 SXM and an H200: the persistent grid's programs per
# programs_per_sm, and the heuristic's measure of whether a problem has work for more.
HOPPER_SMS = 132
SHARED_MEMORY_SLACK = 4096
# Mosaic GPU places each shared-memory allocation at a multiple of this many bytes.
SMEM_ALIGNMENT = 1024
TILING_FORM = ("(block_m, block_k, block_n[, stages[, compute_warpgroups[, group_span[, "
               "upcast[, programs_per_sm]]]]])")
# Types whose wgmma reads the B operand K-major only.
K_MAJOR_ONLY = ("float32", "float8_e4m3fn", "float8_e5m2", "int8")
# What 8-bit tiles are converted to for 16-bit wgmma (`upcast`): Hopper converts fp8 to
# float16 in one instruction (to bfloat16 only through float32), and float16 holds every e4m3,
# e5m2 and int8 value exactly.
UPCAST_DTYPE = np.dtype(np.float16)
# The roofline of `upcast_pays` and `compute_bound`: an H100 SXM's spec sheet (an H200's
# differs only in HBM); only the ratios of its rates matter.
_ROOFLINE_PEAK = gpu_peaks.peak_for("H100 SXM")
# The warp-specialized tile the heuristic gives a compute-bound call: 128 output rows by 256
# columns, 128 a compute warpgroup (`compute_bound`, `_warp_specialized`).
WIDE_ROWS, WIDE_COLUMNS = 128, 256
# Its stages at most: what the tables' warp-specialized tiling ran on the H100 (2026-11-28),
# and so a deeper pipeline never takes the place of whole output tiles (`output_tile_rows`).
WIDE_STAGES = 3
# The float32 sums the heuristic gives one warpgroup: 128 registers of each of its threads,
# of the 255 a thread can have (a gated unit's two sums share them).
ACCUMULATOR_ELEMENTS = 128 * 128


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    block_m: int
    block_k: int
    block_n: int
    stages: int = 4
    compute_warpgroups: int = 1
    group_span: int = 1
    upcast: bool | None = None  # None: not an 8-bit gmm of weights [G, k, n], or not decided
    programs_per_sm: int = 1
    # Not part of the tiling: set for a gmm with scale blocks along k (`within_scale_block`),
    # or a call whose output tiles lie inside one scale block (`within_output_block`).
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


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def _next_power_of_two(value: int) -> int:
    return 1 << max(int(value) - 1, 0).bit_length()


def output_rows_block(kernel: Kernel) -> str:
    """The block that is the output tile's rows: the wgmma's M."""
    return "block_k" if kernel is Kernel.TGMM else "block_m"


def contraction_block(kernel: Kernel) -> str:
    return "block_m" if kernel is Kernel.TGMM else "block_k"


def validate(config: BlockConfig, problem: Problem, source: Any,
             weight_tiles: int = 1) -> BlockConfig:
    """Raises a ValueError naming the broken rule; `source` is what the user passed,
    `weight_tiles` the weight tiles a gmm step loads (2 for a gated unit)."""
    kernel = problem.kernel
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
    needed = shared_memory_bytes(config, problem, weight_tiles)
    if needed > shared_memory_limit(config):
        per = ("block" if config.programs_per_sm == 1 else
               f"program when {config.programs_per_sm} share an SM")
        raise ValueError(f"tiling {source!r}: its {config.stages} stages and output tile take "
                         f"{needed} bytes of shared memory, over Hopper's "
                         f"{shared_memory_limit(config)} per {per}; take fewer stages or "
                         f"smaller blocks")
    return config


def shared_memory_limit(config: BlockConfig) -> int:
    """The shared memory one program may take: a block's most, or its share of the SM."""
    if config.programs_per_sm == 1:
        return SHARED_MEMORY_BYTES
    return SM_SHARED_MEMORY_BYTES // config.programs_per_sm - BLOCK_RESERVED_BYTES


def _check_upcast(config: BlockConfig, problem: Problem, source: Any) -> None:
    if not upcast_applies(problem):
        raise ValueError(
            f"tiling {source!r}: upcast={int(config.upcast)} is for an 8-bit operand beside a "
            f"16-bit or float32 one (not 8-bit weights [G, k, n] beside float32, which float32 "
            f"wgmma reads only after a transpose) or one of another 8-bit kind, and for two "
            f"8-bit operands of one kind (fp8, or int8 whose sums fit int32) in gmm with "
            f"weights [G, k, n] only (8-bit wgmma reads those only after a copy); this is a "
            f"{problem.kernel} of {problem.lhs_dtype} x {problem.rhs_dtype}: leave it out, or "
            f"0")
    if config.upcast and config.compute_warpgroups != 1 and problem.kernel is Kernel.TGMM:
        raise ValueError(f"tiling {source!r}: upcast=1 in tgmm is written for one compute "
                         f"warpgroup; compute_warpgroups={config.compute_warpgroups} takes "
                         f"upcast=0")


def converted_dtype(lhs_dtype: Any, rhs_dtype: Any) -> np.dtype | None:
    """What `upcast` converts a call's 8-bit tiles to: float16 beside another 8-bit operand,
    else the other operand's type (float16, bfloat16 and float32 hold every int8, e4m3 and
    e5m2 value exactly); None without an 8-bit operand."""
    lhs, rhs = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
    widths = {lhs.itemsize, rhs.itemsize}
    if 1 not in widths:
        return None
    return UPCAST_DTYPE if widths == {1} else (lhs if lhs.itemsize != 1 else rhs)


def multiplied_dtype(config: BlockConfig, lhs_dtype: Any, rhs_dtype: Any) -> np.dtype:
    """What a gmm body's wgmma multiplies, its refs holding `lhs_dtype` and `rhs_dtype`: with
    upcast `converted_dtype`, else theirs (the caller cast both to kernel_dtype)."""
    return (converted_dtype(lhs_dtype, rhs_dtype) if config.upcast
            else np.dtype(lhs_dtype))


def upcast_applies(problem: Problem) -> bool:
    """Whether the tiling's `upcast` entry chooses anything: an 8-bit operand beside a 16-bit
    one or one of another 8-bit kind (no 8-bit wgmma takes the pair), or, in gmm, two of one
    kind with weights [G, k, n] (8-bit wgmma reads those only after a K-major copy). Beside a
    float32 operand (a quantized call's gradients meet the float32 cotangent the kit folds the
    scales into) the converted tiles go to float32 wgmma, which reads both K-major: every such
    tile lies so but 8-bit weights [G, k, n], which would need a transpose as well."""
    converted = converted_dtype(problem.lhs_dtype, problem.rhs_dtype)
    if converted is None:
        return False
    if converted.name in K_MAJOR_ONLY:
        return not (problem.kernel is Kernel.GMM and np.dtype(problem.rhs_dtype).itemsize == 1)
    return operand_bytes(problem) != 1 or problem.kernel is Kernel.GMM


def upcast_pays(problem: Problem, compute_warpgroups: int = 1) -> bool:
    """Whether converting the 8-bit tiles in shared memory (16-bit wgmma, every operand read as
    stored) beats copying first, where one compute warpgroup runs. Warp-specialized (gmm only), the
    compute warpgroups would spend on conversions time they multiply in, in the compute-bound calls
    the heuristic warp-specializes: unmeasured, so the heuristic copies first there and the tuner
    times both. A pair no 8-bit wgmma takes is multiplied at the 16-bit rate (float32's beside
    float32) either way, and converting moves fewer bytes: always. Two 8-bit operands of one kind
    with weights [G, k, n], by the roofline: max(FLOPs / 16-bit peak, bytes / HBM) against max(FLOPs
    / 8-bit peak, bytes / HBM) + 2 * weight bytes / HBM (the K-major copy). Memory-bound calls
    (fine-grained MoE: 64 rows per expert) convert, compute-bound ones (Mixtral) copy. The tuner
    times both."""
    if not upcast_applies(problem):
        return False
    if compute_warpgroups != 1 or not problem.static:
        return False
    if operand_bytes(problem) != 1:
        return True
    m, k, n = problem.m, problem.k, problem.n
    flops = 2.0 * m * k * n
    weights = float(problem.local_groups) * k * n
    moved = m * k + weights + m * n * np.dtype(problem.out_dtype).itemsize
    hbm = _ROOFLINE_PEAK.tbps * 1e12
    memory = moved / hbm
    upcast = max(flops / (_ROOFLINE_PEAK.tflops["bf16"] * 1e12), memory)
    copied = max(flops / (_ROOFLINE_PEAK.tflops["fp8"] * 1e12), memory) + 2 * weights / hbm
    return upcast < copied


def compute_bound(problem: Problem) -> bool:
    """Whether the roofline's FLOPs take longer than its bytes, at the local groups' share of
    the rows: each operand's computed rows read once, the weights (gmm) or the output (tgmm)
    of the local groups moved once, gmm's whole output written once. Mixtral's passes are
    (1024 rows an expert), fine-grained MoE's (64) are not. False for symbolic shapes."""
    if not problem.static:
        return False
    m, k, n = problem.m, problem.k, problem.n
    # The local groups' expected rows (DeepSeek-V3's shard computes 32 of 256 experts' rows).
    rows = m * problem.local_groups / max(problem.num_groups, 1)
    width = operand_bytes(problem)
    out = np.dtype(problem.out_dtype).itemsize
    per_group = float(problem.local_groups) * k * n
    if problem.kernel is Kernel.TGMM:
        moved = (rows * k + rows * n) * width + per_group * out
    else:
        moved = (rows * k + per_group) * width + m * n * out
    rate = _ROOFLINE_PEAK.tflops["fp8" if width == 1 else "bf16"] * 1e12
    return 2.0 * rows * k * n / rate > moved / (_ROOFLINE_PEAK.tbps * 1e12)


def shared_memory_bytes(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> int:
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


def _pipeline_bytes(config: BlockConfig, problem: Problem, weight_tiles: int) -> int:
    """`stages` tiles of each operand (`weight_tiles` weight tiles per gmm step). With upcast,
    the stages hold the tiles as stored, and the converted copies of a step's 8-bit tiles stay
    beside them: two of each (one being converted while wgmma reads the other) with one
    compute warpgroup; warp-specialized, each compute warpgroup's own copy of the lhs tile and
    of its columns of the weight tiles (it waits for its products at every step). With scale
    blocks (`within_scale_block`, `within_output_block`) each step's scale vectors too."""
    scales = 0
    stages = max(config.stages, 2)
    if config.scaled_steps:
        # Each step's float32 row and column scales, conservatively for both operands: one
        # buffer of the row scales and one per weight tile, each a whole number of Mosaic GPU's
        # 1024-byte allocation units.
        scales = (round_up(stages * config.block_m * 4, SMEM_ALIGNMENT)
                  + weight_tiles * round_up(stages * config.block_n * 4, SMEM_ALIGNMENT))
    if config.scaled_lhs_tiles and problem.kernel is Kernel.TGMM:
        # Each chunk's float32 scales (the lhs copies are upcast's).
        scales = stages * config.block_m * 4
    elif config.scaled_lhs_tiles:
        # Each step's float32 scales along k, and two float32 copies of the lhs tile.
        scales = (stages + 2 * config.block_m) * config.block_k * 4
    if not config.upcast:
        return scales + (stages * _step_elements(config, problem, weight_tiles)
                         * operand_bytes(problem))
    widths = (np.dtype(problem.lhs_dtype).itemsize, np.dtype(problem.rhs_dtype).itemsize)
    counts = _operand_step_elements(config, problem, weight_tiles)
    pipeline = stages * sum(c * w for c, w in zip(counts, widths))
    converted = converted_dtype(problem.lhs_dtype, problem.rhs_dtype).itemsize
    copies = (2, 2) if config.compute_warpgroups == 1 else (config.compute_warpgroups, 1)
    return scales + pipeline + converted * sum(
        c * n for c, w, n in zip(counts, widths, copies) if w == 1)


def round_up(size: int, block: int) -> int:
    """`size` rounded up to a multiple of `block`."""
    return -(-size // block) * block


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


def accumulator_elements(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> int:
    """The float32 sums one compute warpgroup holds: its share of the output tile, once per
    weight tile (against ACCUMULATOR_ELEMENTS, the heuristic's bound)."""
    rows = getattr(config, output_rows_block(problem.kernel))
    return weight_tiles * rows * config.block_n // config.compute_warpgroups


def output_tile_rows(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> int:
    """Rows of each output tile a warp-specialized kernel keeps in shared memory beside its
    pipeline: all of the tile's (gmm's block_m, tgmm's block_k) where the whole tiles fit,
    else LAYOUT_ROWS, a piece of the accumulator stored after another (a float32 128 x 256
    tile takes 128 KiB, which 3 stages of 16-bit tiles leave no room for). Every other kernel
    keeps a whole tile."""
    rows = getattr(config, output_rows_block(problem.kernel))
    if config.compute_warpgroups == 1 or rows <= LAYOUT_ROWS:
        return rows
    whole = rows * config.block_n * np.dtype(problem.out_dtype).itemsize
    pipeline = _pipeline_bytes(config, problem, weight_tiles)
    fits = pipeline + whole + SHARED_MEMORY_SLACK <= shared_memory_limit(config)
    return rows if fits else LAYOUT_ROWS


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
    """The config a call uses: `tiling` when it names one, else the heuristic's (interpreted,
    with one compute warpgroup: `heuristic`). `weight_tiles`: 2 for a gated unit's gmm (two
    accumulators, two weight tiles a step). `scale_block`: the length every scale block along
    gmm's k is made of (ContractionScales.common_block), for which the config is cut
    (`within_scale_block`); `output_block`: the block along the output tile (gmm's weights'
    columns, tgmm's lhs rows), where each step's lhs tile is scaled
    (`within_output_block`). `wider_than_key`: a call with scale blocks, whose tiles are wider
    than its table key's types (float32 copies, a float32 cotangent, operands widened first):
    the tiling is fitted to them (`_fitting`)."""
    check_static(problem)
    chosen = tiling(problem.m, problem.k, problem.n) if callable(tiling) else tiling
    if chosen is None:
        config = heuristic(problem, weight_tiles,
                           warp_specialize=not interpret and output_block is None)
        config = _within_blocks(config, problem, weight_tiles, scale_block, output_block,
                                wider_than_key)
        return _upcast_decided(_stages_that_fit(config, problem, weight_tiles), problem,
                               weight_tiles)
    if isinstance(chosen, BlockConfig):
        config = _within_blocks(chosen, problem, weight_tiles, scale_block, output_block,
                                wider_than_key)
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
        upcast = bool(values[6]) if values[6] or upcast_applies(problem) else None
    programs = values[7] if len(values) == 8 else 1
    if len(values) >= 4:
        stages = values[3]
    else:
        # The heuristic's stages where it has as many compute warpgroups, else the default's;
        # as many of them as fit.
        guide = heuristic(problem, weight_tiles)
        stages = _stages_that_fit(
            BlockConfig(*values[:3], guide.stages if guide.compute_warpgroups == warpgroups
                        else BlockConfig.stages, warpgroups, upcast=upcast),
            problem, weight_tiles).stages
    config = _within_blocks(BlockConfig(*values[:3], stages, warpgroups, span, upcast, programs),
                            problem, weight_tiles, scale_block, output_block, wider_than_key)
    config = validate(config, problem, chosen, weight_tiles)
    if interpret:
        check_interpretable(config, chosen)
    return _upcast_decided(config, problem, weight_tiles)


def scale_steps_fit(problem: Problem, scale_block: int) -> bool:
    """Whether gmm's contraction steps can each lie inside one scale block of `scale_block`
    elements: a power of two dividing it is a legal block_k (MIN_STEP_BYTES)."""
    return scale_block & -scale_block >= min_contraction(problem)


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
    are."""
    step = min(config.block_k, scale_block & -scale_block)
    block_m, columns = config.block_m, config.warpgroup_columns
    least = min_columns(problem, config.compute_warpgroups)
    while 2 * weight_tiles * block_m * columns > ACCUMULATOR_ELEMENTS and columns > least:
        columns //= 2
    if 2 * weight_tiles * block_m * columns > ACCUMULATOR_ELEMENTS:
        block_m = min(OUTPUT_ROWS)
    return _stages_that_fit(
        dataclasses.replace(config, block_m=block_m, block_k=step,
                            block_n=columns * config.compute_warpgroups, scaled_steps=True),
        problem, weight_tiles)


def output_block_fits(problem: Problem, output_block: int) -> bool:
    """Whether the output tiles can each lie inside one scale block of `output_block` output
    columns (gmm's weights) or rows (tgmm's lhs): a power of two dividing it is a legal
    block_n, or tgmm's block_k."""
    least = min(OUTPUT_ROWS) if problem.kernel is Kernel.TGMM else min_columns(problem)
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
    return _stages_that_fit(dataclasses.replace(config, **cut), problem)


def _within_blocks(config: BlockConfig, problem: Problem, weight_tiles: int,
                   scale_block: int | None, output_block: int | None,
                   wider_than_key: bool) -> BlockConfig:
    if scale_block is not None:
        config = within_scale_block(config, scale_block, problem, weight_tiles)
    if output_block is not None:
        config = within_output_block(config, output_block, problem)
    if not wider_than_key:
        return config
    if config.upcast and not upcast_applies(problem):
        # An upcast for the key's types, which the widened tiles do not take.
        config = dataclasses.replace(config, upcast=None)
    return _fitting(config, problem, weight_tiles)


def _fitting(config: BlockConfig, problem: Problem, weight_tiles: int) -> BlockConfig:
    """`config` with fewer stages (not below 2), then its contraction block halved (a power of
    two dividing the scale block still), its programs per SM cut, its columns and output rows
    halved, until shared memory holds it: a call with scale blocks multiplies wider tiles than
    its key's types (float32 copies of 8-bit tiles, a float32 cotangent, operands widened
    first), which a table's tiling for that key did not count."""
    contraction, rows = contraction_block(problem.kernel), output_rows_block(problem.kernel)
    least_columns = min_columns(problem, config.compute_warpgroups) * config.compute_warpgroups
    config = _stages_that_fit(config, problem, weight_tiles)
    while shared_memory_bytes(config, problem, weight_tiles) > shared_memory_limit(config):
        if getattr(config, contraction) // 2 >= min_contraction(problem):
            config = dataclasses.replace(config,
                                         **{contraction: getattr(config, contraction) // 2})
        elif config.programs_per_sm > 1:
            config = dataclasses.replace(config, programs_per_sm=config.programs_per_sm - 1)
        elif config.block_n // 2 >= least_columns:
            config = dataclasses.replace(config, block_n=config.block_n // 2)
        elif getattr(config, rows) > min(OUTPUT_ROWS):
            config = dataclasses.replace(config, **{rows: min(OUTPUT_ROWS)})
        else:
            return config
        config = _stages_that_fit(config, problem, weight_tiles)
    return config


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

    needed = config.compute_warpgroups + 1 + INTERPRETER_CALLERS
    threads = xla_cpu_client_threads()
    if threads < needed:
        raise ValueError(
            f"tiling {tiling!r}: interpreted, compute_warpgroups={config.compute_warpgroups} "
            f"runs {config.compute_warpgroups + 1} warpgroups at once, each a computation "
            f"on XLA's CPU client, which has {threads} threads here (the NPROC environment "
            f"variable, else the cores): set NPROC={needed} or more before jax starts, or "
            f"take compute_warpgroups=1")


def _upcast_decided(config: BlockConfig, problem: Problem, weight_tiles: int) -> BlockConfig:
    """`config` with `upcast` set where it applies and was left out: `upcast_pays`, where the
    float16 tiles fit beside the stages (cut to fit, not below 2)."""
    if config.upcast is not None or not upcast_applies(problem):
        return config
    if upcast_pays(problem, config.compute_warpgroups):
        upcast = _stages_that_fit(dataclasses.replace(config, upcast=True), problem,
                                  weight_tiles)
        if shared_memory_bytes(upcast, problem, weight_tiles) <= shared_memory_limit(upcast):
            return upcast
    return dataclasses.replace(config, upcast=False)


def operand_bytes(problem: Problem) -> int:
    """Bytes per element of the tiles the kernel multiplies (kernel_dtype's choice)."""
    return np.dtype(problem_dtype(problem)).itemsize


def problem_dtype(problem: Problem) -> np.dtype:
    """kernel_dtype for `problem`'s operands and contraction (gmm's k, tgmm's summed rows)."""
    contraction = problem.m if problem.kernel is Kernel.TGMM else problem.k
    return kernel_dtype(problem.lhs_dtype, problem.rhs_dtype, contraction)


# The operand types wgmma multiplies as stored, both operands of one type.
_WGMMA_TYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")


def kernel_dtype(lhs_dtype: Any, rhs_dtype: Any, contraction: Any) -> np.dtype:
    """The one dtype both tiles are multiplied in: their own when they share a wgmma type, or
    int8 for two int8 operands whose int32 sums cannot wrap (`contraction` terms, the summed
    axis, at most quantization.MAX_EXACT_INT32_TERMS); else the narrowest float that holds
    both exactly (bfloat16 for 8-bit values, float32 beside a float32 operand or for float16
    with bfloat16)."""
    lhs, rhs = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
    if lhs == rhs and lhs.name in _WGMMA_TYPES:
        return lhs
    if lhs == rhs == np.dtype(np.int8) and is_static(contraction) and (
            contraction <= quantization.MAX_EXACT_INT32_TERMS):
        return lhs
    if "float32" in (lhs.name, rhs.name) or {lhs.name, rhs.name} == {"float16", "bfloat16"}:
        return np.dtype(np.float32)
    if "float16" in (lhs.name, rhs.name):
        return np.dtype(np.float16)
    return np.dtype("bfloat16")


def accumulator_dtype(multiplied: Any) -> np.dtype:
    """What wgmma sums tiles of the `multiplied` dtype in: int32 for int8 (exact, kernel_dtype
    bounds the terms), else float32. The kernels read it as float32 before the epilogue."""
    return np.dtype(np.int32 if np.dtype(multiplied) == np.dtype(np.int8) else np.float32)


def min_contraction(problem: Problem) -> int:
    least = max(MIN_BLOCK, MIN_STEP_BYTES // operand_bytes(problem))
    return max(least, LAYOUT_ROWS) if problem.kernel is Kernel.TGMM else least


def min_columns(problem: Problem, compute_warpgroups: int = 1) -> int:
    """The least columns of a compute warpgroup (block_n with one; the rules in this module's
    docstring)."""
    if problem.kernel is not Kernel.TGMM:
        return max(MIN_BLOCK, TMA_ROW_BYTES // np.dtype(problem.out_dtype).itemsize)
    k_major = problem_dtype(problem).name in K_MAJOR_ONLY
    return LAYOUT_ROWS if k_major or compute_warpgroups > 1 else MIN_BLOCK


def heuristic(problem: Problem, weight_tiles: int = 1, warp_specialize: bool = True
              ) -> BlockConfig:
    """Output tiles of 64 rows when a group's expected rows fit them (fine-grained MoE: a
    64-row group does not pay for a half-empty 128-row tile), else 128; 128 columns; one
    128-byte row of contraction per step; 4 stages in flight (at most 128 KiB of shared
    memory). Each block then shrinks to the problem. A compute-bound call is warp-specialized
    in 128 x 256 tiles where they fit (`_warp_specialized`). A tgmm whose groups' expected
    rows fill at most two steps, with work for two programs on every SM, runs two per SM in 2
    or 3 stages (`_shared_sm_tgmm`). `weight_tiles`: 2 for a gated unit's gmm.
    `warp_specialize=False` keeps one compute warpgroup: interpret mode's, which is for
    numerics, and which runs a warp-specialized program only where XLA's CPU client has
    threads for its warpgroups (`check_interpretable`), not on a small host by default."""
    width = operand_bytes(problem)
    contraction = SWIZZLE_BYTES // width
    rows_per_group = problem.m / max(problem.num_groups, 1)
    if problem.kernel is Kernel.TGMM:
        blocks = BlockConfig(block_m=contraction, block_k=128 if problem.k >= 128 else 64,
                             block_n=128)
        if problem.static and rows_per_group <= 2 * contraction:
            shared = _shared_sm_tgmm(blocks, problem)
            if shared is not None:
                return shared
    else:
        block_m = 64 if rows_per_group <= 64 else 128
        blocks = BlockConfig(block_m=block_m, block_k=contraction,
                             block_n=min(128, ACCUMULATOR_ELEMENTS // (weight_tiles * block_m)))
    wide = _warp_specialized(blocks, problem, weight_tiles) if warp_specialize else None
    return wide or fitted(blocks, problem, weight_tiles)


def _warp_specialized(blocks: BlockConfig, problem: Problem,
                      weight_tiles: int) -> BlockConfig | None:
    """For a compute-bound call (`compute_bound`), two compute warpgroups of 128 x 128 float32
    sums, one 128 x 256 output tile, in as many stages as fit (3 of 16-bit values): each step's
    tiles feed twice the multiply-adds of a 128 x 128 tile, and one warpgroup's loads are
    waited for while the other multiplies. On the H100 (2026-11-28) Mixtral's forward and lhs
    gradient ran at .64 and .67 of the roofline so, against .54 in 128 x 128 tiles. A float32
    output is stored in 64-row pieces (`output_tile_rows`). A gated unit's tile is 128 x 128,
    each compute warpgroup summing its 64 columns of the gate and of the up projection. None
    where the problem is not compute-bound, is smaller than the tile, or the stages (at least
    2) and output tiles do not fit shared memory."""
    if not compute_bound(problem):
        return None
    rows = output_rows_block(problem.kernel)
    # A gated unit's two sums share a warpgroup's registers: 128 x 128 output tiles.
    columns = WIDE_COLUMNS // weight_tiles
    wide = fitted(dataclasses.replace(blocks, **{rows: WIDE_ROWS}, block_n=columns,
                                      stages=WIDE_STAGES, compute_warpgroups=2), problem,
                  weight_tiles)
    wide = _stages_that_fit(wide, problem, weight_tiles)
    if (getattr(wide, rows), wide.block_n) != (WIDE_ROWS, columns):
        return None
    if shared_memory_bytes(wide, problem, weight_tiles) > shared_memory_limit(wide):
        return None
    return wide


def _shared_sm_tgmm(blocks: BlockConfig, problem: Problem) -> BlockConfig | None:
    """Two tgmm programs per SM, for groups of one or two chunks: each work item's pipeline
    has nothing to overlap its first load with, so another program's loads fill the wait (the
    H100 tune of 2026-11-27: 1.30x at DeepSeek-V3, 1.14x at Qwen3-MoE, 1.62x at GPT-OSS, with
    128 output rows in 2 stages or 64 in 3). None where the output tiles are fewer than two per
    SM, or neither fits half the shared memory."""
    for rows, stages in ((blocks.block_k, 2), (64, 3)):
        shared = fitted(dataclasses.replace(blocks, block_k=rows, stages=stages,
                                            programs_per_sm=2), problem)
        if shared.block_k != rows:
            continue  # fitted to fewer rows (GPT-OSS's 2880): the next, deeper, is that one
        tiles = (problem.local_groups * -(-problem.k // shared.block_k)
                 * -(-problem.n // shared.block_n))
        if tiles < 2 * HOPPER_SMS:
            return None
        if shared_memory_bytes(shared, problem) <= shared_memory_limit(shared):
            return shared
    return None


def fitted(config: BlockConfig, problem: Problem, weight_tiles: int = 1) -> BlockConfig:
    """`config` with each block but the output rows cut to the smallest power of two covering
    its dimension (at least its rule's least), 64 output rows where 64 cover them, and fewer
    stages where shared memory needs it. A dimension longer than its block and not a multiple
    of it takes the largest smaller block that divides it, down to the rule's least (k and n,
    not m): the kernels pad operands to whole tiles, and at GPT-OSS's 2880 a 128 block padded
    the whole weights (the lhs gradient) or the whole [G, k, n] output (tgmm), a copy that
    cost more than the kernel (the 2026-11-27 H100 scoreboard: 0.25 of the roofline against
    0.66). A gated unit (`weight_tiles` 2) pads each half of the weights' columns, so its
    columns' block divides the output's columns, half the weights' (GPT-OSS's 2 x 2880)."""
    sizes = {"block_m": problem.m, "block_k": problem.k,
             "block_n": problem.n // weight_tiles}
    rows = output_rows_block(problem.kernel)
    least = {contraction_block(problem.kernel): min_contraction(problem),
             "block_n": (min_columns(problem, config.compute_warpgroups)
                         * config.compute_warpgroups),
             rows: min(OUTPUT_ROWS)}
    fitted_blocks = {}
    for name, size in sizes.items():
        block = getattr(config, name)
        floor = least.get(name, MIN_BLOCK)
        if name == rows:
            block = 64 if size <= 64 else block
        else:
            block = max(floor, min(block, _next_power_of_two(size)))
        if name != "block_m":
            # Padding m copies activations only (gmm's lhs and output rows, tgmm's operands'
            # rows), less than smaller tiles would cost a compute-bound kernel: block_m keeps
            # its size. k and n also pad the weights or tgmm's [G, k, n] output.
            block = _dividing(block, size, floor)
        fitted_blocks[name] = block
    span = min(config.group_span, max(int(problem.local_groups), 1))
    return _stages_that_fit(dataclasses.replace(config, **fitted_blocks, group_span=span),
                            problem, weight_tiles)


def _dividing(block: int, size: Any, floor: int) -> int:
    """The largest power of two from `block` down to `floor` that divides `size`, where `size`
    spans more than one block and `block` does not divide it; else `block`."""
    if not is_static(size) or size <= block or size % block == 0:
        return block
    smaller = block // 2
    while smaller >= floor:
        if size % smaller == 0:
            return smaller
        smaller //= 2
    return block


def _stages_that_fit(config: BlockConfig, problem: Problem,
                     weight_tiles: int = 1) -> BlockConfig:
    """`config` with its stages cut (not below 2) until shared memory holds it."""
    stages = config.stages
    while stages > 2 and shared_memory_bytes(dataclasses.replace(config, stages=stages),
                                             problem, weight_tiles) > shared_memory_limit(config):
        stages -= 1
    return dataclasses.replace(config, stages=stages)
