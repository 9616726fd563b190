"""Calls whose operands' types carry explicit mesh axes: each device runs the kernel on its
blocks.

Under `jax.set_mesh` with `AxisType.Explicit` axes, an array's type says how it is sharded
(jax's "sharding in types"), and every operation must say how its result is sharded. Pallas
kernels cannot take such types: their interpreter and lowering assume one device's arrays
(jax 0.10 fails inside them with a ShardingTypeError; later versions refuse up front). So an op
that declares a sharding rule (`declare`) runs, for such a call, inside `jax.shard_map` over
the explicit axes: every operand keeps its own sharding, each device calls the implementation
on its blocks (the per-device view the rule describes: say, group sizes cut to the device's
rows), and the result's type carries the sharding the rule infers, or `out_sharding` when the
call gives one. shard_map's transpose makes the gradients: a replicated operand's gradient is
summed over the devices. A layout a kernel cannot split is the rule's TypeError or ValueError,
raised before anything is traced. An op without a rule is called as before.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from kernelhub._core import lowering


@dataclasses.dataclass(frozen=True)
class Split:
    """How a rule runs one call on the devices of its mesh.

    `arguments`: the call's arguments; each array enters shard_map with its own sharding (no
    operand is moved). `per_device`: a hashable object whose `arguments(arguments)` gives the
    arguments one device's implementation call takes, from the same arguments holding that
    device's blocks, and `outputs(outputs)` what that device returns (after a psum, say).
    `out_specs`: the PartitionSpecs of what the devices return (a pytree like the outputs).
    `out_sharding`: where the result is resharded to after, or None.
    """

    arguments: dict[str, Any]
    per_device: Any
    out_specs: Any
    out_sharding: Any = None


Rule = Callable[[dict[str, Any], frozenset], Split]

_RULES: dict[str, Rule] = {}


def declare(op: str, rule: Rule) -> None:
    """Makes `rule(arguments, axes)` split the calls of `op` whose operands (or the mesh in
    force) have explicit mesh axes `axes`: `arguments` are what the contract's validation
    returned; the rule returns a Split or raises a TypeError/ValueError naming the argument
    whose layout no kernel can take, and what is expected."""
    _RULES[op] = rule


def explicit_mesh(arrays: Sequence[Any]) -> Any:
    """The mesh whose explicit axes `arrays` (or the mesh set with jax.set_mesh) are typed
    with, or None when there is none (no mesh, or only automatic and manual axes)."""
    meshes = {jax.typeof(a).sharding.mesh for a in arrays}
    meshes.add(jax.sharding.get_abstract_mesh())
    meshes = {m for m in meshes if not m.empty and AxisType.Explicit in m.axis_types}
    if not meshes:
        return None
    if len(meshes) > 1:
        raise ValueError(f"operands are typed with different meshes: {sorted(map(str, meshes))}; "
                         f"reshard them onto one mesh")
    return meshes.pop()


def explicit_axes(mesh: Any) -> frozenset:
    return frozenset(name for name, kind in zip(mesh.axis_names, mesh.axis_types)
                     if kind is AxisType.Explicit)


def has_rule(op: str) -> bool:
    return op in _RULES


def spec_of(array: Any) -> tuple[tuple[str, ...], ...]:
    """Per dimension of `array`, the mesh axes its type shards that dimension over."""
    spec = tuple(jax.typeof(array).sharding.spec)
    spec += (None,) * (jax.numpy.ndim(array) - len(spec))
    return tuple(() if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
                 for entry in spec)


def as_partition_spec(dims: Sequence[tuple[str, ...]]) -> PartitionSpec:
    return PartitionSpec(*(None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
                           for axes in dims))


def call(op: str, choices: lowering.Choices, arguments: dict[str, Any], mesh: Any) -> Any:
    """Runs `op` with `choices` on the devices of `mesh` as its rule splits the call."""
    split = _RULES[op](arguments, explicit_axes(mesh))
    layout, arrays = lowering.split(split.arguments)
    in_specs = tuple(as_partition_spec(spec_of(a)) for a in arrays)
    run = _sharded(op, choices, layout, split.per_device, in_specs, split.out_specs,
                   split.out_sharding, mesh)
    if not any(isinstance(a, jax.core.Tracer) for a in arrays):
        run = _jitted(run)  # shard_map of concrete arrays: compiled once per layout
    return run(*arrays)


@functools.lru_cache(maxsize=256)
def _sharded(op: str, choices: lowering.Choices, layout: lowering.Layout, per_device: Any,
             in_specs: tuple, out_specs: Any, out_sharding: Any,
             mesh: Any) -> Callable[..., Any]:
    def on_device(*blocks: Any) -> Any:
        local = per_device.arguments(layout.arguments(blocks))
        return per_device.outputs(lowering.call(op, choices, local))

    sharded = jax.shard_map(on_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                            axis_names=explicit_axes(mesh))
    if out_sharding is None:
        return sharded
    if isinstance(out_sharding, PartitionSpec):  # on the operands' mesh, as lax takes it
        out_sharding = NamedSharding(mesh, out_sharding)
    return lambda *arrays: jax.sharding.reshard(sharded(*arrays), out_sharding)


@functools.lru_cache(maxsize=256)
def _jitted(fn: Callable[..., Any]) -> Callable[..., Any]:
    return jax.jit(fn)
