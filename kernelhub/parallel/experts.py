"""The computation every layout distributes: experts applied to expert-sorted rows.

An `ExpertFn` is the per-device piece (typically grouped matmuls and an activation); the
layouts decide which rows and which experts each device holds. `apply_experts` is the same
computation on one device, the reference every layout must reproduce.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from kernelhub.parallel import routing

PyTree = Any


class ExpertFn(Protocol):
    """Applies the experts `group_offset ..` held in `params` to rows sorted by expert.

    rows: [r, d], sorted by group; group_sizes: [G] rows per group (their sum may be < r: the
    rows past it belong to no group); params: a pytree whose leaves have a leading axis of
    local experts, leaf[j] belonging to group group_offset + j; group_offset: int32 scalar.

    Returns [r, d_out] whose rows of other groups and past sum(group_sizes) are exactly 0, as
    grouped_matmul's are: the replicated layout sums the devices' outputs.
    """

    def __call__(self, rows: Float[Array, "r d"], group_sizes: Int[Array, "G"], params: PyTree,
                 group_offset: Int[Array, ""]) -> Float[Array, "r d_out"]: ...


def apply_experts(
    expert_fn: ExpertFn,
    tokens: Float[Array, "tokens d"],
    expert_ids: Int[Array, "tokens top_k"],
    combine_weights: Float[Array, "tokens top_k"],
    params: PyTree,
) -> Float[Array, "tokens d_out"]:
    """The MoE block on one device: route, apply every expert in `params`, combine."""
    route = routing.route(expert_ids, count_experts(params))
    rows = routing.gather_rows(tokens, route)
    expert_rows = expert_fn(rows, route.group_sizes, params, jnp.zeros((), jnp.int32))
    return routing.combine_rows(expert_rows, route, combine_weights, tokens.dtype)


def count_experts(params: PyTree) -> int:
    """The number of experts in `params`: the leading axis every leaf shares."""
    leaves = jax.tree.leaves(params)
    if not leaves:
        raise ValueError("params must hold at least one array with a leading expert axis")
    counts = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else None for leaf in leaves}
    if len(counts) != 1 or None in counts:
        raise ValueError(
            f"every leaf of params must have the same leading (expert) axis, got leading sizes "
            f"{sorted(str(c) for c in counts)}"
        )
    return counts.pop()
