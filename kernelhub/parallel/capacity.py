"""Sizing the exchange buffers of the routed layout, and reporting rows that did not fit.

Each pair of devices exchanges at most `capacity` rows per step. A capacity that can never
overflow costs memory and (over all_to_all) bandwidth in proportion to the worst case; a
smaller one bets on balanced routing and counts the rows it had to drop; `raise_on_overflow`
turns a count into an error.
"""

from __future__ import annotations

import math

import numpy as np
from jaxtyping import Array, Int


class TokenOverflowError(RuntimeError):
    """Rows were dropped because a device sent another more rows than the capacity."""


def safe_capacity(tokens_per_device: int, top_k: int, experts_per_device: int) -> int:
    """A capacity that no routing can overflow.

    A token's top_k experts are distinct, so at most min(top_k, experts_per_device) of its rows
    go to one device: no device sends another more than tokens_per_device times that.
    """
    for name, value in (("tokens_per_device", tokens_per_device), ("top_k", top_k),
                        ("experts_per_device", experts_per_device)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return tokens_per_device * min(top_k, experts_per_device)


def balanced_capacity(tokens_per_device: int, top_k: int, num_devices: int,
                      experts_per_device: int, capacity_factor: float = 1.25,
                      multiple: int = 8) -> int:
    """capacity_factor times the rows a device sends each device when routing is uniform.

    Rounded up to `multiple` (tile-friendly buffers) and never above `safe_capacity`.
    """
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices must be a positive int, got {num_devices!r}")
    ceiling = safe_capacity(tokens_per_device, top_k, experts_per_device)
    uniform = tokens_per_device * top_k / num_devices
    rounded = multiple * math.ceil(capacity_factor * uniform / multiple)
    return max(1, min(rounded, ceiling))


def raise_on_overflow(dropped: Int[Array, ""] | int) -> None:
    """The opt-in overflow check: raises TokenOverflowError when a layout's `dropped` is not 0.

    Call it on the count a (jitted) step returns; it reads one int from the device. The check is
    on the host on purpose: raising from a callback inside the step would stop one device in
    the middle of the program while the others wait for it at their next collective (on 8
    simulated CPU devices the process hangs, then aborts).
    """
    count = int(np.asarray(dropped))
    if count:
        raise TokenOverflowError(
            f"{count} token rows did not fit the exchange capacity and were dropped; raise the "
            f"capacity (kernelhub.parallel.safe_capacity never overflows)"
        )
