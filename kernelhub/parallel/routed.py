"""Expert parallelism with routed tokens: tokens and experts both sharded along one mesh axis.

    device p:  its T/D tokens -> route -> rows sorted by expert, i.e. by owning device
    exchange:  the run for device q goes to q            (token_exchange, capacity rows a pair)
    device q:  rows from all sources -> expert order -> its E/D experts (no group_offset)
    exchange:  the answers go back to their sources      (token_exchange again)
    device p:  combine -> [T/D, d]

Each row crosses the mesh twice; nothing is replicated. See docs/parallel.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, Float, Int

from kernelhub import _loader
from kernelhub._core.dispatch import within_platform
from kernelhub._core.registry import Platform
from kernelhub.ops.token_exchange import NAME as TOKEN_EXCHANGE
from kernelhub.parallel import _placement, _slots, routing
from kernelhub.parallel.experts import ExpertFn, count_experts


def default_exchange() -> Callable[..., Any]:
    """token_exchange as the dispatcher picks it for each platform (ragged on TPU/GPU).

    Chosen among the xla implementations, the only ones collectives are written in, so that a
    KERNELHUB_PLATFORM chosen for the matmul kernels does not make the exchange unavailable.
    """
    _loader.load()
    return within_platform(TOKEN_EXCHANGE, Platform.XLA)


def routed_tokens_on_device(
    expert_fn: ExpertFn,
    tokens: Float[Array, "tokens d"],
    expert_ids: Int[Array, "tokens top_k"],
    combine_weights: Float[Array, "tokens top_k"],
    local_params: Any,
    *,
    num_experts: int,
    axis_name: str,
    capacity: int,
    exchange: Callable[..., Any] | None = None,
) -> tuple[Float[Array, "tokens d_out"], Int[Array, ""]]:
    """This device's tokens through the experts of all devices on `axis_name`.

    For use inside jax.shard_map; `routed_tokens` wraps it. Returns (answers for this
    device's tokens, rows this device could not send).
    """
    exchange = exchange or default_exchange()
    devices = jax.lax.axis_size(axis_name)
    local_experts = num_experts // devices
    route = routing.route(expert_ids, num_experts)
    rows = routing.gather_rows(tokens, route)
    # Rows are sorted by expert, so each device's experts' rows form one run.
    rows_per_expert = route.group_sizes.reshape(devices, local_experts)
    send_sizes = jnp.sum(rows_per_expert, axis=1)
    sent = exchange(rows, send_sizes, capacity, axis_name)

    # How many rows each source meant for each of this device's experts; expert_order cuts
    # them at the capacity the way the exchange cut the runs.
    counts = jax.lax.all_to_all(rows_per_expert, axis_name, 0, 0, tiled=True)
    order = _slots.expert_order(counts, capacity)
    received = sent.received.reshape(devices * capacity, -1)
    answers = expert_fn(received[order.slot_of_row], order.group_sizes, local_params,
                        jnp.zeros((), jnp.int32))

    slot_starts = jnp.arange(devices, dtype=jnp.int32) * capacity
    returned = exchange(answers[order.row_of_slot], sent.received_sizes, capacity, axis_name,
                        slot_starts)
    answer_rows = _slots.rows_from_returned(returned.received, send_sizes, rows.shape[0])
    out = routing.combine_rows(answer_rows, route, combine_weights, tokens.dtype)
    return out, sent.dropped


def routed_tokens(
    expert_fn: ExpertFn,
    tokens: Float[Array, "tokens d"],
    expert_ids: Int[Array, "tokens top_k"],
    combine_weights: Float[Array, "tokens top_k"],
    params: Any,
    *,
    mesh: Mesh,
    axis_name: str,
    capacity: int,
    exchange: Callable[..., Any] | None = None,
) -> tuple[Float[Array, "tokens d_out"], Int[Array, ""]]:
    """The MoE block with tokens and experts both sharded along `axis_name`.

    Args:
      expert_fn: the experts' computation (see ExpertFn), called with group_offset 0 on the
        rows each device receives.
      tokens, expert_ids, combine_weights: the router's output, sharded by tokens along
        axis_name (tokens divisible by the axis size); expert_ids in [0, num_experts).
      params: pytree of expert weights, each leaf [num_experts, ...], sharded along axis_name
        on its leading axis (num_experts divisible by the axis size).
      mesh, axis_name: where tokens and experts live. Other mesh axes see the same computation.
      capacity: the most rows one device sends another (static). `safe_capacity` never drops;
        `balanced_capacity` bets on even routing.
      exchange: a token_exchange implementation; the dispatcher's choice for the backend when
        None (`kernelhub.get("token_exchange", backend="tpu")` to lower for TPU elsewhere).

    Returns:
      (out, dropped). out: as `apply_experts` computes it on one device, sharded like tokens,
      except that a choice dropped for lack of capacity contributes 0; differentiable in tokens,
      combine_weights and params. dropped: int32 scalar, the choices dropped over all devices;
      pass it to `raise_on_overflow` to make a drop an error.
    """
    devices = _placement.axis_size(mesh, axis_name)
    num_experts = count_experts(params)
    _placement.require_divisible("num_experts", num_experts, devices, axis_name)
    _placement.require_divisible("tokens", tokens.shape[0], devices, axis_name)
    exchange = exchange or default_exchange()

    def on_device(tokens, expert_ids, combine_weights, local_params):
        out, dropped = routed_tokens_on_device(
            expert_fn, tokens, expert_ids, combine_weights, local_params,
            num_experts=num_experts, axis_name=axis_name, capacity=capacity, exchange=exchange)
        return out, jax.lax.psum(dropped, axis_name)

    sharded = PartitionSpec(axis_name)
    inputs = _placement.place((tokens, expert_ids, combine_weights, params), mesh, sharded)
    return jax.shard_map(
        on_device, mesh=mesh, in_specs=(sharded,) * 4, out_specs=(sharded, PartitionSpec()),
    )(*inputs)
