"""Scale blocks along the contraction inside the Pallas TPU kernels (what they mean:
kernelhub/ops/_contraction_scales.py).

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

from kernelhub._pallas.tpu.tiling import LANES


def fits(tile: int, block: int, contraction: int) -> bool:
    return tile >= contraction or tile % block == 0 or block % tile == 0


def fitting_tile(tile: int, contraction: int, blocks: tuple[int, ...]) -> int:
    """The largest contraction tile up to `tile` that fits every scale block (a multiple of
    LANES: block sizes the kernels take always let LANES itself fit)."""
    candidate = tile
    while not all(fits(candidate, block, contraction) for block in blocks):
        candidate = (candidate - 1) // LANES * LANES
        if candidate <= 0:
            raise ValueError(f"no contraction tile fits scale blocks of {blocks} elements")
    return candidate


@dataclasses.dataclass(frozen=True)
class TileScales:
    """How one scaled operand's scale entries line up with the contraction tiles."""

    block: int  # the operand's scale block size
    tile: int  # the contraction tile
    contraction: int  # the contraction's length

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
        return tile_index // (self.block // self.tile)

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
