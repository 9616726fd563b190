"""Sorting token choices by expert and combining the experts' answers: the local half of MoE.

A router gives each token `top_k` experts and as many combine weights. The experts need their
rows together, so the T * top_k choices are sorted by expert into rows for grouped_matmul; the
combine step sends each answer back to its token, weighted, and sums the token's top_k answers.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


class Routing(NamedTuple):
    """Where each expert-sorted row comes from.

    token_of_row[r] is the token row r copies, choice_of_row[r] its position in the flattened
    [tokens, top_k] choices, group_sizes[e] the number of rows of expert e (rows are sorted by
    expert, so expert e owns rows [sum(group_sizes[:e]), sum(group_sizes[:e + 1]))).
    """

    token_of_row: Int[Array, "rows"]
    choice_of_row: Int[Array, "rows"]
    group_sizes: Int[Array, "experts"]


def route(expert_ids: Int[Array, "tokens top_k"], num_experts: int) -> Routing:
    """Sorts the tokens' choices by expert (stably: a token's rows keep the token order)."""
    top_k = expert_ids.shape[1]
    flat = expert_ids.reshape(-1).astype(jnp.int32)
    choice_of_row = jnp.argsort(flat, stable=True).astype(jnp.int32)
    group_sizes = jnp.zeros((num_experts,), jnp.int32).at[flat].add(1, mode="drop")
    return Routing(choice_of_row // top_k, choice_of_row, group_sizes)


def gather_rows(tokens: Float[Array, "tokens d"], routing: Routing) -> Float[Array, "rows d"]:
    """The expert-sorted rows: one copy of its token per choice."""
    return tokens[routing.token_of_row]


def combine_rows(
    expert_rows: Float[Array, "rows d_out"],
    routing: Routing,
    combine_weights: Float[Array, "tokens top_k"],
    out_dtype: jnp.dtype | None = None,
) -> Float[Array, "tokens d_out"]:
    """Each token's top_k expert answers, weighted by combine_weights and summed in float32."""
    tokens = combine_weights.shape[0]
    weight_of_row = combine_weights.reshape(-1)[routing.choice_of_row].astype(jnp.float32)
    weighted = expert_rows.astype(jnp.float32) * weight_of_row[:, None]
    summed = jax.ops.segment_sum(weighted, routing.token_of_row, num_segments=tokens)
    return summed.astype(out_dtype or expert_rows.dtype)
