"""`kernelhub list`: every registered implementation and whether it can run here."""

from __future__ import annotations

import argparse

from rich.table import Table

import kernelhub
from kernelhub._cli import _tables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", help="only this op")


def run(args: argparse.Namespace) -> int:
    from kernelhub._core import dispatch as _dispatch
    from kernelhub._core import registry as _registry  # noqa: PLC0415

    table = Table(title="kernelhub implementations",
                  caption="lowered for: the targets (places jax lowers for) whose lowering of an "
                          "unforced call uses it (what an exported function holds; "
                          "kernelhub.resolve(op, backend=...))")
    for column in ("op", "platform", "backend", "priority", "available here", "default here",
                   "lowered for"):
        table.add_column(column)
    for op in [args.op] if args.op else kernelhub.op_names():
        try:
            chosen = kernelhub.resolve(op)
        except kernelhub.NoImplementationError:
            chosen = None
        per_target = _dispatch.per_target(_registry.op_definition(op).name, _registry.version())
        for spec in kernelhub.implementations(op):
            reason = spec.unavailable_reason()
            note = "yes" if reason is None else f"no: {reason}"
            if spec.interpret_only and reason is None:
                note = "yes, when forced (interpret mode)"
            default = "<-" if chosen == spec else ""
            lowered = ", ".join(target for target, choice in per_target.entries
                                if choice == spec)
            table.add_row(op, spec.platform.value, spec.backend.value, str(spec.priority), note,
                          default, lowered)
    console = _tables.console()
    console.print(table)
    return 0
