"""How many rows of each run travel: shared by every token_exchange implementation.

Contract: kernelhub/ops/token_exchange.py. A run is cut to `capacity` rows (the cut rows are
counted as dropped) and clamped into [0, rows) so that sizes which break the contract under jit
still never address memory outside `rows`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Int


def sendable_runs(
    send_sizes: Int[Array, "devices"], send_offsets: Int[Array, "devices"], capacity: int, rows: int
) -> tuple[Int[Array, "devices"], Int[Array, "devices"], Int[Array, ""]]:
    """(offsets, sizes, dropped): the runs as they travel, and the rows cut by the capacity."""
    requested = jnp.maximum(send_sizes, 0)
    offsets = jnp.clip(send_offsets, 0, rows)
    sizes = jnp.minimum(jnp.minimum(requested, capacity), rows - offsets)
    dropped = jnp.sum(requested - jnp.minimum(requested, capacity)).astype(jnp.int32)
    return offsets, sizes.astype(jnp.int32), dropped
