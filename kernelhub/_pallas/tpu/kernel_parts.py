"""Pieces both Pallas TPU kernels share: how a call is configured, and in-kernel masks."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub import quantization
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas import four_bit_bits
from kernelhub._pallas.tpu import hardware, mxu, tiling as tiling_lib


@dataclasses.dataclass(frozen=True)
class CallOptions:
    tiles: tiling_lib.Tiles
    vmem_limit_bytes: int | None
    interpret: Any
    int8_mxu: bool  # int8 x int8 tiles multiply as int8 with int32 sums
    int4_mxu: bool = False  # int4 x int4 tiles multiply as int4 with int32 sums
    fp8_mxu: bool = False  # fp8 x fp8 tiles of one kind multiply as fp8 with float32 sums

    def with_tile(self, name: str, size: int) -> CallOptions:
        """These options with one tile (`name`: "tm", "tk" or "tn") set to `size`."""
        return dataclasses.replace(self, tiles=dataclasses.replace(self.tiles, **{name: size}))

    @property
    def alias_existing(self) -> bool:
        """Whether existing_out may share the output's buffer (input_output_aliases).

        jax 0.10's TPU memory simulator (interpret=InterpretParams) pads an aliased input to
        whole blocks and returns the padded array as the output, a shape error; it gets an
        unaliased input there, which changes no value (the kernel copies what it keeps).
        """
        return isinstance(self.interpret, bool)


def call_options(problem: Problem, tiling: Any, interpret: Any) -> CallOptions:
    """Tiles, VMEM limit and interpret setting of one kernel call.

    `interpret` is False (Mosaic), True (Pallas interpret mode) or a `pltpu.InterpretParams`.
    """
    if interpret is not False:
        tiles = tiling_lib.resolve(tiling, problem, tiling_lib.default_for_interpret)
        # XLA:CPU has no int4 dot ("custom element sizes"): interpret mode multiplies int4
        # tiles as int8, which ahead-of-time compiles for TPUs do not (test_pallas_tpu.py).
        return CallOptions(tiles, None, interpret, int8_mxu=True, int4_mxu=False,
                           fp8_mxu=True)
    chip = hardware.target_chip()
    tiles = tiling_lib.resolve(tiling, problem, lambda p: tiling_lib.default_for_chip(p, chip))
    return CallOptions(tiles, chip.vmem_limit_bytes, False, **mxu.units(chip))


KERNEL_NAME_PATTERN = r"kernelhub_(gmm|gmm_t|tgmm)_(\d+)x(\d+)x(\d+)"


def kernel_name(kernel: Kernel, tiles: tiling_lib.Tiles) -> str:
    """The pallas_call's name, which carries the tiles into HLO dumps and profiles
    (kernelhub/_verify/tpu_ahead_of_time.py reads them back from the compiled program)."""
    return f"kernelhub_{kernel.value}_{tiles.tm}x{tiles.tk}x{tiles.tn}"


def widened(dtype: Any) -> Any:
    """The dtype a kernel operand of `dtype` is given in: Mosaic cannot load float16 on the
    generations targeted, so float16 travels as float32 (exactly) and the result is rounded back
    once, outside the kernel."""
    return jnp.float32 if jnp.dtype(dtype) == jnp.dtype(jnp.float16) else jnp.dtype(dtype)


def needs_widening(*dtypes: Any) -> bool:
    return any(jnp.dtype(d) == jnp.dtype(jnp.float16) for d in dtypes)


_E2M1 = jnp.dtype(jnp.float4_e2m1fn)


def kernel_operand(array: jax.Array) -> jax.Array:
    """An operand as its kernel takes it: float4_e2m1fn as its 4-bit codes (uint4, a bitcast
    on a TPU), since Mosaic has no e2m1 vectors (`tile_values` decodes them); every other as it
    is."""
    if jnp.dtype(array.dtype) == _E2M1:
        return four_bit_bits.as_uint4(array)
    return array


def tile_values(tile: jax.Array, dtype: Any, compute: Any) -> jax.Array:
    """A loaded tile of an operand of `dtype` in the `compute` dtype. e2m1 codes (uint4,
    `kernel_operand`) are decoded in float32 first: magnitude codes 0-7 are 0, 0.5, 1, 1.5
    (code / 2), 2, 3 (code - 2), 4, 6 (2 code - 8); code + 8 is the negative."""
    if jnp.dtype(dtype) != _E2M1:
        return tile.astype(compute)
    code = tile.astype(jnp.float32)
    negative = code >= 8.0
    magnitude = jnp.where(negative, code - 8.0, code)
    value = jnp.where(magnitude < 4.0, magnitude * 0.5,
                      jnp.where(magnitude < 6.0, magnitude - 2.0, 2.0 * magnitude - 8.0))
    return jnp.where(negative, -value, value).astype(compute)


def accumulator_dtype(compute: Any, contraction: int = 0, out_dtype: Any = None) -> Any:
    """What the products of `compute` tiles are summed in over a `contraction` (0: one tile's):
    int32 for int8, exact while the contraction has at most MAX_EXACT_INT32_TERMS terms; else
    float32 (a longer int8 contraction adds its tiles' exact int32 sums in float32). An int32
    output (two int8 operands) always sums in int32, wrapping as lax's (on a chip without an
    int8 MXU, through `tile_product`'s exact float32 runs)."""
    if out_dtype is not None and jnp.issubdtype(out_dtype, jnp.integer):
        return jnp.int32
    integer = jnp.dtype(compute) in mxu.INTEGER
    exact = integer and contraction <= quantization.MAX_EXACT_INT32_TERMS
    return jnp.int32 if exact else jnp.float32


# int8 x int8 products are at most 2**14 in magnitude, so float32 (24-bit significand) sums
# this many of them exactly.
EXACT_FLOAT32_INT8_TERMS = 2**24 // 2**14


def tile_product(dot: Any, lhs: jax.Array, rhs: jax.Array, lhs_axis: int, rhs_axis: int,
                 compute: Any, total_dtype: Any) -> jax.Array:
    """`dot(lhs, rhs, dtype)` over one tile, summed in `total_dtype`. An int32 total of int8
    values carried in bf16 (a chip without an int8 MXU) is summed in float32 over runs of at
    most EXACT_FLOAT32_INT8_TERMS along the contraction, each exact, and the runs in int32: the
    tile's own float32 sum could round past 2**24."""
    if jnp.dtype(total_dtype) != jnp.int32 or jnp.dtype(compute) in mxu.INTEGER:
        return dot(lhs, rhs, accumulator_dtype(compute)).astype(total_dtype)
    size = lhs.shape[lhs_axis]
    total = None
    for start in range(0, size, EXACT_FLOAT32_INT8_TERMS):
        stop = min(start + EXACT_FLOAT32_INT8_TERMS, size)
        part = dot(lax.slice_in_dim(lhs, start, stop, axis=lhs_axis),
                   lax.slice_in_dim(rhs, start, stop, axis=rhs_axis), jnp.float32)
        part = part.astype(jnp.int32)
        total = part if total is None else total + part
    return total


def result_dtype(out_dtype: Any) -> Any:
    """What an output block is finished in (selected, existing_out added): int32 for an int32
    output, exactly; float32 otherwise (exact for the 16-bit outputs, native everywhere)."""
    return jnp.int32 if jnp.issubdtype(out_dtype, jnp.integer) else jnp.float32


def contraction_precision(compute: Any) -> lax.Precision | None:
    """float32 products in full float32 precision, as the contract's accuracy needs, rather than
    whatever Mosaic's default is."""
    return lax.Precision.HIGHEST if jnp.dtype(compute) == jnp.dtype(jnp.float32) else None


def keep_first(block: jax.Array, count: jax.Array, axis: int) -> jax.Array:
    """`block` with the entries at index >= count along `axis` replaced by exact zeros."""
    index = lax.broadcasted_iota(jnp.int32, block.shape, axis)
    return jnp.where(index < count, block, jnp.zeros_like(block))


def row_mask(shape: tuple[int, ...], axis: int, first_row: jax.Array, start: jax.Array,
             end: jax.Array) -> jax.Array:
    """Boolean block: whether the row at each position along `axis` lies in [start, end)."""
    row = first_row + lax.broadcasted_iota(jnp.int32, shape, axis)
    return (row >= start) & (row < end)
