"""Scale blocks applied inside the Pallas kernels: along the contraction, and (in backward
products) along an output axis.

An operand quantized with several scale blocks along its contraction axis (kernelhub/
quantization.py: `block_size` elements share a scale) cannot have its scales applied around a
kernel: they change within one output element's sum. The kernels take its values and these
scales instead, and split the contraction into steps that each lie inside one block of every
scaled operand. Each step's product of the stored values (int32 sums for int8 x int8, exact
float32 sums of fp8 or bf16-widened products otherwise) is multiplied by the step's row and
column scales and added into a float32 total: the contract's "each k-block's product scaled and
summed in float32".

Block sizes the kernels step through (`fits_kernels`): multiples of 16 that are powers of two or
multiples of 128, which covers the usual 32 (MX formats), 64 and 128 (DeepSeek-style 1x128 and
128x128). A Triton contraction block is then a power of two dividing the scale block; a TPU
contraction tile, a multiple of 128, holds whole scale blocks or lies inside one. Other sizes
run on the XLA implementation (feature QUANTIZED_ODD_BLOCKS, kernelhub/ops/_checks.py).

In a backward product the blocked operand meets a float cotangent, its blocks now along an
output axis (`OutputBlockScales`): each output tile lies in one block or holds whole ones, and
the kernels dequantize its tiles by the blocks' scale vectors along the contraction.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kernelhub.quantization import expand_scale

# The smallest contraction step of any kernel: Triton's dot needs 16.
_SMALLEST_STEP = 16
_TPU_LANES = 128


class ContractionScales(NamedTuple):
    """The scale-blocked operands of one kernel call, in the contracts' layouts.

    lhs: gmm [m, blocks] (lhs quantized along k); tgmm [k, blocks] (lhs quantized along m).
    rhs: gmm [G, blocks, n], or [G, n, blocks] with transpose_rhs; tgmm [blocks, n].
    Each None when that operand has no scale blocks along the contraction.
    """

    lhs: jax.Array | None
    lhs_block: int
    rhs: jax.Array | None
    rhs_block: int

    @property
    def arrays(self) -> tuple[jax.Array, ...]:
        """The scale arrays a kernel takes, after lhs and rhs: lhs's, then rhs's, when given."""
        return tuple(scale for scale in (self.lhs, self.rhs) if scale is not None)

    @property
    def operand_blocks(self) -> tuple[int | None, int | None]:
        """(lhs's block size, rhs's), None for an operand without scale blocks."""
        return (self.lhs_block if self.lhs is not None else None,
                self.rhs_block if self.rhs is not None else None)

    @property
    def block_sizes(self) -> tuple[int, ...]:
        return tuple(block for scale, block in ((self.lhs, self.lhs_block),
                                                (self.rhs, self.rhs_block)) if scale is not None)

    @property
    def common_block(self) -> int:
        """The largest length every operand's scale blocks are made of: a contraction step
        within one block of each divides it."""
        return math.gcd(*self.block_sizes)


NO_SCALES = ContractionScales(None, 0, None, 0)


class OutputBlockScales(NamedTuple):
    """Operands with scale blocks along an output axis: in the backward products, where the
    quantized operand meets a float cotangent along what was an output axis of the forward
    product (so its scales vary along this product's contraction too). The kernels load each
    tile's scale vector along the contraction, the output tile lying inside one block, and
    multiply the widened tile by it: the operand dequantized tile by tile, never as a whole.

    lhs: gmm [row blocks, k] (lhs quantized along m); tgmm [k blocks, m] (lhs quantized along k).
    rhs: gmm [G, k, n blocks], or [G, n blocks, k] with transpose_rhs; tgmm [m, n blocks].
    """

    lhs: jax.Array | None
    lhs_block: int
    rhs: jax.Array | None
    rhs_block: int

    arrays = ContractionScales.arrays
    operand_blocks = ContractionScales.operand_blocks


NO_OUTPUT_BLOCKS = OutputBlockScales(None, 0, None, 0)


def blocked_axes(blocks: ContractionScales | OutputBlockScales, tgmm: bool,
                 transpose_rhs: bool = False) -> tuple[int, int]:
    """The axis of lhs and of rhs along which `blocks`' scale blocks run, in the layouts the
    classes' docstrings give (the scale arrays have the values' rank, that axis counting
    blocks)."""
    if isinstance(blocks, ContractionScales):
        return (1, 0) if tgmm else (1, 2 if transpose_rhs else 1)
    return (0, 1) if tgmm else (0, 1 if transpose_rhs else 2)


def dequantized(lhs: jax.Array, rhs: jax.Array, blocks: ContractionScales | OutputBlockScales,
                tgmm: bool, transpose_rhs: bool = False) -> tuple[jax.Array, jax.Array]:
    """lhs and rhs in float32 with `blocks`' scales multiplied in, each repeated over its
    block (an operand without scale blocks unchanged): for a kernel that takes some kinds of
    blocks itself and has others widened first. Along an output axis this is what a tile
    dequantized in the kernel holds; along the contraction each product is scaled before the
    sum rather than each block's sum after it, as the xla loops do."""
    axes = blocked_axes(blocks, tgmm, transpose_rhs)
    operands = []
    for values, scale, block, axis in zip((lhs, rhs), (blocks.lhs, blocks.rhs),
                                          (blocks.lhs_block, blocks.rhs_block), axes):
        if scale is not None:
            values = values.astype(jnp.float32) * expand_scale(
                scale.astype(jnp.float32), axis, block, values.shape[axis])
        operands.append(values)
    return operands[0], operands[1]


def take_scale_refs(refs: Any, *blocks: int | None) -> tuple[Any, ...]:
    """From a kernel's refs following lhs and rhs, where the scale arrays come first (one per
    block size in `blocks` that is not None, as `arrays` orders them): one ref or None per
    block size, then the list of the refs after them."""
    refs = list(refs)
    taken = tuple(refs.pop(0) if block is not None else None for block in blocks)
    return (*taken, refs)


def fits_kernels(block_size: int) -> bool:
    """Whether the Pallas kernels step through scale blocks of `block_size` (module docstring)."""
    if block_size % _SMALLEST_STEP:
        return False
    return block_size & (block_size - 1) == 0 or block_size % _TPU_LANES == 0


def largest_power_of_two_dividing(value: int) -> int:
    return value & -value
