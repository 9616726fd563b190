"""Expert parallelism with replicated tokens: every device sees every token, holds some experts.

    device p:  all T tokens -> route -> rows of experts [p*E/D, (p+1)*E/D) only (group_offset)
               -> combine (0 for the other experts) -> partial [T, d]
    all:       psum(partials) -> [T, d] on every device, or psum_scatter -> [T/D, d] each

No token moves; the cost is one reduction of [T, d] per call. See docs/parallel.md.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, Float, Int

from kernelhub.parallel import _placement, routing
from kernelhub.parallel.experts import ExpertFn, count_experts

Reduction = Literal["psum", "scatter"]


def replicated_tokens_on_device(
    expert_fn: ExpertFn,
    tokens: Float[Array, "tokens d"],
    expert_ids: Int[Array, "tokens top_k"],
    combine_weights: Float[Array, "tokens top_k"],
    local_params: Any,
    *,
    num_experts: int,
    axis_name: str,
) -> Float[Array, "tokens d_out"]:
    """This device's share of the MoE block, before the reduction over `axis_name`.

    For use inside jax.shard_map; `replicated_tokens` wraps it. local_params hold this device's
    experts, the axis_index-th block of num_experts / axis size.
    """
    local_experts = count_experts(local_params)
    route = routing.route(expert_ids, num_experts)
    rows = routing.gather_rows(tokens, route)
    first_expert = (jax.lax.axis_index(axis_name) * local_experts).astype(jnp.int32)
    answers = expert_fn(rows, route.group_sizes, local_params, first_expert)
    return routing.combine_rows(answers, route, combine_weights, tokens.dtype)


def replicated_tokens(
    expert_fn: ExpertFn,
    tokens: Float[Array, "tokens d"],
    expert_ids: Int[Array, "tokens top_k"],
    combine_weights: Float[Array, "tokens top_k"],
    params: Any,
    *,
    mesh: Mesh,
    axis_name: str,
    reduce: Reduction = "psum",
) -> Float[Array, "tokens d_out"]:
    """The MoE block with experts sharded over `axis_name` and tokens replicated along it.

    Args:
      expert_fn: the experts' computation (see ExpertFn); it must give 0 on rows of experts it
        does not hold.
      tokens, expert_ids, combine_weights: the router's output for all tokens; expert_ids in
        [0, num_experts).
      params: pytree of expert weights, each leaf [num_experts, ...]; sharded along axis_name
        on its leading axis (num_experts divisible by the axis size).
      mesh, axis_name: where the experts live. Other mesh axes see the same computation.
      reduce: "psum" returns [tokens, d_out] replicated; "scatter" (a reduce-scatter, half the
        traffic) returns it sharded by tokens along axis_name (tokens divisible by axis size).

    Returns:
      sum over k of combine_weights[t, k] * expert_{expert_ids[t, k]}(tokens[t]), as
      `apply_experts` on one device computes it; differentiable in tokens, combine_weights
      and params.
    """
    devices = _placement.axis_size(mesh, axis_name)
    num_experts = count_experts(params)
    _placement.require_divisible("num_experts", num_experts, devices, axis_name)
    if reduce not in ("psum", "scatter"):
        raise ValueError(f"reduce must be 'psum' or 'scatter', got {reduce!r}")
    if reduce == "scatter":
        _placement.require_divisible("tokens", tokens.shape[0], devices, axis_name)

    def on_device(tokens, expert_ids, combine_weights, local_params):
        partial = replicated_tokens_on_device(
            expert_fn, tokens, expert_ids, combine_weights, local_params,
            num_experts=num_experts, axis_name=axis_name)
        if reduce == "psum":
            return jax.lax.psum(partial, axis_name)
        return jax.lax.psum_scatter(partial, axis_name, scatter_dimension=0, tiled=True)

    replicated, by_expert = PartitionSpec(), PartitionSpec(axis_name)
    inputs = (*_placement.place((tokens, expert_ids, combine_weights), mesh, replicated),
              _placement.place(params, mesh, by_expert))
    return jax.shard_map(
        on_device, mesh=mesh,
        in_specs=(replicated, replicated, replicated, by_expert),
        out_specs=replicated if reduce == "psum" else by_expert,
    )(*inputs)
