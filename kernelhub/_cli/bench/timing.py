"""How every `kernelhub bench` benchmark times its functions: in turns, so that load from other
processes, clock changes and drift hit all of the compared functions alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from kernelhub._core.turns import rotated, seconds_per_call

# Stop repeating a measurement once it has two samples and this many seconds (slow peers).
_SECONDS_PER_MEASUREMENT = 3.0


def interleaved_samples(fns: Sequence[Callable[[], jax.Array]], reps: int) -> list[list[float]]:
    """Seconds of each function over `reps` turns, timed in turns so that load from other
    processes hits all of them alike and the ratios between them stay fair; each turn starts
    one function further on (turns.py). The CPU benchmarks' way: on a GPU, median_seconds
    also keeps a sample from following another function's."""
    for fn in fns:
        jax.block_until_ready(fn())  # compile and warm up
    times: list[list[float]] = [[] for _ in fns]
    for turn in range(reps):
        for fn, record in rotated(list(zip(fns, times)), turn):
            start = time.perf_counter()
            jax.block_until_ready(fn())
            record.append(time.perf_counter() - start)
    return times


def best_medians(draw: Callable[[], Sequence[Callable[[], jax.Array]]], reps: int,
                 draws: int) -> list[float]:
    """Each function's median over `reps` turns in its best of `draws` rounds; `draw` gives the
    functions of a round (on fresh inputs, say).

    One executable can run in a fast or a slow state for whole runs at a time (docs/xla.md), so
    each function keeps its best round and none is compared in its slow state against another's
    fast one.
    """
    rounds = [[statistics.median(turns) for turns in interleaved_samples(draw(), reps)]
              for _ in range(draws)]
    return [min(times) for times in zip(*rounds)]


def median_seconds(fns: dict[str, Callable[[], Any]], reps: int, warmup: int,
                   calls_per_sample: int = 1) -> dict[str, float | None]:
    """Median wall time of each thunk, timed in turns (so drift hits all alike), each turn
    starting one thunk further on, and each sample after an untimed call of its own thunk: on
    a GPU the same executable ran up to 20% slower right after a slow peer (turns.py), so no
    thunk's sample follows another's. A thunk that fails (out of memory, say) gets None
    instead of stopping the run.

    With `calls_per_sample` > 1 a sample is that many calls made back to back, waited for once
    at the end, over their number: while one call runs on the device the next is dispatched,
    so a sample measures the device's time per call rather than one call's round trip from
    the host (its dispatch and the wait for its result)."""
    live: dict[str, Callable[[], Any]] = {}
    for name, fn in fns.items():
        try:
            for _ in range(1 + warmup):
                jax.block_until_ready(fn())
            live[name] = fn
        except Exception as error:  # noqa: BLE001 - report and keep measuring the others
            print(f"  {name}: failed ({type(error).__name__}: {str(error)[:200]})")
    samples: dict[str, list[float]] = {name: [] for name in live}
    for turn in range(reps):
        for name, fn in rotated(list(live.items()), turn):
            spent = sum(samples[name]) * calls_per_sample
            if len(samples[name]) >= 2 and spent > _SECONDS_PER_MEASUREMENT:
                continue
            samples[name].append(seconds_per_call([fn], calls_per_sample))
    return {name: statistics.median(samples[name]) if name in live else None for name in fns}
