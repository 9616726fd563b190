"""Checking a caller's mesh and putting the layouts' inputs where shard_map expects them."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def axis_size(mesh: Any, axis_name: Any) -> int:
    """The number of devices along `axis_name`, or an error naming what is wrong."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(axis_name, str) or axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name={axis_name!r} must name an axis of the mesh, which has "
                         f"{tuple(mesh.axis_names)}")
    return mesh.shape[axis_name]


def require_divisible(name: str, count: int, devices: int, axis_name: str) -> None:
    if count % devices:
        raise ValueError(f"{name}={count} must be divisible by the {devices} devices of mesh "
                         f"axis {axis_name!r}")


def place(tree: Any, mesh: Mesh, spec: PartitionSpec) -> Any:
    """Every leaf of `tree` laid out as `spec` on `mesh`.

    shard_map insists on inputs that already match its in_specs when the mesh axes are
    Explicit (jax.make_mesh's default); device_put reshards on both Explicit and Auto meshes,
    eagerly and under jit, and is differentiable.
    """
    sharding = NamedSharding(mesh, spec)
    return jax.tree.map(lambda leaf: jax.device_put(leaf, sharding), tree)
