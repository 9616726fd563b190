"""Scale blocks along the contraction inside the Pallas TPU kernels (what they mean:
kernelhub/_grouped_matmul/contraction_scales.py).

A contraction tile either holds whole scale blocks (tile % block == 0), lies inside one
(block % tile == 0), or is the contraction's only tile; `fitting_tile` cuts a tile until one of
these holds for every scaled operand. The kernel splits its tile statically into sub-slices
that each lie inside one block of every scaled operand, multiplies each sub-slice's product by
that block's scales and sums in float32.

The scales reach the kernel with their block axis leading, [blocks, rows, 1] for a scale that
varies along the output's rows and [blocks, 1, columns] for one along its columns, so that a
tile's scales form one BlockSpec block (whole entries along the leading axis; (rows, 1) and
(1, columns) are legal trailing block shapes) and each entry is a column or row vector in VMEM,
ready to broadcast over the product.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._pallas.tpu.kernel_parts import CallOptions
from kernelhub._pallas.tpu.tiling import LANES


def fits(tile: int, block: int, contraction: int) -> bool:
    return tile >= contraction or tile % block == 0 or block % tile == 0


def fitting_tile(tile: int, length: int, blocks: tuple[int, ...], granule: int = LANES) -> int:
    """The largest tile up to `tile`, a multiple of `granule` (the axis' layout rule), that fits
    every scale block along an axis of `length` (block sizes the kernels take always let the
    granule itself fit)."""
    candidate = tile
    while not all(fits(candidate, block, length) for block in blocks):
        candidate = (candidate - 1) // granule * granule
        if candidate <= 0:
            raise ValueError(f"no tile fits scale blocks of {blocks} elements")
    return candidate


def fitted_tiles(options: CallOptions, lengths: dict[str, tuple[int, int]],
                 blocks: dict[str, tuple[int | None, ...]]) -> CallOptions:
    """`options` with each tile named in `blocks` ("tm", "tk", "tn") cut by `fitting_tile` to
    the scale blocks running along its axis (None entries: operands without), its axis'
    (length, granule) from `lengths`."""
    for name, sizes in blocks.items():
        sizes = tuple(size for size in sizes if size is not None)
        if sizes:
            length, granule = lengths[name]
            options = options.with_tile(
                name, fitting_tile(getattr(options.tiles, name), length, sizes, granule))
    return options


@dataclasses.dataclass(frozen=True)
class TileScales:
    """How one scaled operand's scale entries line up with the tiles of the axis its blocks run
    along (the contraction, or an output axis in backward products)."""

    block: int  # the operand's scale block size
    tile: int  # the tile along that axis
    contraction: int  # that axis' length

    @property
    def single_tile(self) -> bool:
        return self.tile >= self.contraction

    @property
    def entries(self) -> int:
        """Scale entries in one tile's BlockSpec block."""
        if self.single_tile:
            return -(-self.contraction // self.block)
        return max(self.tile // self.block, 1)

    def block_index(self, tile_index: jax.Array) -> jax.Array:
        """The BlockSpec block index, along the leading axis, of a contraction tile's scales."""
        if self.single_tile:
            return jnp.zeros_like(tile_index)
        if self.tile % self.block == 0:
            return tile_index
        # lax.div: Python's floor division lowers through `sign`, which Mosaic lowers only
        # knowing the TPU (so not when exporting for one from elsewhere); these are >= 0.
        return lax.div(tile_index, jnp.asarray(self.block // self.tile, tile_index.dtype))

    def leading(self, scale: jax.Array, block_axis: int) -> jax.Array:
        """`scale` with its block axis moved to the front and padded with zeros to whole tiles
        (the entries past the contraction meet products that are zero)."""
        scale = jnp.moveaxis(scale, block_axis, 0)
        tiles = -(-self.contraction // self.tile)
        wanted = self.entries if self.single_tile else tiles * self.entries
        if self.tile % self.block == 0 and wanted > scale.shape[0]:
            padding = [(0, wanted - scale.shape[0])] + [(0, 0)] * (scale.ndim - 1)
            scale = jnp.pad(scale, padding)
        return scale


def sub_slices(tile: int, contraction: int, blocks: tuple[int, ...]) -> list[tuple[int, int]]:
    """(start, size) within a tile of the static slices that each lie inside one scale block
    of every scaled operand; the entry of an operand's scales for a slice is start // block."""
    single = tile >= contraction
    step = math.gcd(*blocks) if single else math.gcd(tile, *blocks)
    length = contraction if single else tile
    return [(start, min(step, length - start)) for start in range(0, length, step)]


def scaled_sum(multiply: Callable[[int, int], jax.Array], slices: list[tuple[int, int]],
               shape: tuple[int, int], lhs_scale_ref: Any, lhs_block: int | None,
               rhs_scale_ref: Any, rhs_block: int | None) -> jax.Array:
    """The float32 sum over `slices` of `multiply(start, size)` (the tiles' product over that
    sub-slice of the contraction) times the slice's lhs row scales ([rows, 1] entries) and rhs
    column scales ([1, columns] entries); an operand without scale blocks has None refs."""
    total = jnp.zeros(shape, jnp.float32)
    for start, size in slices:
        part = multiply(start, size).astype(jnp.float32)
        if lhs_block is not None:
            part = part * lhs_scale_ref[start // lhs_block]
        if rhs_block is not None:
            part = part * rhs_scale_ref[start // rhs_block]
        total = total + part
    return total


def across_tile(entries_ref: Any, tiles: TileScales, shape: tuple[int, int],
                axis: int) -> jax.Array:
    """The float32 [rows, columns] scales of a tile whose `axis` (an output axis) runs across
    scale blocks: entry j of `entries_ref` (a [1, columns] or [rows, 1] vector, varying along
    the contraction) for the elements of the tile's j-th block. Multiplying the tile by it
    dequantizes the tile (OutputBlockScales, kernelhub/_grouped_matmul/contraction_scales.py)."""
    scale = jnp.broadcast_to(entries_ref[0], shape)
    if tiles.entries == 1:
        return scale
    block = lax.div(lax.broadcasted_iota(jnp.int32, shape, axis), jnp.int32(tiles.block))
    for entry in range(1, tiles.entries):
        scale = jnp.where(block == entry, jnp.broadcast_to(entries_ref[entry], shape), scale)
    return scale
