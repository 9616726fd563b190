"""The order in which timed functions take their turns.

Timing several functions in turns makes a drifting machine hit them alike; it does not make
their places in a turn alike. On an H100 (benchmarks/gpu/2026-11-28-h100/) the same executable
ran 19-21% slower at Qwen3-MoE (kernels of about 0.2 ms), 1-5% at the larger shapes, when it
was timed second in each turn, right after the slow reference, than when it was timed third.
Its place or what ran before it: one run cannot tell. So each turn starts one place further
on (over as many turns as there are functions each is timed once in each place, and a median
over the turns drops what one place costs), and the timers make an untimed call of a
function right before each of its samples, so that no sample follows another function's
(`seconds_per_call`, the sample both timers take).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax

Item = TypeVar("Item")


def rotated(items: Sequence[Item], turn: int) -> list[Item]:
    """`items` in the order of turn number `turn` (0, 1, ...): turn 0 as given, each later turn
    starting one item further on and wrapping round."""
    if not items:
        return []
    start = turn % len(items)
    return [*items[start:], *items[:start]]


def seconds_per_call(calls: Sequence[Callable[[], Any]], repeat: int = 1) -> float:
    """One timed sample: after an untimed call of the first of `calls` (waited for), each of
    them made `repeat` times back to back, waited for once at the end, in seconds per call.
    Waited for once, the calls measure the device's time per call: a call waited for alone
    also times its round trip from the host (0.1-0.3 ms on an H100, 1.5-2x a fine-grained
    MoE kernel)."""
    jax.block_until_ready(calls[0]())  # untimed: what ran before is behind it
    start = time.perf_counter()
    result = None
    for call in calls:
        for _ in range(repeat):
            result = call()
    jax.block_until_ready(result)
    return (time.perf_counter() - start) / (len(calls) * repeat)
