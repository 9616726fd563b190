"""Small in-kernel helpers shared by the Triton grouped matmuls: masks, integer division, loads,
how tiles are multiplied.

The masks, loads and products run while a kernel body is traced; all integers are non-negative, so
plain `lax.div`/`lax.rem` (one Triton instruction each) replace Python's floor division.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub import quantization
from kernelhub._core.dtypes import promoted
from kernelhub.quantization import EXACT_IN_BFLOAT16


def div(a: jax.Array, b: int) -> jax.Array:
    return lax.div(a, jnp.asarray(b, a.dtype))


def rem(a: jax.Array, b: int) -> jax.Array:
    return lax.rem(a, jnp.asarray(b, a.dtype))


def span(first: jax.Array, size: int) -> jax.Array:
    """The indices first .. first + size - 1."""
    return first + jnp.arange(size, dtype=jnp.int32)


def within(index: jax.Array, limit: int, block: int) -> jax.Array | None:
    """index < limit, or None when the block size divides the limit (then no index is past it,
    and leaving the mask out lets Triton vectorise the access)."""
    return None if limit % block == 0 else index < limit


def masked_load(ref, rows: jax.Array | None, cols: jax.Array | None) -> jax.Array:
    """Loads a 2-D block, reading 0 wherever rows[:, None] & cols[None, :] is False.

    Masked-off elements are never read (on the GPU) and become exact zeros, so neither garbage
    past the array nor a NaN in another group's rows can enter the product.
    """
    from jax.experimental.pallas import triton as plgpu

    mask = full_mask(ref.shape, rows, cols)
    if mask is None:
        return plgpu.load(ref)
    return plgpu.load(ref, mask=mask, other=jnp.zeros((), ref.dtype))


def vector_load(ref, inside: jax.Array | None) -> jax.Array:
    """Loads a 1-D block, reading 0 where `inside` is False (None: everywhere inside)."""
    from jax.experimental.pallas import triton as plgpu

    if inside is None:
        return plgpu.load(ref)
    return plgpu.load(ref, mask=inside, other=jnp.zeros((), ref.dtype))


def block_scales(ref, block_size: int | None, position: jax.Array,
                 where: Callable[[jax.Array], tuple], inside: jax.Array | None) -> jax.Array | None:
    """The float32 scale vector `ref.at[where(b)]` of the scale block b holding contraction index
    `position` (0 where `inside` is False), or None for an operand without scale blocks."""
    if block_size is None:
        return None
    return vector_load(ref.at[where(div(position, block_size))], inside).astype(jnp.float32)


def scaled_by(tile: jax.Array, vector: jax.Array | None, axis: int) -> jax.Array:
    """The 2-D `tile` in float32 times `vector` running along its `axis` (unchanged for None):
    a tile dequantized by the scales of one output block (OutputBlockScales)."""
    if vector is None:
        return tile
    return tile.astype(jnp.float32) * (vector[:, None] if axis == 0 else vector[None, :])


def compute_dtype(lhs_dtype, rhs_dtype) -> jnp.dtype:
    """The dtype tiles are widened to when they are not multiplied as stored (`tile_product`):
    int8 and fp8 count as the bf16 they widen to exactly (so int8 or fp8 with bf16 runs on bf16
    tensor cores), then the promotion. Its size is what the block heuristics go by."""
    lhs_dtype, rhs_dtype = (jnp.dtype(jnp.bfloat16) if jnp.dtype(d) in EXACT_IN_BFLOAT16
                            else jnp.dtype(d) for d in (lhs_dtype, rhs_dtype))
    return promoted(lhs_dtype, rhs_dtype)


@dataclasses.dataclass(frozen=True)
class TileProduct:
    """How a kernel multiplies its tiles and sums the products along the contraction.

    widen_to: the dtype both tiles are cast to before `dot` (float32 sums), or None when they
    are multiplied as stored (int8 x int8, fp8 x fp8: kernelhub/_pallas/gpu/_narrow_dot.py).
    total_dtype: the loop-carried sum: float32, or int32 for int8 x int8 (exact).
    """

    widen_to: jnp.dtype | None
    total_dtype: jnp.dtype

    def zeros(self, shape: tuple[int, int]) -> jax.Array:
        return jnp.zeros(shape, self.total_dtype)

    def add(self, total: jax.Array, left: jax.Array, right: jax.Array,
            trans_b: bool = False) -> jax.Array:
        """total + left @ right (right transposed with trans_b)."""
        from kernelhub._pallas.gpu import _narrow_dot

        if self.widen_to is not None:
            # Triton folds `total + dot` into one dot accumulating in place (MMA pipelining).
            # An int32 total (int8 tiles into an int32 output) takes each block's float32 sum,
            # exact below 2**24, so for contraction blocks of up to 1024 int8 products.
            return total + dot(left.astype(self.widen_to), right.astype(self.widen_to),
                               trans_b).astype(total.dtype)
        if total.dtype == _narrow_dot.accumulator_dtype(left.dtype, right.dtype):
            return _narrow_dot.accumulate(total, left, right, trans_b)
        # int8 over a contraction too long for exact int32 sums: each block's sum is exact,
        # and the blocks are summed in float32.
        block = _narrow_dot.accumulate(jnp.zeros(total.shape, jnp.int32), left, right, trans_b)
        return total + block.astype(jnp.float32)

    def add_scaled(self, total: jax.Array, left: jax.Array, right: jax.Array,
                   row_scale: jax.Array | None, col_scale: jax.Array | None,
                   trans_b: bool = False) -> jax.Array:
        """total + (left @ right) * row_scale[:, None] * col_scale[None, :], the product summed
        as `add` sums it (from zero) and `total` float32: one contraction step inside a scale
        block (kernelhub/_grouped_matmul/contraction_scales.py). None scales are left out."""
        part = self.result(self.add(self.zeros(total.shape), left, right, trans_b))
        if row_scale is not None:
            part = part * row_scale[:, None]
        if col_scale is not None:
            part = part * col_scale[None, :]
        return total + part

    def result(self, total: jax.Array) -> jax.Array:
        return total.astype(jnp.float32)

    def output(self, total: jax.Array, dtype) -> jax.Array:
        """The finished sum in the output's `dtype`: int32 sums into an int32 output as they
        are (exact), every other sum through float32, rounded once."""
        if jnp.issubdtype(dtype, jnp.integer):
            return total.astype(dtype)
        return self.result(total).astype(dtype)


# Tiles dequantized in the kernel (scaled_by) are float32: multiplied as such (TF32 on a GPU).
FLOAT32_TILES = TileProduct(jnp.dtype(jnp.float32), jnp.dtype(jnp.float32))


def tile_product(lhs_dtype, rhs_dtype, contraction_block: int, contraction: int,
                 interpret: bool, out_dtype=jnp.float32, narrow_allowed: bool = True
                 ) -> TileProduct:
    """int8 x int8 and fp8 x fp8 tiles are multiplied as stored (int8 and fp8 wgmma on Hopper)
    where Triton allows it: contraction blocks of at least 32, and a jax whose Pallas lowering
    kernelhub can extend (interpret mode needs none). Everything else is widened
    (`compute_dtype`) and summed in float32. An int32 output (two int8 operands) is summed in
    int32 whatever the contraction (wrapping past 2**31, as lax's)."""
    from kernelhub._pallas.gpu import _narrow_dot

    narrow = _narrow_dot.accumulator_dtype(lhs_dtype, rhs_dtype)
    total = (jnp.dtype(jnp.int32) if jnp.issubdtype(out_dtype, jnp.integer)
             else jnp.dtype(jnp.float32))
    if (narrow is None or not narrow_allowed
            or contraction_block < _narrow_dot.MIN_CONTRACTION_BLOCK
            or not (interpret or _narrow_dot.triton_lowering_missing() is None)):
        return TileProduct(compute_dtype(lhs_dtype, rhs_dtype), total)
    if total == jnp.int32:
        return TileProduct(None, total)
    if narrow == jnp.int32 and contraction > quantization.MAX_EXACT_INT32_TERMS:
        return TileProduct(None, jnp.dtype(jnp.float32))
    return TileProduct(None, narrow)


def dot(left: jax.Array, right: jax.Array, trans_b: bool = False) -> jax.Array:
    """left @ right (right transposed with trans_b), accumulated in float32; tl.dot on a GPU.

    Float32 operands use TF32 on the GPU, as XLA's own dots do by default.
    """
    from jax.experimental.pallas import triton as plgpu

    return plgpu.dot(left, right, trans_b=trans_b)


def masked_store(ref, value: jax.Array, rows: jax.Array | None, cols: jax.Array | None) -> None:
    """Stores a 2-D block where rows[:, None] & cols[None, :]; other elements keep their value."""
    from jax.experimental.pallas import triton as plgpu

    mask = full_mask(ref.shape, rows, cols)
    plgpu.store(ref, value, mask=mask)


def deinterleaved(tile: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(tile[:, 0::2], tile[:, 1::2]) of a 2-D tile in registers: reshaped to column pairs,
    which Triton splits (tt.split), as a kernel cannot slice a register tile."""
    rows, columns = tile.shape
    even, odd = lax.split(tile.reshape(rows, columns // 2, 2), (1, 1), axis=2)
    return even.reshape(rows, columns // 2), odd.reshape(rows, columns // 2)


def full_mask(shape: tuple[int, int], rows: jax.Array | None,
              cols: jax.Array | None) -> jax.Array | None:
    """rows[:, None] & cols[None, :] broadcast to `shape`; None parts count as all-true."""
    if rows is None and cols is None:
        return None
    if rows is None:
        return jnp.broadcast_to(cols[None, :], shape)
    if cols is None:
        return jnp.broadcast_to(rows[:, None], shape)
    return rows[:, None] & cols[None, :]

