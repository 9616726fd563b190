"""`kernelhub list`: every registered implementation and whether it can run here."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

import kernelhub


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", help="only this op")


def run(args: argparse.Namespace) -> int:
    table = Table(title="kernelhub implementations")
    for column in ("op", "platform", "backend", "priority", "available here", "default here"):
        table.add_column(column)
    chosen = {}
    for op in kernelhub.op_names():
        try:
            chosen[op] = kernelhub.resolve(op)
        except kernelhub.NoImplementationError:
            chosen[op] = None
    for op in [args.op] if args.op else kernelhub.op_names():
        for spec in kernelhub.implementations(op):
            reason = spec.unavailable_reason()
            note = "yes" if reason is None else f"no: {reason}"
            if spec.interpret_only and reason is None:
                note = "yes, when forced (interpret mode)"
            default = "<-" if chosen.get(op) == spec else ""
            table.add_row(op, spec.platform.value, spec.backend.value, str(spec.priority), note, default)
    console = Console()
    if not console.is_terminal:  # piped output: do not squeeze the table into 80 columns
        console.width = 160
    console.print(table)
    return 0
