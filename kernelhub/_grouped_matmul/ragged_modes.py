"""The three modes of ragged_dot_general as grouped matmuls (contract: kernelhub/ops/ragged_dot.py).

A `Plan` reads the dimension numbers once, statically, and says how each operand reaches a
kernel's layout: one transpose (none when the operand already is in that order, the usual case)
and reshapes that merge neighbouring axes, which cost nothing. Then:

- ragged non-contracting dim (mode 1): grouped_matmul. Rows are the ragged dim with the free
  dims after it; transpose_rhs is used when rhs keeps its free dims before its contracting
  ones, so that rhs is never copied for it.
- ragged contracting dim (mode 2): transposed_grouped_matmul, its layout being exactly
  lax's [m, k] x [k, n] with k ragged. Contracting dims after the ragged one join the rows;
  those before it each have their own group sizes, so they are a vmap whose results add up.
  An lhs whose ragged axis comes before its free ones ([k, m] with k ragged, the layout of a
  weight gradient) is transposed once: transposed_grouped_matmul has no layout that reads it.
- ragged batch dim (mode 3): grouped_matmul with one group per batch entry, each with its own
  matrix. A leading group that is not local covers the entries before the first local one, and
  entries past the last local group have size 0, so they stay exactly 0 without any masking.

Batch dims (and, in mode 1, free dims before the ragged one, which have their own group sizes)
are vmaps of the kernels.

A QuantizedArray operand goes through the same transposes and reshapes, its scale (and source)
with its values: it must be quantized along the last of the axes the kernel's contraction axis
merges (`contraction_group`), so that its scale blocks stay blocks of that axis. Integer
operands give int32 kernel results (exact sums), cast once to the result dtype, as do outputs
the kernels do not write (int8, fp8: lax's result for such operands without a preferred type).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from kernelhub._grouped_matmul.epilogue import Epilogue
from kernelhub._grouped_matmul.groups import group_bounds
from kernelhub.quantization import QuantizedArray


class Mode(enum.Enum):
    RAGGED_NONCONTRACTING = 1
    RAGGED_CONTRACTING = 2
    RAGGED_BATCH = 3


@dataclasses.dataclass(frozen=True)
class Axes:
    """Axes of one operand, by role, each list in the order it is flattened in."""

    batch: tuple[int, ...]
    outer: tuple[int, ...]  # before the ragged axis, with their own group sizes (vmapped)
    ragged: tuple[int, ...]  # the ragged axis and the axes merged with it into rows or groups
    contracting: tuple[int, ...]
    free: tuple[int, ...]

    def order(self, *roles: str) -> tuple[int, ...]:
        return tuple(axis for role in roles for axis in getattr(self, role))


@dataclasses.dataclass(frozen=True)
class Plan:
    mode: Mode
    lhs: Axes
    rhs: Axes
    rhs_group_axis: int | None
    transpose_rhs: bool
    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    num_groups: int
    out_shape: tuple[int, ...]

    def size(self, operand: str, role: str) -> int:
        axes, shape = (self.lhs, self.lhs_shape) if operand == "lhs" else (self.rhs, self.rhs_shape)
        return math.prod(shape[a] for a in getattr(axes, role))

    @property
    def rows_per_ragged_index(self) -> int:
        """Rows (mode 1, 2) or groups (mode 3) each index of the ragged axis stands for."""
        return self.size("lhs", "ragged") // self.lhs_shape[self.lhs.ragged[0]]

    @property
    def prefix(self) -> tuple[int, ...]:
        """lhs axes that group_sizes may carry in front of its last axis, in lax's order."""
        return self.lhs.batch + self.lhs.outer if self.mode is not Mode.RAGGED_BATCH else self.lhs.outer


@functools.lru_cache(maxsize=256)
def plan(lhs_shape: Sequence[int], rhs_shape: Sequence[int], dimension_numbers,
         num_groups: int) -> Plan:
    """The plan for already validated dimension numbers (see ragged_dot.py)."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers.dot_dimension_numbers
    ragged, = dimension_numbers.lhs_ragged_dimensions
    rhs_groups = tuple(dimension_numbers.rhs_group_dimensions)
    lhs_free = tuple(a for a in range(len(lhs_shape)) if a not in lhs_contract + lhs_batch)
    rhs_free = tuple(a for a in range(len(rhs_shape))
                     if a not in rhs_contract + rhs_batch + rhs_groups)
    lhs_contract, rhs_contract = tuple(lhs_contract), tuple(rhs_contract)
    lhs_batch, rhs_batch = tuple(lhs_batch), tuple(rhs_batch)

    if ragged in lhs_free:
        mode = Mode.RAGGED_NONCONTRACTING
        at = lhs_free.index(ragged)
        lhs = Axes(lhs_batch, lhs_free[:at], lhs_free[at:], lhs_contract, ())
        rhs = Axes(rhs_batch, (), (), rhs_contract, rhs_free)
    elif ragged in lhs_contract:
        mode = Mode.RAGGED_CONTRACTING
        at = lhs_contract.index(ragged)
        lhs = Axes(lhs_batch, lhs_contract[:at], lhs_contract[at:], (), lhs_free)
        rhs = Axes(rhs_batch, rhs_contract[:at], rhs_contract[at:], (), rhs_free)
    else:
        mode = Mode.RAGGED_BATCH
        at = lhs_batch.index(ragged)
        lhs = Axes((), lhs_batch[:at], lhs_batch[at:], lhs_contract, lhs_free)
        rhs = Axes((), rhs_batch[:at], rhs_batch[at:], rhs_contract, rhs_free)
    # A kernel reads rhs as [.., k, n], or as [.., n, k] with transpose_rhs: take the one that
    # rhs is already closer to, so that a transposed layout is read in place.
    transpose_rhs = bool(rhs.contracting and rhs.free and rhs.free[0] < rhs.contracting[0])

    out_shape = (tuple(lhs_shape[a] for a in lhs_batch)
                 + tuple(lhs_shape[a] for a in lhs_free)
                 + tuple(rhs_shape[a] for a in rhs_free))
    if mode is Mode.RAGGED_CONTRACTING:
        out_shape = (num_groups,) + out_shape
    return Plan(mode, lhs, rhs, rhs_groups[0] if rhs_groups else None, transpose_rhs,
                tuple(lhs_shape), tuple(rhs_shape), num_groups, out_shape)


def contraction_group(p: Plan, operand: str) -> tuple[int, ...]:
    """The axes of `operand` ("lhs" or "rhs") that the kernels' contraction axis merges, in
    order: a quantized operand must be quantized along the last of them."""
    axes = p.lhs if operand == "lhs" else p.rhs
    return axes.ragged if p.mode is Mode.RAGGED_CONTRACTING else axes.contracting


def _transposed(x: jax.Array, order: Sequence[int], shape: Sequence[int]) -> jax.Array:
    if tuple(order) != tuple(range(x.ndim)):
        x = jnp.transpose(x, order)
    return x.reshape(tuple(shape))


def _arranged(x, order: Sequence[int], shape: Sequence[int], group: Sequence[int] = (),
              at: int = 0):
    """`x` transposed to `order` (a no-op when it already is) and reshaped to `shape`.

    A QuantizedArray's values and source go the same way and its scale with them, the
    contraction `group` (its quantized axis last) merging into dim `at` of `shape`, its new
    axis. The vmaps over the leading dims then leave the kernel's layout, in which it is still
    the contraction axis (a QuantizedArray counts its axis from the end through vmaps)."""
    if not isinstance(x, QuantizedArray):
        return _transposed(x, order, shape)
    others = math.prod(x.shape[a] for a in group[:-1])
    scale_shape = list(shape)
    scale_shape[at] = others * x.num_blocks
    # Merged after whole axes of others, each stretch of the quantized axis keeps its blocks
    # (the contract checks that they are whole), or is one block of its own without any.
    block = x.block_size if others == 1 else (x.block_size or x.shape[x.axis])
    return QuantizedArray._unchecked(
        _transposed(x.values, order, shape), _transposed(x.scale, order, scale_shape),
        at, block, None if x.source is None else _transposed(x.source, order, shape))


def _is_integer(operand: Any) -> bool:
    return (not isinstance(operand, QuantizedArray)
            and jnp.issubdtype(jnp.dtype(operand.dtype), jnp.integer))


_KERNEL_FLOATS = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def kernel_dtype(lhs: Any, rhs: Any, out_dtype: Any) -> Any:
    """What the grouped matmuls write for a result of `out_dtype`: int32 for two integer
    operands (their exact sums, cast once after), `out_dtype` where it is a float the kernels
    write, else float32 (the float32 sums, cast once: to int32, int8 or fp8 as lax's)."""
    if _is_integer(lhs) and _is_integer(rhs):
        return jnp.dtype(jnp.int32)
    out_dtype = jnp.dtype(out_dtype)
    return out_dtype if out_dtype in _KERNEL_FLOATS else jnp.dtype(jnp.float32)


GroupedMatmul = Callable[..., jax.Array]


def _mapped(fn: Callable[..., jax.Array], in_axes: Sequence[int | None], size: int):
    """jax.vmap(fn, in_axes) over an axis of `size`; for size 1, fn on that axis's only entry
    (a vmap would make the kernels batched: slower, and for nothing)."""
    if size != 1:
        return jax.vmap(fn, in_axes=tuple(in_axes))

    def single(*args):
        args = [a if axis is None else jax.tree.map(lambda leaf: jnp.squeeze(leaf, axis), a)
                for a, axis in zip(args, in_axes)]
        return jnp.expand_dims(fn(*args), 0)

    return single


def run(p: Plan, lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
        group_offset: jax.Array | None, out_dtype, gmm: GroupedMatmul,
        tgmm: GroupedMatmul, activation: Any = None) -> jax.Array:
    """The result of ragged_dot_general, computed with the given grouped-matmul kernels.

    group_sizes arrive as [*prefix, g] int32 (already broadcast to the prefix lax allows);
    group_offset as an int32 scalar or None. `activation` (a name or callable, as
    grouped_matmul's) is fused into grouped_matmul in modes 1 and 3; in mode 2 it follows the
    float32 products (transposed_grouped_matmul has no epilogue).
    """
    result_dtype, out_dtype = jnp.dtype(out_dtype), kernel_dtype(lhs, rhs, out_dtype)
    if p.mode is Mode.RAGGED_NONCONTRACTING:
        out = _noncontracting(p, lhs, rhs, group_sizes, group_offset, out_dtype, gmm, activation)
    elif p.mode is Mode.RAGGED_CONTRACTING:
        contracting_dtype = out_dtype if activation is None else jnp.dtype(jnp.float32)
        out = _contracting(p, lhs, rhs, group_sizes, group_offset, contracting_dtype, tgmm)
        if activation is not None:
            out = _activated_groups(out, activation, group_offset, p.num_groups)
    else:
        out = _batch(p, lhs, rhs, group_sizes, group_offset, out_dtype, gmm, activation)
    return out.reshape(p.out_shape).astype(result_dtype)


def _activated_groups(out: jax.Array, activation: Any, group_offset: jax.Array | None,
                      num_groups: int) -> jax.Array:
    """Mode 2's [g, ...] float32 products activated; with an offset, the entries past the last
    group stay 0."""
    activated = Epilogue(activation=activation).activate(out)
    if group_offset is None:
        return activated
    entry = group_offset + jnp.arange(out.shape[0], dtype=jnp.int32)
    inside = (entry < num_groups).reshape((-1,) + (1,) * (out.ndim - 1))
    return jnp.where(inside, activated, jnp.zeros((), activated.dtype))


def _in_rows(p: Plan, sizes: jax.Array) -> jax.Array:
    """Group sizes counted in the kernels' rows (modes 1 and 2), where each ragged index is
    `rows_per_ragged_index` rows. Sizes may sum past the ragged axis (lax drops the excess, and
    so do the kernels, whose running sums saturate at their rows); a size is first cut to the
    axis's length, which no group can exceed, so that the product cannot wrap int32."""
    per_index = p.rows_per_ragged_index
    if per_index == 1:
        return sizes
    extent = p.lhs_shape[p.lhs.ragged[0]]
    return jnp.minimum(jnp.maximum(sizes, 0), extent) * per_index


def _noncontracting(p, lhs, rhs, sizes, group_offset, out_dtype, gmm, activation=None):
    b, x = p.size("lhs", "batch"), p.size("lhs", "outer")
    rows, k, n = p.size("lhs", "ragged"), p.size("lhs", "contracting"), p.size("rhs", "free")
    local = p.rhs_shape[p.rhs_group_axis]
    lhs = _arranged(lhs, p.lhs.order("batch", "outer", "ragged", "contracting"), (b, x, rows, k),
                    p.lhs.contracting, 3)
    inner = ("free", "contracting") if p.transpose_rhs else ("contracting", "free")
    rhs = _arranged(rhs, (p.rhs_group_axis,) + p.rhs.order("batch", *inner),
                    (local, b) + ((n, k) if p.transpose_rhs else (k, n)), p.rhs.contracting,
                    3 if p.transpose_rhs else 2)
    sizes = _in_rows(p, sizes).reshape((b, x, p.num_groups))

    def one(lhs, rhs, sizes):
        return gmm(lhs, rhs, sizes, preferred_element_type=out_dtype, group_offset=group_offset,
                   transpose_rhs=p.transpose_rhs, activation=activation)

    over_outer = _mapped(one, (0, None, 0), x)
    return _mapped(over_outer, (0, 1, 0), b)(lhs, rhs, sizes)  # [b, x, rows, n]


def _contracting(p, lhs, rhs, sizes, group_offset, out_dtype, tgmm):
    b, x = p.size("lhs", "batch"), p.size("lhs", "outer")
    rows, m, n = p.size("lhs", "ragged"), p.size("lhs", "free"), p.size("rhs", "free")
    lhs = _arranged(lhs, p.lhs.order("batch", "outer", "free", "ragged"), (b, x, m, rows),
                    p.lhs.ragged, 3)
    rhs = _arranged(rhs, p.rhs.order("batch", "outer", "ragged", "free"), (b, x, rows, n),
                    p.rhs.ragged, 2)
    sizes = _in_rows(p, sizes).reshape((b, x, p.num_groups))
    if group_offset is not None:
        # Result entry j is group group_offset + j; the groups past the last are empty.
        sizes = jnp.concatenate([sizes, jnp.zeros_like(sizes)], axis=-1)
    # Contracting axes before the ragged one have their own group sizes: their products add
    # up, in float32 (int32 for integer operands) before the one rounding.
    dtype = out_dtype if x == 1 or out_dtype == jnp.int32 else jnp.float32

    def one(lhs, rhs, sizes):
        return tgmm(lhs, rhs, sizes, preferred_element_type=dtype, group_offset=group_offset,
                    num_actual_groups=p.num_groups)

    out = _mapped(_mapped(one, (0, 0, 0), x), (0, 0, 0), b)(lhs, rhs, sizes)  # [b, x, g, m, n]
    out = jnp.sum(out, axis=1).astype(out_dtype) if x != 1 else out[:, 0]
    return out[0] if b == 1 else jnp.moveaxis(out, 1, 0)  # [g, b, m, n]


def _batch(p, lhs, rhs, sizes, group_offset, out_dtype, gmm, activation=None):
    x = p.size("lhs", "outer")
    entries = p.size("lhs", "ragged")  # the ragged axis with the batch axes after it
    per_index = p.rows_per_ragged_index  # entries per index of the ragged axis
    m, k, n = p.size("lhs", "free"), p.size("lhs", "contracting"), p.size("rhs", "free")
    lhs = _arranged(lhs, p.lhs.order("outer", "ragged", "free", "contracting"), (x, entries * m, k),
                    p.lhs.contracting, 2)
    inner = ("free", "contracting") if p.transpose_rhs else ("contracting", "free")
    rhs = _arranged(rhs, p.rhs.order("outer", "ragged", *inner),
                    (x, entries) + ((n, k) if p.transpose_rhs else (k, n)), p.rhs.contracting,
                    3 if p.transpose_rhs else 2)
    sizes = sizes.reshape((x, p.num_groups))
    extent = p.lhs_shape[p.lhs.ragged[0]]

    def one(lhs, rhs, sizes):
        # The local groups are group_offset.. (all of them without one): ragged indices
        # [first, last). The kernel's groups are one leading group that is not local, covering
        # the entries before `first`, then every entry, of m rows or of none.
        starts, ends = group_bounds(sizes, extent)
        last = ends[-1]
        if group_offset is None:
            first = jnp.int32(0)
        else:
            inside = (group_offset >= 0) & (group_offset < p.num_groups)
            first = jnp.where(inside, starts[jnp.clip(group_offset, 0, p.num_groups - 1)], last)
        index = jnp.arange(entries, dtype=jnp.int32) // per_index
        entry_sizes = jnp.where((index >= first) & (index < last), m, 0).astype(jnp.int32)
        kernel_sizes = jnp.concatenate([(first * per_index * m).reshape(1), entry_sizes])
        return gmm(lhs, rhs, kernel_sizes, preferred_element_type=out_dtype, group_offset=1,
                   transpose_rhs=p.transpose_rhs, activation=activation)

    return _mapped(one, (0, 0, 0), x)(lhs, rhs, sizes)
