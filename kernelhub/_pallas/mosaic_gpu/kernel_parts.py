"""What the Mosaic GPU kernels share: the persistent launch, padding to whole tiles, vectors
loaded beside a tile, the store of a tile's rows, and gmm's refs in launch order.

Operands are padded with zeros to whole blocks along k and n where their sizes are not (a
copy, only then; the MoE shapes kernelhub is tuned for need none). Along the rows, compiled,
only to a multiple of 8 and at least one tile: a last row tile reading past the array's end
gets zeros from TMA, and no row past m reaches a result. Mosaic GPU's interpret mode, where
CI runs these kernels, reads past an array's end as an error, so there rows are padded to
whole tiles too.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernelhub._core import jax_internals
from kernelhub._core.manual_axes import concurrent_devices, varying_like
from kernelhub._grouped_matmul import visits
from kernelhub._pallas import four_bit_bits
from kernelhub._pallas.mosaic_gpu import (block_rules, config, interpreter_programs, operand_types,
                                          profiling)

# In interpret mode every simulated program is a thread on this host: two still run the
# persistent loop's hand-over of work from one program to the next.
INTERPRET_SMS = 2
SM_AXIS = "sm"
# Warp specialization (the tiling's compute_warpgroups=2): a program's warpgroups, named along
# WG_AXIS, the memory warpgroup last.
COMPUTE_WARPGROUPS = 2
# Registers the memory warpgroup keeps (it only issues copies): the rest go to the others.
MEMORY_REGISTERS = 40
WG_AXIS = "wg"
# jax's Mosaic GPU interpreter simulates one GPU per process (its shared memory is a module
# global): two interpreted kernels at once, from two threads or from the devices of one
# sharded program, tear down each other's. Interpreted launches take turns.
_INTERPRETER_TURN = threading.Lock()


def launch(body: Callable[..., None], operands: Sequence[jax.Array],
           out_shape: tuple[int, ...], out_dtype, interpret: bool, name: str,
           starting_as: jax.Array | None = None, warp_specialized: bool = False,
           programs_per_sm: int = 1) -> jax.Array:
    """Runs `body(*operand_refs, out_ref)` on a persistent grid of `programs_per_sm` programs
    per SM (config.py); the body spreads its work over them with
    `plgpu.nd_loop(..., collective_axes=SM_AXIS)`.

    With `starting_as` (compiled only) the output is that array's buffer, aliased (a ref the
    kernel updates in place, XLA copying it only when the caller does not donate it):
    the kernel writes only what it changes. Otherwise the output starts undefined and the
    kernel writes all of it.
    `warp_specialized` runs COMPUTE_WARPGROUPS + 1 warpgroups per program along WG_AXIS."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    threads = (dict(num_threads=COMPUTE_WARPGROUPS + 1, thread_name=WG_AXIS)
               if warp_specialized else {})
    params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
                                  **({} if interpret else profiling.compiler_params_fields()))
    if starting_as is not None:
        if interpret:
            raise ValueError("the interpreter takes no aliased output")
        mesh = plgpu.Mesh(grid=(_sm_count() * programs_per_sm,), grid_names=(SM_AXIS,),
                          kernel_name=name, **threads)
        kernel = pl.kernel(body, out_type=(), mesh=mesh, compiler_params=params)
        # run_state: the ref lives only inside, so the call stays a pure function.
        return pl.run_state(lambda out_ref: kernel(*operands, out_ref))(starting_as)
    out_type = jax.ShapeDtypeStruct(out_shape, out_dtype)
    kernel = plgpu.kernel(
        body,
        out_type=out_type,
        grid=((INTERPRET_SMS if interpret else _sm_count()) * programs_per_sm,),
        grid_names=(SM_AXIS,),
        compiler_params=params,
        interpret=jax_internals.mosaic_gpu_interpret_params() if interpret else None,
        kernel_name=name,
        **threads,
    )
    if not interpret:
        # Under shard_map the output varies over the manual mesh axes its operands vary over;
        # plgpu.kernel types it as invariant (the same on every device), and shard_map's
        # transpose would then sum its cotangent over the devices.
        return varying_like(kernel(*operands), *operands)
    config.check_interpreted_devices(concurrent_devices(operands[0]),
                                     COMPUTE_WARPGROUPS + 1 if warp_specialized else 1)
    # The interpreter simulates the GPU through ordered host callbacks, an effect that
    # kernelhub's primitive cannot carry through its custom VJP. The kernel is a pure function
    # of its operands, so it runs as one: a host call that runs the interpreted kernel,
    # compiled at its first run (outside any trace) or shared with a kernel that traced alike.
    program: list[Callable[..., jax.Array]] = []

    def run_interpreted(*arrays):
        with _INTERPRETER_TURN:
            if not program:
                program.append(interpreter_programs.compiled(kernel, arrays))
            return np.asarray(program[0](*arrays))

    return jax_internals.pure_callback_like(run_interpreted, out_shape, out_dtype, operands)


def _sm_count() -> int:
    """The SMs of this host's GPU; block_rules.HOPPER_SMS when lowering without one (export)."""
    try:
        device = jax.devices()[0]
    except RuntimeError:
        return block_rules.HOPPER_SMS
    count = getattr(device, "core_count", None) if device.platform == "gpu" else None
    return int(count) if count else block_rules.HOPPER_SMS


def transposed_operand(smem, scratch):
    """The wgmma operand that is the transpose of a tile in shared memory: compiled, a
    transposed view (wgmma reads A or B in either order for 16-bit values, and B [K, N] of
    float32 and 8-bit types only from a tile stored [N, K]). Mosaic GPU's interpreter (jax 0.10.2)
    takes no transposed view in wgmma, so there `scratch`, of the transposed shape, receives the
    tile transposed through registers (the compiled kernel never does this)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if scratch is None:
        # The ref's own view (plgpu.transpose_ref, which jax 0.11 deprecates, returns the same).
        return smem.transpose((1, 0))
    scratch[...] = smem[...].T
    plgpu.commit_smem()
    return scratch


class Existing(enum.Enum):
    """How a tgmm body finds existing_out: not given; an operand of its own (interpreted),
    or the output's own buffer, aliased (compiled: `launch`'s `starting_as`)."""

    NONE = "none"
    OPERAND = "operand"
    IN_PLACE = "in place"

    @classmethod
    def of(cls, given: bool, in_place: bool) -> Existing:
        return cls.NONE if not given else cls.IN_PLACE if in_place else cls.OPERAND


def tgmm_output_refs(refs, existing: Existing) -> tuple:
    """tgmm's refs after its operands, in launch order (existing_out when an operand, then the
    output), as (existing_out's ref or None, the output's ref); in place, both are the
    output's."""
    out_ref = refs[-1]
    if existing is Existing.IN_PLACE:
        return out_ref, out_ref
    return (refs[0] if existing is Existing.OPERAND else None), out_ref


def store_tile(total: jax.Array, tile_smem, barrier, existing_ref, out_ref, group: jax.Array,
               first_row: jax.Array, columns) -> None:
    """tgmm: stores a [rows, columns] float32 result tile (plus existing_out's, when given)
    at output[group, first_row:first_row + rows, columns] through `tile_smem` by TMA, without
    waiting for the store; only a previous store still reading `tile_smem` is waited for. A
    `tile_smem` of fewer rows than the tile takes it a piece at a time
    (shared_memory.output_tile_rows), each piece's store waited for before the next is written."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows = tile_smem.shape[0]
    pieces = total.shape[0] // rows
    for piece in range(pieces):
        part = total if pieces == 1 else total[piece * rows:(piece + 1) * rows]
        where = (group, pl.ds(first_row + piece * rows, rows), columns)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        if existing_ref is None:
            tile_smem[...] = part.astype(out_ref.dtype)
        else:
            plgpu.copy_gmem_to_smem(existing_ref.at[where], tile_smem, barrier)
            plgpu.barrier_wait(barrier)
            kept = tile_smem[...].astype(jnp.float32)
            tile_smem[...] = (part + kept).astype(out_ref.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(tile_smem, out_ref.at[where])


def widened(values: jax.Array, dtype) -> jax.Array:
    """8-bit or 4-bit tile values as `dtype`, float16, bfloat16 or float32 (exact,
    operand_types.converted_dtype): Hopper converts fp8 to float16 or float32 only, so fp8 goes to
    bfloat16 through float32; e2m1 codes (operand_types.E2M1_CODES) become float16 first."""
    if values.dtype == operand_types.E2M1_CODES:
        values = four_bit_bits.float16_of_codes(values)
    if dtype == jnp.bfloat16 and jnp.issubdtype(values.dtype, jnp.floating):
        values = values.astype(jnp.float32)
    return values.astype(dtype)


def converted(tile_smem, copy, column_scales: jax.Array | None = None):
    """`copy` (shared memory, the multiplied dtype) holding the 8-bit tile `tile_smem`
    widened, for the caller to commit and hand to wgmma (the tiling's upcast); with
    `column_scales` (float32, one per column) the float32 tile multiplied by them."""
    values = widened(tile_smem[...], copy.dtype)
    if column_scales is not None:
        values = values * broadcast_columns(column_scales, values.shape)
    copy[...] = values
    return copy


def accumulator(shape: tuple[int, int], multiplied):
    """A wgmma accumulator for tiles of the `multiplied` dtype (operand_types.accumulator_dtype),
    for `pl.run_scoped`."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.ACC(shape, jnp.dtype(operand_types.accumulator_dtype(multiplied)))


def sums(acc) -> jax.Array:
    """An accumulator's sums as float32 (int8's exact int32 sums rounded once)."""
    total = acc[...]
    return total if total.dtype == jnp.float32 else total.astype(jnp.float32)


def wgmma_zeros(shape: tuple[int, int], interpret: bool, dtype=jnp.float32) -> jax.Array:
    """Zeros in the layout of a wgmma accumulator (a start for a sum carried in registers; the
    interpreter needs no layout)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    zeros = jnp.zeros(shape, dtype)
    return zeros if interpret else plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)


def tile_iota(shape: tuple[int, int], dimension: int, interpret: bool) -> jax.Array:
    """int32 indices along `dimension` of a tile, in the layout of a wgmma operand loaded from
    shared memory (the cast guides Mosaic GPU's layout inference; the interpreter has no rule
    for it and needs none)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    indices = jax.lax.broadcasted_iota(jnp.int32, shape, dimension)
    return indices if interpret else plgpu.layout_cast(indices, plgpu.Layout.WGMMA)


def banded_order(index: jax.Array, rows: int, columns: int, band: int
                 ) -> tuple[jax.Array, jax.Array]:
    """(row, column) of work item `index` in a (rows, columns) grid walked in bands of `band`
    columns: row by row within a band (its columns minor), every other band walked from the
    last row back, so that consecutive items share a row or a band's columns and the turn
    between bands reuses the rows just read. (Like `plgpu.planar_snake`, written with
    divisors that are never zero: XLA:CPU stops with a floating point exception compiling
    the interpreted kernel when one is a constant zero.)"""
    per_band = band * rows
    which = jax.lax.div(index, jnp.int32(per_band))
    inside = jax.lax.rem(index, jnp.int32(per_band))
    width = jnp.minimum(jnp.int32(band), jnp.int32(columns) - which * band)
    width = jnp.maximum(width, 1)
    row = jax.lax.div(inside, width)
    column = which * band + jax.lax.rem(inside, width)
    row = jnp.where(jax.lax.rem(which, jnp.int32(2)) == 1, rows - 1 - row, row)
    return row, column


def padded(array: jax.Array, sizes: dict[int, int]) -> jax.Array:
    """`array` with zeros appended along each axis in `sizes` up to that size (itself when no
    axis grows)."""
    widths = [(0, max(sizes.get(axis, extent) - extent, 0))
              for axis, extent in enumerate(array.shape)]
    if not any(high for _, high in widths):
        return array
    return jnp.pad(array, widths)


def concatenated(array: jax.Array, axis: int) -> jax.Array:
    """Interleaved (gate, up) pairs along `axis` as gate columns then up columns."""
    size = array.shape[axis]
    order = np.concatenate([np.arange(0, size, 2), np.arange(1, size, 2)])
    return jnp.take(array, order, axis=axis)


def paired_rows(rhs: jax.Array, size: int) -> jax.Array:
    """Interleaved (gate, up) weight rows [G, 2n, k] as [G, n, 2k]: row j holds gate row j,
    then up row j (the same bytes, no copy), its n rows zero-padded to `size`. The gate's
    columns of the output are then the first k of each row, the up's the last k."""
    groups, rows, k = rhs.shape
    return padded(rhs.reshape(groups, rows // 2, 2 * k), {1: size})


def weight_views(group_rhs, n_tile, halves: int, block_n: int, n_half: int, k: int,
                 transpose_rhs: bool, paired: bool) -> list:
    """For each of a gated unit's halves (one without), the view of one group's weights that
    an output tile of `block_n` columns multiplies: [k, block_n] (transpose_rhs: [block_n,
    k]). The halves lie `n_half` columns apart (the concatenated layout), or, `paired`, in
    the first and last k of `paired_rows`' rows."""
    from jax.experimental import pallas as pl

    columns = pl.ds(n_tile * block_n, block_n)
    if paired:
        return [group_rhs.at[columns, pl.ds(half * k, k)] for half in range(halves)]
    views = []
    for half in range(halves):
        tile = pl.ds(n_tile * block_n + half * n_half, block_n)
        views.append(group_rhs.at[tile, :] if transpose_rhs else group_rhs.at[:, tile])
    return views


def halves_padded(array: jax.Array, axis: int, halves: int, size: int) -> jax.Array:
    """`array` with each of its `halves` parts along `axis` zero-padded to `size`."""
    if array.shape[axis] == halves * size:
        return array  # (not split and joined again: XLA may keep that as a copy)
    parts = jnp.split(array, halves, axis=axis) if halves > 1 else [array]
    parts = [padded(part, {axis: size}) for part in parts]
    return parts[0] if halves == 1 else jnp.concatenate(parts, axis=axis)


def load_vector(src, smem_shape: tuple[int], dtype):
    """The float32 vector `src` (a GMEM slice of `smem_shape`) copied to shared memory by TMA
    and loaded into registers; layout inference gives it the accumulator's row or column
    layout from its broadcast (broadcast_rows, broadcast_columns)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return pl.run_scoped(lambda smem, barrier: load_vector_through(src, smem, barrier),
                         plgpu.SMEM(smem_shape, dtype), plgpu.Barrier())


def load_vector_through(src, smem, barrier):
    """load_vector through shared memory and a barrier the caller holds."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    plgpu.copy_gmem_to_smem(src, smem, barrier)
    plgpu.barrier_wait(barrier)
    return smem[...].astype(jnp.float32)


def visit_rows(table_ref, visit):
    """(group, first_row, start, end) of a gmm work item's visit (visits.py's table): the
    group (or visits.FILL), its row tile's first row (a multiple of block_rules.ROW_ALIGN), and the
    rows [start, end) inside that tile it stores."""
    from jax.experimental import pallas as pl

    group = table_ref[visits.GROUP, visit]
    first_row = pl.multiple_of(table_ref[visits.FIRST_ROW, visit], block_rules.ROW_ALIGN)
    return group, first_row, table_ref[visits.START, visit], table_ref[visits.END, visit]


def broadcast_rows(vector: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """A per-row vector [rows] over a tile (broadcast_in_dim: the form whose layout Mosaic
    GPU's layout inference follows)."""
    return jax.lax.broadcast_in_dim(vector, shape, (0,))


def broadcast_columns(vector: jax.Array, shape: tuple[int, int]) -> jax.Array:
    return jax.lax.broadcast_in_dim(vector, shape, (1,))


def store_rows(tile_smem, out_gmem: Callable[[jax.Array, int], object], first: jax.Array,
               count: jax.Array, block_rows: int, wait: bool = True) -> None:
    """Stores rows [first, first + count) of the shared-memory tile (count in [0, block_rows])
    with TMA: one copy per set bit of count, largest first, each of a power-of-two rows
    (a TMA box has a static shape, the count is known only on the device). `out_gmem(row,
    rows)` is the GMEM destination of `rows` rows from tile row `row`. With `wait` the copies
    have read the tile when this returns; without, the caller waits before writing it."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    offset = first
    for bit in reversed(range(int(math.log2(block_rows)) + 1)):
        rows = 1 << bit
        present = (count & rows) != 0

        @pl.when(present)
        def _store(offset=offset, rows=rows):
            plgpu.copy_smem_to_gmem(tile_smem.at[pl.ds(offset, rows)], out_gmem(offset, rows))

        offset = offset + (count & rows)
    if wait:
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def gmm_operand_refs(refs, has_row_scale: bool, has_column_scale: bool, has_bias: bool,
                     has_existing: bool) -> tuple:
    """gmm's refs after (table, lhs, rhs), in launch order: the row scale, the column scale
    and the bias when given, existing_out when given, the output. Returns them as (row_scale,
    column_scale, bias, existing, out), None for those not given."""
    refs = list(refs)
    out_ref = refs.pop()
    existing_ref = refs.pop() if has_existing else None
    row_scale_ref = refs.pop(0) if has_row_scale else None
    column_scale_ref = refs.pop(0) if has_column_scale else None
    bias_ref = refs.pop(0) if has_bias else None
    return row_scale_ref, column_scale_ref, bias_ref, existing_ref, out_ref
