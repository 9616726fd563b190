"""The order in which timed functions take their turns.

Timing several functions in turns makes a drifting machine hit them alike; it does not make
their places in a turn alike. On an H100 (benchmarks/gpu/2026-11-28-h100/) the same executable
ran 19-21% slower at Qwen3-MoE (kernels of about 0.2 ms), 1-5% at the larger shapes, when it
was timed second in each turn, right after the slow reference, than when it was timed third.
Its place or what ran before it: one run cannot tell. So each turn starts one place further
on (over as many turns as there are functions each is timed once in each place, and a median
over the turns drops what one place costs), and the timers make an untimed call of a
function right before each of its samples, so that no sample follows another function's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Item = TypeVar("Item")


def rotated(items: Sequence[Item], turn: int) -> list[Item]:
    """`items` in the order of turn number `turn` (0, 1, ...): turn 0 as given, each later turn
    starting one item further on and wrapping round."""
    if not items:
        return []
    start = turn % len(items)
    return [*items[start:], *items[:start]]
