"""How the grouped-matmul ops split over explicit mesh axes (kernelhub/_core/explicit_sharding.py).

Each operand's dims are named by what they are to the product; a name sharded over mesh axes
must be sharded the same way in every operand that has it, and each mesh axis may shard one
name only (else a device would hold blocks of two operands that do not meet). Then, per name:

- free dims (lhs rows of mode 1 aside, rhs columns, batch dims): each device computes its
  block; the result is sharded as they are (dot_general's rule: batch, lhs free, rhs free);
- the ragged dim (lhs rows): each device cuts the group sizes to its own rows; in the ragged
  contracting mode (transposed_grouped_matmul, ragged_dot_general mode 2) its partial products
  are summed over the devices, in float32 (int32 for two integer operands) and cast after;
- rhs's group dim (experts; grouped_matmul, ragged_dot mode 1): each device computes the rows
  of its experts, its group_offset moved to its first one; the other rows are exactly 0, so
  the sum over the devices is exact in any dtype (existing_out is refused there);
- contracting dims (k), group_sizes' last dim and transposed_grouped_matmul's output groups:
  refused with a ValueError: a kernel needs whole contractions and every group size.

group_sizes with a prefix (ragged_dot_general) may be replicated where lhs is sharded: each
device takes its slice. A quantized operand's values and scales must be replicated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from kernelhub._core import explicit_sharding
from kernelhub._core.explicit_sharding import Split, as_partition_spec, spec_of
from kernelhub._grouped_matmul import names
from kernelhub._grouped_matmul.groups import group_bounds
from kernelhub._grouped_matmul.ragged_modes import Mode, kernel_dtype, plan
from kernelhub.ops import ragged_dot as ragged_contract
from kernelhub.quantization import QuantizedArray

# What a dim is to the product.
FREE, RAGGED, RAGGED_SUM, EXPERTS = "free", "ragged", "ragged_sum", "experts"
CONTRACTING, GROUP = "contracting", "group"

_REFUSED = {
    CONTRACTING: "is a contracting dim: the kernels need whole contractions; reshard it "
                 "unsharded (jax.sharding.reshard(x, P(...)) with None there)",
    GROUP: "holds the groups: a kernel call needs all of them; reshard it unsharded",
}


@dataclasses.dataclass(frozen=True)
class PerDevice:
    """What one device's call takes and gives (kernelhub/_core/explicit_sharding.Split)."""

    # (group_sizes' dim, operand, its dim, axes): a replicated prefix each device slices
    slices: tuple[tuple[int, str, int, tuple[str, ...]], ...] = ()
    ragged: tuple[str, int, tuple[str, ...]] | None = None  # (operand, dim, axes) of split rows
    experts: tuple[int, tuple[str, ...]] | None = None  # (rhs's group dim, axes) splitting it
    summed: tuple[str, ...] = ()  # axes the partial products are summed over
    result_dtype: Any = None  # the dtype after that sum
    overrides: tuple[tuple[str, Any], ...] = ()

    def arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        arguments = {**arguments, **dict(self.overrides)}
        sizes = arguments["group_sizes"]
        for sizes_dim, operand, dim, axes in self.slices:
            extent = jnp.shape(arguments[operand])[dim]
            sizes = jax.lax.dynamic_slice_in_dim(sizes, jax.lax.axis_index(axes) * extent,
                                                 extent, sizes_dim)
        if self.ragged is not None:  # each group's rows that lie in this device's block
            operand, dim, axes = self.ragged
            extent = jnp.shape(arguments[operand])[dim]
            first = jax.lax.axis_index(axes) * extent
            # The unsharded call's bounds: sums that would wrap int32 saturate at the rows.
            starts, ends = group_bounds(sizes, extent * jax.lax.psum(1, axes))
            sizes = (jnp.clip(ends, first, first + extent)
                     - jnp.clip(starts, first, first + extent))
        arguments["group_sizes"] = sizes
        if self.experts is not None:  # this device's experts start at its first one
            dim, axes = self.experts
            first = jax.lax.axis_index(axes) * jnp.shape(arguments["rhs"])[dim]
            offset = arguments["group_offset"]
            arguments["group_offset"] = first if offset is None else offset + first
        return arguments

    def outputs(self, out: jax.Array) -> jax.Array:
        if self.summed:
            out = jax.lax.psum(out, self.summed)
        return out if self.result_dtype is None else out.astype(self.result_dtype)


def _dims(op: str, name: str, value: Any) -> tuple[tuple[str, ...], ...]:
    if isinstance(value, QuantizedArray):
        if any(axes for leaf in jax.tree.leaves(value) for axes in spec_of(leaf)):
            raise ValueError(f"{op}: {name} is quantized and sharded over explicit mesh axes; "
                             f"a quantized operand's values and scales must be replicated "
                             f"(P())")
        return ((),) * len(value.shape)
    return spec_of(value)


def _check(op: str, operands: Sequence[tuple[str, Any, Sequence[str]]],
           roles: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """Per dim name, the mesh axes it is sharded over; a ValueError naming the operand and dim
    whose sharding no kernel can take."""
    seen: dict[str, tuple[str, int, tuple[str, ...]]] = {}
    owner: dict[str, tuple[str, str, int]] = {}
    for name, value, dim_names in operands:
        if value is None:
            continue
        for dim, (dim_name, axes) in enumerate(zip(dim_names, _dims(op, name, value))):
            if dim_name in seen and seen[dim_name][2] != axes:
                first, first_dim, first_axes = seen[dim_name]
                raise ValueError(
                    f"{op}: {_of(name)} dim {dim} is sharded over {_show(axes)} but {_of(first)} "
                    f"dim {first_dim}, the same dim of the product, over {_show(first_axes)}: "
                    f"shard them alike")
            seen.setdefault(dim_name, (name, dim, axes))
            if axes and roles[dim_name] in _REFUSED:
                raise ValueError(f"{op}: {_of(name)} dim {dim} is sharded over {_show(axes)}, "
                                 f"but it {_REFUSED[roles[dim_name]]}")
            for axis in axes:
                other = owner.setdefault(axis, (dim_name, name, dim))
                if other[0] != dim_name:
                    raise ValueError(
                        f"{op}: mesh axis {axis!r} shards both {_of(other[1])} dim {other[2]} "
                        f"and {_of(name)} dim {dim}, whose blocks would not meet on a device: "
                        f"shard each mesh axis along one dim of the product")
    return {dim_name: axes for dim_name, (_, _, axes) in seen.items()}


def _of(name: str) -> str:
    return f"{name}'" if name.endswith("_sizes") else f"{name}'s"  # group_sizes' dim, lhs's dim


def _show(axes: tuple[str, ...]) -> str:
    return "no mesh axis" if not axes else ", ".join(repr(a) for a in axes)


def _ragged(sharded: dict[str, tuple[str, ...]], roles: dict[str, str], operand: str,
            dim_names: Sequence[str]) -> tuple[str, int, tuple[str, ...]] | None:
    for dim, dim_name in enumerate(dim_names):
        if roles[dim_name] in (RAGGED, RAGGED_SUM) and sharded.get(dim_name):
            return operand, dim, sharded[dim_name]
    return None


def _out_spec(sharded: dict[str, tuple[str, ...]], roles: dict[str, str],
              dim_names: Sequence[str]) -> Any:
    return as_partition_spec([() if roles[d] == RAGGED_SUM else sharded.get(d, ())
                              for d in dim_names])


def _summed(op: str, arguments: dict[str, Any], sharded, roles,
            refuse: dict[str, str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(overrides, axes) for partial products summed over the devices that split the ragged
    contracting dim; a ValueError for an argument that cannot be applied once per device."""
    axes = tuple(a for d, r in roles.items() if r == RAGGED_SUM for a in sharded.get(d, ()))
    if not axes:
        return {}, ()
    for name, why in refuse.items():
        if arguments.get(name) is not None:
            raise ValueError(f"{op}: {name} cannot be given while the ragged contracting dim is "
                             f"sharded (over {_show(axes)}): {why}")
    wide = kernel_dtype(arguments["lhs"], arguments["rhs"], jnp.float32)
    return {"preferred_element_type": wide}, axes


def _experts(op: str, arguments: dict[str, Any], sharded, dim: int,
             ) -> tuple[tuple[int, tuple[str, ...]] | None, tuple[str, ...]]:
    """(PerDevice.experts, axes to sum over) for rhs's group dim `dim`, named "g"."""
    axes = sharded.get("g", ())
    if not axes:
        return None, ()
    if arguments.get("existing_out") is not None:
        raise ValueError(f"{op}: existing_out cannot be given while rhs's group dim is sharded "
                         f"(over {_show(axes)}): its rows would be added once per device; add "
                         f"it to the result instead")
    return (dim, axes), axes


def _grouped_matmul(arguments: dict[str, Any], axes: frozenset) -> Split:
    del axes
    op = names.GROUPED_MATMUL
    glu = arguments["glu"] is not None
    roles = {"m": RAGGED, "k": CONTRACTING, "g": EXPERTS, "G": GROUP, "n": FREE, "o": FREE}
    rhs_names = ("g", "n", "k") if arguments["transpose_rhs"] else ("g", "k", "n")
    out_names = ("m", "o" if glu else "n")
    operands = [("lhs", arguments["lhs"], ("m", "k")), ("rhs", arguments["rhs"], rhs_names),
                ("group_sizes", arguments["group_sizes"], ("G",)),
                ("bias", arguments["bias"], ("g", "n")),
                ("existing_out", arguments["existing_out"], out_names)]
    sharded = _check(op, operands, roles)
    if glu and sharded.get("n"):
        raise ValueError(f"{op}: rhs's columns are sharded over {_show(sharded['n'])}, but glu "
                         f"pairs gate and up columns across them; reshard rhs's last dim "
                         f"unsharded")
    experts, summed = _experts(op, arguments, sharded, 0)
    per_device = PerDevice(ragged=_ragged(sharded, roles, "lhs", ("m", "k")), experts=experts,
                           summed=summed)
    return Split(arguments, per_device, _out_spec(sharded, roles, out_names))


def _transposed_grouped_matmul(arguments: dict[str, Any], axes: frozenset) -> Split:
    del axes
    op = names.TRANSPOSED_GROUPED_MATMUL
    roles = {"k": FREE, "m": RAGGED_SUM, "n": FREE, "G": GROUP, "A": GROUP}
    out_names = ("A", "k", "n")
    operands = [("lhs", arguments["lhs"], ("k", "m")), ("rhs", arguments["rhs"], ("m", "n")),
                ("group_sizes", arguments["group_sizes"], ("G",)),
                ("existing_out", arguments["existing_out"], out_names)]
    sharded = _check(op, operands, roles)
    overrides, summed = _summed(
        op, arguments, sharded, roles,
        {"existing_out": "it would be added once per device; add it to the result instead"})
    per_device = PerDevice(ragged=_ragged(sharded, roles, "lhs", ("k", "m")), summed=summed,
                           result_dtype=arguments["preferred_element_type"] if summed else None,
                           overrides=tuple(overrides.items()))
    return Split(arguments, per_device, _out_spec(sharded, roles, out_names))


def _ragged_dot_general(op: str, arguments: dict[str, Any], numbers: Any) -> Split:
    lhs, rhs, sizes = arguments["lhs"], arguments["rhs"], arguments["group_sizes"]
    p = plan(tuple(lhs.shape), tuple(rhs.shape), numbers, sizes.shape[-1])
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = numbers.dot_dimension_numbers
    ragged, = numbers.lhs_ragged_dimensions

    def name(operand: str, dim: int, contract: Sequence[int], batch: Sequence[int]) -> str:
        if dim in batch:
            return f"b{list(batch).index(dim)}"
        if dim in contract:
            return f"k{list(contract).index(dim)}"
        if operand == "rhs" and dim in numbers.rhs_group_dimensions:
            return "g"
        return f"{operand}{dim}"

    lhs_names = [name("lhs", d, lhs_contract, lhs_batch) for d in range(len(lhs.shape))]
    rhs_names = [name("rhs", d, rhs_contract, rhs_batch) for d in range(len(rhs.shape))]
    roles = {n: CONTRACTING if n.startswith("k") else EXPERTS if n == "g" else FREE
             for n in lhs_names + rhs_names}
    roles["G"] = GROUP
    roles[lhs_names[ragged]] = RAGGED_SUM if p.mode is Mode.RAGGED_CONTRACTING else RAGGED
    out_names = ([n for n in lhs_names if n.startswith("b")]
                 + [n for d, n in enumerate(lhs_names) if n == f"lhs{d}"]
                 + [n for d, n in enumerate(rhs_names) if n == f"rhs{d}"])
    if p.mode is Mode.RAGGED_CONTRACTING:
        out_names = ["G"] + out_names
    sharded = _check(op, [("lhs", lhs, lhs_names), ("rhs", rhs, rhs_names)], roles)
    # group_sizes' prefix follows lhs's dims, or is replicated and sliced on each device.
    slices = []
    sizes_dims = spec_of(sizes)
    for i, dim in enumerate(p.prefix):
        want = sharded.get(lhs_names[dim], ())
        if sizes_dims[i] != want:
            if sizes_dims[i]:
                raise ValueError(f"{op}: group_sizes' dim {i} is sharded over "
                                 f"{_show(sizes_dims[i])} but lhs's dim {dim}, which it "
                                 f"follows, over {_show(want)}: shard them alike")
            slices.append((i, "lhs", dim, want))
    if sizes_dims[-1]:
        raise ValueError(f"{op}: group_sizes' last dim is sharded over "
                         f"{_show(sizes_dims[-1])}, but it {_REFUSED[GROUP]}")
    overrides, summed = _summed(
        op, arguments, sharded, roles,
        {"activation": "it applies to whole sums; apply it to the result instead"})
    out_sharding = arguments["out_sharding"]
    if out_sharding is not None and not isinstance(out_sharding, (P, NamedSharding)):
        raise TypeError(f"out_sharding must be a jax.sharding.PartitionSpec or NamedSharding "
                        f"(or None), got {type(out_sharding).__name__}")
    overrides["out_sharding"] = None  # honoured after the devices' results are put together
    experts, expert_axes = (None, ()) if p.rhs_group_axis is None else _experts(
        op, arguments, sharded, p.rhs_group_axis)
    per_device = PerDevice(tuple(slices), _ragged(sharded, roles, "lhs", lhs_names), experts,
                           summed + expert_axes,
                           arguments["preferred_element_type"] if summed else None,
                           tuple(overrides.items()))
    return Split(arguments, per_device, _out_spec(sharded, roles, out_names), out_sharding)


explicit_sharding.declare(names.GROUPED_MATMUL, _grouped_matmul)
explicit_sharding.declare(names.TRANSPOSED_GROUPED_MATMUL, _transposed_grouped_matmul)
explicit_sharding.declare(ragged_contract.NAME, lambda arguments, axes: _ragged_dot_general(
    ragged_contract.NAME, arguments, arguments["ragged_dot_dimension_numbers"]))
explicit_sharding.declare(ragged_contract.SIMPLE_NAME, lambda arguments, axes: _ragged_dot_general(
    ragged_contract.SIMPLE_NAME, arguments, ragged_contract.BASIC_DIMENSION_NUMBERS))
