"""The fused epilogue in the Pallas TPU grouped matmul (its meaning:
kernelhub/_grouped_matmul/epilogue.py): how the gate and up columns of a gated rhs reach one
accumulator block, and what the kernel does to that block before the store.

For a glu the kernel accumulates a [tm, 2 * tn] block holding the gate and up sums of the output
tile's tn columns:
- concatenated: the gate tile (columns j * tn ..) and the up tile (n + j * tn ..) are two
  BlockSpec views of the same rhs, put side by side in VMEM. That needs n % tn == 0 (the up
  tile must start on a block boundary); otherwise the two halves are passed as two arrays, which
  costs XLA one copy of rhs per call.
- interleaved: one rhs tile of 2 * tn adjacent columns holds both halves, alternating. Mosaic
  cannot load every other lane, so the finished block is transposed (LANES rows at a time) and
  read with strided sublane loads, then transposed back: two XLU transposes per output block,
  none per contraction step.
The bias and the column scales of a quantized rhs reach the kernel as one row per group laid out
in the accumulator's column order; a quantized lhs's row scales as a [m, 1] column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from kernelhub._grouped_matmul.epilogue import CONCATENATED, INTERLEAVED, Epilogue
from kernelhub._pallas.tpu.tiling import LANES


def _output_tile(n: int, rhs_tile: int) -> int:
    """Output columns per tile of a glu whose tiling chose `rhs_tile` rhs columns: half of them
    (so the rhs tile and accumulator keep their size), at least a lane row, at most n."""
    half = max(rhs_tile // 2 // LANES * LANES, LANES)
    return n if half >= n else half


@dataclasses.dataclass(frozen=True)
class GatedColumns:
    """Where a glu kernel's gate and up tiles come from."""

    layout: str
    tn: int  # output columns per tile
    up_block: int | None  # concatenated, one array: the up tiles' block offset
    transpose_rhs: bool

    @classmethod
    def of(cls, spec: Epilogue, n: int, rhs_tile: int,
           transpose_rhs: bool) -> GatedColumns | None:
        if spec.glu is None:
            return None
        tn = _output_tile(n, rhs_tile)
        if spec.glu_layout == INTERLEAVED:
            return cls(INTERLEAVED, tn, None, transpose_rhs)
        for candidate in range(tn, LANES - 1, -LANES):
            if candidate % LANES == 0 and n % candidate == 0:
                return cls(CONCATENATED, candidate, n // candidate, transpose_rhs)
        return cls(CONCATENATED, tn, None, transpose_rhs)

    @property
    def rhs_count(self) -> int:
        return 1 if self.layout == INTERLEAVED else 2

    @property
    def _column_axis(self) -> int:
        return 1 if self.transpose_rhs else 2

    def rhs_operands(self, rhs: jax.Array) -> list[jax.Array]:
        if self.layout == INTERLEAVED:
            return [rhs]
        if self.up_block is not None:
            return [rhs, rhs]
        half = rhs.shape[self._column_axis] // 2
        gate = jax.lax.slice_in_dim(rhs, 0, half, axis=self._column_axis)
        up = jax.lax.slice_in_dim(rhs, half, 2 * half, axis=self._column_axis)
        return [gate, up]

    def rhs_specs(self, rhs_index: Callable[..., tuple], tk: int) -> list[Any]:
        from jax.experimental import pallas as pl

        width = 2 * self.tn if self.layout == INTERLEAVED else self.tn
        block = (None, width, tk) if self.transpose_rhs else (None, tk, width)
        if self.layout == INTERLEAVED:
            return [pl.BlockSpec(block, rhs_index)]
        offset = self.up_block or 0
        return [pl.BlockSpec(block, rhs_index),
                pl.BlockSpec(block, lambda ni, *rest: rhs_index(ni + offset, *rest))]

    def rhs_tile(self, refs: Sequence[Any], values: Callable[[jax.Array], jax.Array]
                 ) -> jax.Array:
        """The [tk, 2 tn] (or [2 tn, tk]) rhs tile, each loaded tile through `values` (to the
        compute dtype): gate and up columns side by side, or interleaved as stored."""
        if self.layout == INTERLEAVED:
            return values(refs[0][...])
        return jnp.concatenate([values(refs[0][...]), values(refs[1][...])],
                               axis=0 if self.transpose_rhs else 1)


def column_operand(spec: Epilogue, values: jax.Array, gate: GatedColumns | None, n: int,
                   tn: int) -> jax.Array:
    """float32 [groups, 1, tiles * width] from per-group column entries [groups, n_rhs] (a
    bias, a column scale): each output tile's entries in the order of its accumulator's columns
    (width = tn, or 2 tn for a glu)."""
    bias = values
    tiles = -(-n // tn)
    groups = bias.shape[0]
    bias = bias.astype(jnp.float32)

    def padded(part: jax.Array, width: int) -> jax.Array:
        return jnp.pad(part, ((0, 0), (0, tiles * width - part.shape[1])))

    if spec.glu is None:
        laid_out = padded(bias, tn)
    elif gate.layout == INTERLEAVED:
        laid_out = padded(bias, 2 * tn)
    else:
        halves = [padded(part, tn).reshape(groups, tiles, tn) for part in (bias[:, :n], bias[:, n:])]
        laid_out = jnp.concatenate(halves, axis=2).reshape(groups, tiles * 2 * tn)
    return laid_out[:, None, :]


def scratch(gate: GatedColumns | None, tm: int, tn: int) -> list[Any]:
    """VMEM for the interleaved layout's transposed block."""
    if gate is None or gate.layout != INTERLEAVED:
        return []
    from jax.experimental.pallas import tpu as pltpu

    del tm  # the block goes through it LANES rows at a time
    return [pltpu.VMEM((2 * tn, LANES), jnp.float32)]


def finished(total: jax.Array, spec: Epilogue, gate: GatedColumns | None, row_scale_ref: Any,
             column_scale_ref: Any, bias_ref: Any, transposed_refs: Sequence[Any]) -> jax.Array:
    """The output block from the float32 accumulator block `total` [tm, tn or 2 tn]: scaled by
    the rows' [tm, 1] and the group's columns' [1, width] scales of quantized operands, the
    bias [1, width] added, then the activation or gate."""
    from jax.experimental import pallas as pl

    z = total
    if row_scale_ref is not None:
        z = z * row_scale_ref[...]
    if column_scale_ref is not None:
        z = z * column_scale_ref[...]
    if bias_ref is not None:
        z = z + bias_ref[...]
    if gate is None:
        return spec.activate(z)
    if gate.layout == CONCATENATED:
        return spec.gated(z[:, :gate.tn], z[:, gate.tn:])
    # Mosaic's strided loads need a memref whose last dim is one lane row: the block goes
    # through the transposed scratch LANES rows at a time (a shorter block padded to LANES).
    transposed = transposed_refs[0]
    rows = z.shape[0]
    parts = []
    for start in range(0, rows, LANES):
        part = z[start:start + LANES]
        size = part.shape[0]
        if size < LANES:
            part = jnp.concatenate([part, jnp.zeros((LANES - size, part.shape[1]), part.dtype)])
        transposed[...] = part.T
        gate_rows = transposed[pl.ds(0, gate.tn, stride=2), :]
        up_rows = transposed[pl.ds(1, gate.tn, stride=2), :]
        parts.append(spec.gated(gate_rows, up_rows).T[:size])
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)
