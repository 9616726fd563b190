"""4-bit operands (int4, float4_e2m1fn) in the Triton kernels: read packed, widened per tile.

A kernel takes a 4-bit operand as bytes, two values to a byte along its last axis ([..., last
/ 2] uint8, the values' bits as `four_bit_bits.as_bytes` gives them: no wider copy of the
operand is made), loads byte tiles and unpacks each in registers to the 8-bit dtype that holds
its values exactly: int4 to int8 (sign-extended), e2m1 to e4m3. Those tiles then go where any
8-bit tile goes (kernelhub/_pallas/gpu/_tiles.py): as stored into the 8-bit tensor cores when
the other tile is 8-bit too, else widened to bf16.

An operand whose last axis is odd gets one zero value appended first (a 4-bit copy, for such
shapes only), which the kernels' masks keep out of every product and store.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._pallas import four_bit_bits
from kernelhub._pallas.gpu import _tiles
from kernelhub.quantization import EXACT_IN_8_BITS

_E2M1 = jnp.dtype(jnp.float4_e2m1fn)


def narrow_allowed(rhs_dtype, rhs_k_major: bool) -> bool:
    """Whether tiles of an rhs of `rhs_dtype` may go to the 8-bit tensor cores as unpacked.
    Triton 3.6 cannot lay out an int8 tile made in registers along N (rows along the
    contraction) for the int8 wgmma, which reads K-major ("Illegal shared layout" in its
    dot-operand pass): such int4 tiles widen to bf16 instead. e4m3 tiles made from e2m1 pass."""
    return rhs_k_major or jnp.dtype(rhs_dtype) != jnp.dtype(jnp.int4)


def tile_dtype(dtype) -> jnp.dtype:
    """The dtype a kernel's tiles of an operand of `dtype` have once loaded."""
    dtype = jnp.dtype(dtype)
    return EXACT_IN_8_BITS.get(dtype, dtype)


@dataclasses.dataclass(frozen=True)
class Packing:
    """How an operand of 4-bit `values` reaches a kernel: as bytes along its last axis."""

    values: jnp.dtype

    def unpacked(self, tile: jax.Array) -> jax.Array:
        """The [rows, 2 * columns] 8-bit tile of a [rows, columns] byte tile: the low half of
        each byte first, as `lax.bitcast_convert_type` packs them."""
        rows, columns = tile.shape
        if self.values == _E2M1:
            low = tile & jnp.uint8(0xF)
            high = lax.shift_right_logical(tile, jnp.uint8(4))
        else:
            signed = lax.bitcast_convert_type(tile, jnp.int8)
            four = jnp.int8(4)
            low = lax.shift_right_arithmetic(lax.shift_left(signed, four), four)
            high = lax.shift_right_arithmetic(signed, four)
        values = jnp.stack([low, high], axis=-1).reshape(rows, 2 * columns)
        return four_bit_bits.e4m3_of_codes(values) if self.values == _E2M1 else values


def packed(array: jax.Array) -> tuple[jax.Array, Packing | None]:
    """(what the kernel takes, how it unpacks it): a 4-bit array as bytes along its last axis;
    any other array as it is (None)."""
    dtype = jnp.dtype(array.dtype)
    if dtype not in EXACT_IN_8_BITS:
        return array, None
    *leading, last = array.shape
    if last % 2:
        array = jnp.pad(array, [(0, 0)] * len(leading) + [(0, 1)])
        last += 1
    pairs = array.reshape(*leading, last // 2, 2)
    return four_bit_bits.as_bytes(pairs), Packing(dtype)


def load(ref, index: tuple, rows: jax.Array | None, columns, inside: jax.Array | None,
         limit: int, packing: Packing | None, alignment: int = 1) -> jax.Array:
    """The 2-D tile ref[*index, columns] (`columns` a pl.ds along the last axis), 0 outside
    rows[:, None] & inside[None, :], in the tile dtype. For a packed operand `columns` counts
    values: the tile reads the bytes holding them (`columns.start` a multiple of `alignment`,
    even, as the kernels' tiles are), and `inside` (None: every column) becomes the bytes
    holding values before `limit`; with an odd `limit`, the last byte's second value is the
    appended zero."""
    from jax.experimental import pallas as pl

    if packing is None:
        return _tiles.masked_load(ref.at[(*index, columns)], rows, inside)
    half = columns.size // 2
    start = _tiles.div(jnp.asarray(columns.start, jnp.int32), 2)
    if alignment > 1:
        start = pl.multiple_of(start, alignment // 2)
    byte_inside = None if inside is None else _tiles.span(start, half) * 2 < limit
    tile = _tiles.masked_load(ref.at[(*index, pl.ds(start, half))], rows, byte_inside)
    return packing.unpacked(tile)
