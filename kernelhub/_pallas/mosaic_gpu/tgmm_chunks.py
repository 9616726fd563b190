"""How tgmm's kernels bring a chunk of summed rows to wgmma: the operands' layouts in memory,
their pipeline specs, the masking of other groups' rows, and the wgmma operands.

tgmm sums lhs[:, rows] @ rhs[rows, :] over chunks of block_m rows: wgmma's A is the lhs tile
[block_k, block_m] and its B the rhs tile [block_m, block_n]. How each lies in memory:
- lhs arrives [k, m] (the contract's layout). With 16-bit values the kernel reads it as [m, k]
  instead, `lhs_rows_major`: the kit's weight gradient passes `x.T` of the activations x [m, k],
  and the kernel's own transpose back cancels that one inside the jitted program, so no copy of
  x is made (XLA folds the two). The tile [block_m, block_k] goes to wgmma as a transposed view.
  float32 and 8-bit (fp8, int8) wgmma read A K-major only, which the [k, m] layout is: they
  keep it.
- rhs [m, n] is B as stored for 16-bit values; float32 and 8-bit wgmma read B K-major only, so
  such rhs is transposed to [n, m] first (a copy), `rhs_k_major`.
- An 8-bit operand beside a 16-bit one, or of another 8-bit kind, with the tiling's upcast
  (`converted`): the 16-bit layouts, every operand read as stored (its 8-bit tiles hold the
  rows along their major axis too), and each 8-bit tile converted in shared memory per chunk,
  in the same pass as the select of its rows (`masked_tiles`). Beside a float32 operand (a
  quantized call's weight gradient: 8-bit activations and the float32 cotangent the kit folds
  their scales into) the float32 layouts, the 8-bit tiles converted to float32 the same way:
  an 8-bit rhs is transposed at its own width, not widened first.

Where a group's chunks start: with 16-bit values both tiles hold the rows along their major
axis, which TMA cuts in groups of block_rules.ROW_ALIGN rows, so the chunks start at the group's
first row rounded down to such a multiple and follow every block_m rows; a chunk that would
pass the padded rows is moved back to end there, summing only the rows after the chunk before
it. A group of r rows then takes ceil(r / block_m) chunks, one more only where the rounding
pushes it over. float32 and 8-bit tiles hold the rows along their minor axis (cut in 128-byte
swizzle rows), so their chunks are the aligned [i * block_m, (i + 1) * block_m). Either way a
group takes no more chunks than the aligned ones it touches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from kernelhub._grouped_matmul import visits
from kernelhub._pallas.mosaic_gpu import block_rules, kernel_parts, operand_types


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
    """The layouts of one kernel dtype: 16-bit (lhs read [m, k], rhs [m, n] as stored) or one
    whose wgmma reads both operands K-major (lhs [k, m] as stored, rhs transposed to [n, m]).
    `converted` (the tiling's upcast, operand_types.converted_dtype): the layout of that type, each
    8-bit operand's tiles converted to it in shared memory (16-bit: every operand read as
    stored; float32: an 8-bit rhs is transposed as stored, at its own width)."""

    k_major_only: bool
    converted: np.dtype | None = None

    @classmethod
    def for_dtype(cls, dtype) -> ChunkLayout:
        return cls(jnp.dtype(dtype).name in operand_types.K_MAJOR_ONLY)

    @classmethod
    def converting(cls, lhs_dtype, rhs_dtype) -> ChunkLayout:
        converted = operand_types.converted_dtype(lhs_dtype, rhs_dtype)
        return cls(converted.name in operand_types.K_MAJOR_ONLY, converted)

    def multiplied(self, stored) -> np.dtype:
        """The dtype wgmma multiplies: `converted`, else the operands' own (`stored`)."""
        return jnp.dtype(stored) if self.converted is None else self.converted

    def step_scratch(self, blocks: block_rules.BlockConfig, lhs_dtype, rhs_dtype,
                     interpret: bool) -> dict:
        """A one-warpgroup step's shared memory beside the pipeline, by the names
        `masked_tiles` and `operands` take it: with `converted`, two copies of each 8-bit
        operand's tile (a step converts into one while the previous step's wgmma reads the
        other); interpreted, the transposing tile (`scratch`)."""
        from jax.experimental.pallas import mosaic_gpu as plgpu

        lhs_tile, rhs_tile = operand_types.tgmm_tiles(self.k_major_only, blocks.block_m,
                                                      blocks.block_k, blocks.block_n)
        tiles = {}
        if self.converted is not None and jnp.dtype(lhs_dtype) != self.converted:
            tiles["lhs_converted"] = plgpu.SMEM((2, *lhs_tile), self.converted)
        if self.converted is not None and jnp.dtype(rhs_dtype) != self.converted:
            tiles["rhs_converted"] = plgpu.SMEM((2, *rhs_tile), self.converted)
        scratch = self.scratch(blocks, self.multiplied(lhs_dtype), interpret)
        return tiles if scratch is None else {**tiles, "scratch": scratch}

    @property
    def lhs_rows_major(self) -> bool:
        return not self.k_major_only

    @property
    def rhs_k_major(self) -> bool:
        return self.k_major_only

    def arranged(self, lhs: jax.Array, rhs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """lhs [k, m] and rhs [m, n] in the layouts the kernel reads."""
        return (lhs.T if self.lhs_rows_major else lhs), (rhs.T if self.rhs_k_major else rhs)

    def padding(self, m_p: int, k_p: int, n_p: int) -> tuple[dict[int, int], dict[int, int]]:
        """The padded sizes per axis of lhs and rhs as `arranged` returns them."""
        lhs = {0: m_p, 1: k_p} if self.lhs_rows_major else {0: k_p, 1: m_p}
        rhs = {0: n_p, 1: m_p} if self.rhs_k_major else {0: m_p, 1: n_p}
        return lhs, rhs

    def row_align(self, block_m: int) -> int:
        """The multiple of rows a group's chunks start at (module docstring)."""
        return block_rules.ROW_ALIGN if self.lhs_rows_major else block_m

    def chunk_count(self, start, end, block_m: int) -> jax.Array:
        """How many chunks the group of rows [start, end) takes (0 when it is empty)."""
        return visits.tile_count(start, end, block_m, self.row_align(block_m))

    def chunk_rows(self, start, index, block_m: int, rows_padded: int):
        """(the first row of the tiles loaded, the first row summed) of the group's chunk
        `index` (its rows start at `start`): a chunk that would pass `rows_padded` is moved back
        to end there and sums only the rows after the chunk before it."""
        first_row, window = visits.tile_rows(start, index, block_m, self.row_align(block_m),
                                             rows_padded)
        return first_row, jnp.maximum(window, start)

    def group_chunks(self, bounds_ref, group, block_m: int, rows_padded: int):
        """(end, chunks, rows_of) of `group`, whose rows [start, end) the table `bounds_ref`
        ([starts, ends]) holds: how many chunks it takes, and `rows_of(c)`, chunk_rows of its
        chunk c."""
        start = bounds_ref[0, group]
        end = bounds_ref[1, group]

        def rows_of(chunk):
            return self.chunk_rows(start, chunk, block_m, rows_padded)

        return end, self.chunk_count(start, end, block_m), rows_of

    def specs(self, blocks: block_rules.BlockConfig, k_tile, n_tile,
              row_of: Callable[[jax.Array], jax.Array], delay_release: int = 1) -> list:
        """The pipeline's specs of the lhs and rhs tiles of step c's chunk, whose first row is
        `row_of(c)` (a multiple of `row_align`); a step's buffers are refilled `delay_release`
        steps after it."""
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import mosaic_gpu as plgpu

        bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
        if self.lhs_rows_major:  # rows along the major axis: any multiple of ROW_ALIGN
            def rows(c):
                return pl.multiple_of(row_of(c), block_rules.ROW_ALIGN)

            return [plgpu.BlockSpec((pl.Element(bm), bk), lambda c: (rows(c), k_tile),
                                    delay_release=delay_release),
                    plgpu.BlockSpec((pl.Element(bm), bn), lambda c: (rows(c), n_tile),
                                    delay_release=delay_release)]

        def chunk(c):
            return jax.lax.div(row_of(c), jnp.int32(bm))

        return [plgpu.BlockSpec((bk, bm), lambda c: (k_tile, chunk(c)),
                                delay_release=delay_release),
                plgpu.BlockSpec((bn, bm), lambda c: (n_tile, chunk(c)),
                                delay_release=delay_release)]

    def masked_tiles(self, lhs_smem, rhs_smem, first_row, start, end, index,
                     interpret: bool, lhs_converted=None, rhs_converted=None,
                     lhs_scales: jax.Array | None = None) -> tuple:
        """The chunk's tiles as wgmma multiplies them, their summed rows outside [start, end)
        exact zeros by a select (a NaN in another group's row stays out). A tile given copies
        (`step_scratch`) is written, converted and selected, into its copy for step `index`
        at every step (the previous step's wgmma read the other copy and is done); the others
        are selected in place where there are such rows. `lhs_scales` (float32, one per summed
        row; lhs converted, K-major) multiply the converted lhs tile (scale_blocks.py)."""
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import mosaic_gpu as plgpu

        lhs_axis = 0 if self.lhs_rows_major else 1
        rhs_axis = 1 if self.rhs_k_major else 0
        rows = lhs_smem.shape[lhs_axis]
        tiles = ((lhs_smem, lhs_axis, lhs_converted), (rhs_smem, rhs_axis, rhs_converted))

        def selected(shape, axis, values):
            indices = kernel_parts.tile_iota(shape, axis, interpret) + first_row
            owned = (indices >= start) & (indices < end)
            return jnp.where(owned, values, jnp.zeros((), values.dtype))

        in_place = [(smem, axis) for smem, axis, copies in tiles if copies is None]
        if in_place:
            @pl.when((first_row < start) | (first_row + rows > end))
            def _mask():
                for smem, axis in in_place:
                    values = smem[...]
                    if values.dtype.itemsize == 1:
                        # Mosaic GPU selects no 8-bit values: the select runs on float16,
                        # which holds every e4m3, e5m2 and int8 value exactly.
                        values = values.astype(jnp.float16)
                    smem[...] = selected(smem.shape, axis, values).astype(smem.dtype)
                plgpu.commit_smem()

        masked = []
        for which, (smem, axis, copies) in enumerate(tiles):
            if copies is not None:
                target = copies.at[jax.lax.rem(index, 2)]
                values = kernel_parts.widened(smem[...], target.dtype)
                if which == 0 and lhs_scales is not None:
                    values = values * jax.lax.broadcast_in_dim(lhs_scales, values.shape,
                                                               (axis,))
                target[...] = selected(smem.shape, axis, values)
                smem = target
            masked.append(smem)
        if lhs_converted is not None or rhs_converted is not None:
            plgpu.commit_smem()
        return tuple(masked)

    def operands(self, lhs_smem, rhs_smem, scratch, columns: tuple | None = None):
        """wgmma's A [block_k, block_m] and B [block_m, block_n] from the chunk's tiles (one of
        them transposed; `scratch` as kernel_parts.transposed_operand takes it). With
        `columns` (first, count), B is those columns of the tile only (a warp-specialized
        compute warpgroup's half)."""
        from jax.experimental import pallas as pl

        if columns is not None:
            first, count = columns
            rhs_smem = (rhs_smem.at[pl.ds(first, count), :] if self.rhs_k_major
                        else rhs_smem.at[:, pl.ds(first, count)])
        left = (kernel_parts.transposed_operand(lhs_smem, scratch) if self.lhs_rows_major
                else lhs_smem)
        right = (kernel_parts.transposed_operand(rhs_smem, scratch) if self.rhs_k_major
                 else rhs_smem)
        return left, right

    def scratch(self, blocks: block_rules.BlockConfig, dtype, interpret: bool,
                columns: int | None = None, copies: int | None = None):
        """The shared-memory tile the interpreter transposes the transposed operand through
        (None when compiled: a transposed view instead), for B of `columns` columns (block_n
        when not given); with `copies`, that many such tiles along a leading axis (one per
        warp-specialized compute warpgroup)."""
        from jax.experimental.pallas import mosaic_gpu as plgpu

        if not interpret:
            return None
        if self.lhs_rows_major:
            shape = (blocks.block_k, blocks.block_m)
        else:
            shape = (blocks.block_m, columns or blocks.block_n)
        return plgpu.SMEM(shape if copies is None else (copies, *shape), dtype)

