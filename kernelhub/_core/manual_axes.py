"""Marking values as varying over shard_map's manual axes, so kernels run with check_vma on.

Inside jax.shard_map (check_vma=True, the default) every value carries the set of mesh axes it
varies over. A loop carry must keep its set, and a custom_vjp's backward must return cotangents
with its inputs' sets. A kernel that starts an accumulator from a constant (invariant) and adds
varying products breaks the first rule; gradients of a replicated lhs against sharded experts
break the second. Casting up front fixes both, and the cast's transpose is the psum that a
replicated input's gradient needs.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from kernelhub._core import jax_internals as _jax_internals


def varying_axes(value: Any) -> frozenset:
    """The manual mesh axes `value` varies over (empty outside shard_map)."""
    return _jax_internals.varying_axes(jax.typeof(value))


def varying_like(value: Any, *sources: Any) -> Any:
    """`value` (an array or a pytree of them, such as a QuantizedArray), marked varying over
    every axis that one of the arrays in `sources` (pytrees; None skipped) varies over."""
    wanted = frozenset().union(*(varying_axes(s) for s in jax.tree.leaves(sources)))

    def cast(leaf: jax.Array) -> jax.Array:
        missing = wanted - varying_axes(leaf)
        if not missing:
            return leaf
        return jax.lax.pcast(leaf, tuple(sorted(missing)), to="varying")

    return jax.tree.map(cast, value)


def unify_varying(*values: Any) -> tuple[Any, ...]:
    """`values` (None kept), each marked varying over the union of their axes."""
    return tuple(None if v is None else varying_like(v, *values) for v in values)


def shape_dtype_like(shape: tuple[int, ...], dtype: Any, like: jax.Array) -> jax.ShapeDtypeStruct:
    """A pallas_call out_shape that varies over the manual axes `like` varies over.

    Inside shard_map with check_vma, pallas_call wants its outputs' axes spelled out.
    """
    aval = jax.typeof(like)
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=manual)
    return jax.ShapeDtypeStruct(shape, dtype, vma=varying_axes(like))


def concurrent_devices(value: Any) -> int:
    """How many devices run the computation `value` is traced in at once: all of its mesh's
    under shard_map (the body runs on each), else 1."""
    mesh = getattr(jax.typeof(value).sharding, "mesh", None)
    if mesh is None or not getattr(mesh, "manual_axes", ()):
        return 1
    return math.prod(mesh.axis_sizes)
