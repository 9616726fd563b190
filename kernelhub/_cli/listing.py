"""`kernelhub list`: every registered implementation and whether it can run here."""

from __future__ import annotations

import argparse

from rich import box
from rich.table import Table

import kernelhub
from kernelhub._cli import _arguments, _tables

CAPTION = ("lowered for: the targets (places jax lowers for) whose lowering of an unforced call "
           "uses it, as an exported function holds it; kernelhub.resolve(op, backend=...) takes "
           "cuda and rocm as the gpu backend")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", help="only this op")
    parser.add_argument("--platform", type=_arguments.platform,
                        help="only this platform: xla, pallas or triton")
    parser.add_argument("--backend", type=_arguments.backend,
                        help="only this backend: tpu, gpu (cuda and rocm mean gpu), cpu or any")
    _arguments.add_import_option(parser)


def run(args: argparse.Namespace) -> int:
    from kernelhub._core import dispatch as _dispatch
    from kernelhub._core import registry as _registry  # noqa: PLC0415

    only_platform = getattr(args, "platform", None)
    only_backend = getattr(args, "backend", None)
    # Borderless, so that the longest op name and the reasons fit an 80-column terminal.
    table = Table(title="kernelhub implementations", caption=CAPTION, box=box.SIMPLE_HEAD,
                  show_edge=False, padding=(0, 1, 0, 0))
    names = [args.op] if args.op else kernelhub.op_names()
    # An op's name is what a user types into get/resolve: never cut it; the reasons wrap instead.
    table.add_column("op", no_wrap=True, min_width=max(map(len, names), default=2))
    table.add_column("platform", no_wrap=True)
    table.add_column("backend", no_wrap=True)
    table.add_column("priority", no_wrap=True, justify="right")
    table.add_column("available here", ratio=1, min_width=len("available"))
    table.add_column("lowered for", max_width=len("cpu, cuda, rocm"))
    for op in names:
        try:
            chosen = kernelhub.resolve(op)
        except kernelhub.NoImplementationError:
            chosen = None
        per_target = _dispatch.per_target(_registry.op_definition(op).name, _registry.version())
        for spec in kernelhub.implementations(op):
            if only_platform not in (None, spec.platform.value):
                continue
            if only_backend not in (None, spec.backend.value):
                continue
            table.add_row(op, spec.platform.value, spec.backend.value, str(spec.priority),
                          _availability(spec, chosen),
                          ", ".join(target for target, choice in per_target.entries
                                    if choice == spec))
    _tables.console().print(table)
    return 0


def _availability(spec, chosen) -> str:
    """Whether `spec` can run here, and whether an unforced call here runs it."""
    reason = spec.unavailable_reason()
    if reason is not None:
        return f"no: {reason}"
    if spec.interpret_only:
        return "yes, when forced (interpret mode)"
    return "yes, the default here" if chosen == spec else "yes"
