"""token_exchange with jax.lax.ragged_all_to_all, for TPU and GPU.

Contract: kernelhub/ops/token_exchange.py. Only the rows of each run travel, straight into the
receiver's [devices, capacity] buffer at the slot of their sender. XLA:CPU does not implement the
ragged all-to-all, so this runs only where XLA does; on a CPU host it can still be lowered for
TPU or CUDA (tests/multidevice exports it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernelhub._collectives._runs import sendable_runs
from kernelhub.ops.token_exchange import ExchangedRows


def ragged_exchange(rows, send_sizes, capacity, axis_name, send_offsets=None) -> ExchangedRows:
    devices = send_sizes.shape[0]
    offsets, sizes, dropped = sendable_runs(send_sizes, send_offsets, capacity, rows.shape[0])
    # The buffer differs per device once filled; say so up front, as shard_map's checks require.
    empty = jax.lax.pcast(jnp.zeros((devices * capacity, rows.shape[1]), rows.dtype), axis_name,
                          to="varying")
    received_sizes = jax.lax.all_to_all(sizes, axis_name, 0, 0, tiled=True)
    # Every receiver keeps the slot of this sender: rows [me * capacity, (me + 1) * capacity).
    slot_here = jnp.full((devices,), jax.lax.axis_index(axis_name) * capacity, jnp.int32)
    received = jax.lax.ragged_all_to_all(rows, empty, offsets, sizes, slot_here, received_sizes,
                                         axis_name=axis_name)
    received = received.reshape(devices, capacity, rows.shape[1])
    return ExchangedRows(received, received_sizes, dropped)
