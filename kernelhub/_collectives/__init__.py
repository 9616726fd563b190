"""Collectives of expert parallelism, one file per implementation; importing registers them."""

from __future__ import annotations

from kernelhub._collectives.all_to_all import all_to_all_exchange
from kernelhub._collectives.ragged import ragged_exchange
from kernelhub._core.registry import needs_device, register
from kernelhub.ops.token_exchange import NAME as TOKEN_EXCHANGE

register(TOKEN_EXCHANGE, "xla", "any")(all_to_all_exchange)
# A backend's own implementation beats the portable one at equal priority.
register(TOKEN_EXCHANGE, "xla", "tpu", requirement=needs_device("tpu"))(ragged_exchange)
register(TOKEN_EXCHANGE, "xla", "gpu", requirement=needs_device("gpu"))(ragged_exchange)
