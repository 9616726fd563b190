"""Which of a target's implementations lowers a call, by measurements.

A target's choice (kernelhub/_core/dispatch.py) is its registered implementation of highest
priority. An op declared with `measured=` (define_op) can say more: how long an implementation
took for calls like this one on this host's device (kernelhub's grouped matmuls read it from
their tuning tables). When a call is lowered for the host's own kind of device, and both the
chosen implementation and another that could serve the call have such a measurement, the
fastest lowers. Where the chosen one has none, it stays: another's time alone does not say
which is faster. Lowering for other hardware (export from a CPU) keeps the registered choice.

The alternates (lowering.Choices.alternates) are the target's other usable, non-interpreting
implementations with the call's features and the same `residuals` name as the choice: a
differentiated call may then lower its forward half with one and its backward half with
another. A forced platform or backend has none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from kernelhub._core import registry


def alternates(chosen: registry.KernelSpec, candidates: Sequence[registry.KernelSpec]
               ) -> tuple[registry.KernelSpec, ...]:
    """Those of `candidates` (one target's, with the call's features) that may lower instead of
    `chosen` when measured faster."""
    if chosen.residuals is None or registry.op_definition(chosen.op).measured is None:
        return ()
    return tuple(spec for spec in candidates
                 if spec is not chosen and not spec.interpret_only
                 and spec.residuals == chosen.residuals and spec.available)


def fastest(op: str, target: str, chosen: registry.KernelSpec,
            others: Sequence[registry.KernelSpec], arguments: dict[str, Any],
            trace: Callable[[registry.KernelSpec], None]) -> registry.KernelSpec:
    """The implementation that lowers the call: `chosen` unless another of `others` was
    measured faster for it. `trace(spec)` traces `spec`'s share of the call."""
    measured = registry.op_definition(op).measured
    if measured is None or not _is_host(target):
        return chosen
    timed = []
    for candidate in (chosen, *others):
        seconds = measured(arguments, functools.partial(trace, candidate))
        if seconds is None:
            if candidate is chosen:
                return chosen
            continue
        timed.append((seconds, candidate))
    # min keeps the first of equals: the registered choice wins a tie.
    return min(timed, key=lambda pair: pair[0])[1]


def _is_host(target: str) -> bool:
    """Whether `target` is the hardware of this host's default device (measurements are)."""
    return registry.backend_of_target(target) is registry.backend_of_target(
        jax.default_backend())
