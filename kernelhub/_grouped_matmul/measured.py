"""How long an implementation's grouped matmuls took for a call: the ops' `measured`
(kernelhub.define_op), from the tuning tables.

A table entry (kernelhub/_grouped_matmul/tables.py) holds, beside a tiling, the time that
tiling took for its key on its device kind, and the key names the implementation. So the time
of one implementation's share of a call (its forward, or both gradients) is the sum of the
entries of the kernel calls that share makes, each as the call would run: under the table in
force when the call was made, else the table shipped for this device. A call with a kernel
lacking an entry has no measured time, nor has a call with an explicit tiling (a tiling is one
backend's: another backend's time says nothing of it), one made while a table is recorded
or the heuristic is forced, or one whose backend does work for its fused epilogue that the
tables, tuned without epilogues, never timed (TuningSpace.times_epilogue).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernelhub._grouped_matmul import active_table, tables
from kernelhub._grouped_matmul.tilings import PASSES, Tilings


def measured_seconds(arguments: dict[str, Any], trace: Callable[[], Any]) -> float | None:
    tilings = arguments.get("tiling")
    if isinstance(tilings, Tilings):
        if any(tilings.for_pass(name) is not None for name in PASSES):
            return None
        table = tilings.tuning
    else:
        table = tables.active()
    if table is not None and not isinstance(table, tables.Tuning):
        return None
    observer = tables.Observer(table)
    with active_table.activated(observer):
        trace()
    if not observer.calls:
        return None
    total_ms = 0.0
    for call in observer.calls:
        entry = tables.measured_entry(table, call) if call.timed_by_tables else None
        if entry is None:
            return None
        total_ms += entry.tuned_ms
    return total_ms / 1e3
