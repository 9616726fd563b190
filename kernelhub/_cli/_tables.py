"""The benchmarks' tables: one on the terminal (rich), the same as markdown for benchmarks/."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table


WIDTH = 100  # what the tables are made to fit


def console() -> Console:
    out = Console()
    # Piped output: rich would assume 80 columns; a COLUMNS the user set still decides.
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = WIDTH
    return out


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    shown = Table(title=title)
    for column in columns:
        # A value too wide for its column breaks onto the next line rather than being cut:
        # a tiling or a shape with its end replaced by "…" would be a different one.
        shown.add_column(column, overflow="fold")
    for row in rows:
        shown.add_row(*row)
    return shown


def markdown(header: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write(path: Path | str, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def run_header(option: str, details: str) -> str:
    """A report's first line: the command, the date, jax's version and backend, then `details`."""
    import datetime

    import jax

    return (f"kernelhub bench --{option}, {datetime.date.today()}, jax {jax.__version__}, "
            f"{jax.default_backend()}, {details}")


def report(console: Console, header: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
           out: Path | str | None, notes: str = "") -> None:
    """Prints the table (and `notes` under it); with `out`, writes it as markdown there too."""
    console.print(table(header, columns, rows))
    if notes:
        console.print(notes)
    if out:
        write(out, markdown(f"{header}\n\n{notes}" if notes else header, columns, rows))
        console.print(f"wrote {out}")
