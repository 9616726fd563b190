"""token_exchange over fixed-capacity buffers with jax.lax.all_to_all, for any backend.

Contract: kernelhub/ops/token_exchange.py. Each device packs its runs into a [devices, capacity]
buffer and one all_to_all swaps the buffers' blocks. It moves devices * capacity rows per device
whatever the runs' lengths (the ragged version moves only the rows), but every XLA backend
implements it, XLA:CPU included.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernelhub._collectives._runs import sendable_runs
from kernelhub.ops.token_exchange import ExchangedRows


def all_to_all_exchange(rows, send_sizes, capacity, axis_name, send_offsets=None) -> ExchangedRows:
    devices = send_sizes.shape[0]
    offsets, sizes, dropped = sendable_runs(send_sizes, send_offsets, capacity, rows.shape[0])
    position = jnp.arange(capacity, dtype=jnp.int32)
    source_row = jnp.clip(offsets[:, None] + position, 0, max(rows.shape[0] - 1, 0))
    in_run = position < sizes[:, None]
    if rows.shape[0] == 0:
        packed = jnp.zeros((devices, capacity, rows.shape[1]), rows.dtype)
    else:
        # A select, not a 0/1 product: a NaN in a row that is not sent must not travel.
        packed = jnp.where(in_run[..., None], rows[source_row], jnp.zeros((), rows.dtype))
    received = jax.lax.all_to_all(packed, axis_name, 0, 0, tiled=True)
    received_sizes = jax.lax.all_to_all(sizes, axis_name, 0, 0, tiled=True)
    return ExchangedRows(received, received_sizes, dropped)
