"""The `kernelhub` command: list, bench, verify, tune.

Subcommands live in their own modules and are imported only when run, so `kernelhub list` does not
pay for the benchmark's or the TPU compiler's imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kernelhub._cli import _arguments

# name -> (module with add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS = {
    "list": ("kernelhub._cli.listing", "table of ops x platform x backend, available here or why not"),
    "bench": ("kernelhub._cli.bench", "time the grouped matmuls against a dense floor and ragged_dot"),
    "verify": ("kernelhub._cli.verify", "compile the kernels ahead of time for hardware not present"),
    "tune": ("kernelhub._cli.tune", "autotune a grouped matmul's tilings on this device, per pass"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernelhub", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    modules = {}
    chosen = (argv if argv is not None else sys.argv[1:])[:1]
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if name in chosen:  # import only the subcommand that runs
            modules[name] = importlib.import_module(module_name)
            modules[name].add_arguments(sub)
    args = parser.parse_args(argv)
    try:
        # The user's modules first (--import), so that their ops and kernels are registered.
        _arguments.import_user_modules(getattr(args, "import_modules", []))
        return int(modules[args.command].run(args) or 0)
    except ValueError as error:  # a bad choice for this host (NoImplementationError included),
        # or a user's module that failed to import
        parser.exit(2, f"kernelhub {args.command}: error: {str(error).splitlines()[0]}\n")


if __name__ == "__main__":
    sys.exit(main())
