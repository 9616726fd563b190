"""Command-line values the subcommands share: ops, dtypes, shapes, platforms, backends, numbers
and the user's modules, each read with an error that says what is accepted."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import sysconfig
import traceback

# The table's short names and the ops' names, both accepted on the command line.
OPS = {"gmm": "grouped_matmul", "tgmm": "transposed_grouped_matmul"}
DTYPES = {"float32": "float32", "f32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "f16": "float16"}


def op(value: str) -> str:
    """An op's name, from its short or full name."""
    name = OPS.get(value, value)
    if name not in OPS.values():
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an op here; choose from {', '.join([*OPS, *OPS.values()])}")
    return name


def short_op(name: str) -> str:
    return next(short for short, full in OPS.items() if full == name)


def dtype(value: str) -> str:
    """A dtype's name (float32, bfloat16, float16), from it or its short form."""
    try:
        return DTYPES[value.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a dtype here; choose from {', '.join(DTYPES)}") from None


# Quantized operand dtypes, for commands whose calls quantize bf16 operands (kernelhub tune).
QUANTIZED_DTYPES = {"fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
                    "float8_e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2",
                    "float8_e5m2": "float8_e5m2", "int8": "int8"}


def operand_dtype(value: str) -> str:
    """A float dtype's name (as `dtype`), or a quantized one's (float8_e4m3fn, ...)."""
    quantized = QUANTIZED_DTYPES.get(value.lower())
    if quantized is not None:
        return quantized
    try:
        return dtype(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an operand dtype here; choose from "
            f"{', '.join([*DTYPES, *QUANTIZED_DTYPES])}") from None


def positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be a positive integer")
    return number


def non_negative(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be a number >= 0")
    return number


def shape(text: str) -> tuple[int, int, int]:
    """An M x K x N problem shape such as 4096x1024x1024 (rows, model dim, expert dim)."""
    try:
        m, k, n = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be M x K x N such as 4096x1024x1024, got {text!r}") from None
    if min(m, k, n) < 1:
        raise argparse.ArgumentTypeError(f"shape sizes must be >= 1, got {text!r}")
    return m, k, n


def platform(value: str) -> str:
    """A platform name read by the library's rule (case and spaces do not matter), so the
    command accepts and rejects exactly what `kernelhub.get(op, platform=...)` does."""
    from kernelhub._core.registry import as_platform

    try:
        return as_platform(value, argument="--platform").value
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def backend(value: str) -> str:
    """A backend name read by the library's rule: jax's cuda and rocm mean gpu."""
    from kernelhub._core.registry import as_backend

    try:
        return as_backend(value, argument="--backend").value
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_import_option(parser: argparse.ArgumentParser) -> None:
    """`--import MODULE`, repeatable: the user's modules that declare ops or register kernels,
    imported before the subcommand runs (kernelhub.cli does the importing)."""
    parser.add_argument(
        "--import", dest="import_modules", action="append", default=[], metavar="MODULE",
        help="import this module first, e.g. mypkg.ops: one whose kernelhub.define_op and "
             "kernelhub.register calls should count (repeatable; found on PYTHONPATH or in the "
             "current directory)")


def import_user_modules(names: list[str]) -> None:
    """Imports each module named by --import; a module that fails raises a ValueError of one
    line naming it, what went wrong and where in the user's code."""
    if names and os.getcwd() not in sys.path and "" not in sys.path:
        # An installed `kernelhub` script does not look in the current directory (python -m
        # does): a module beside the user is found as `python -c "import mymodule"` finds it.
        sys.path.insert(0, os.getcwd())
    for name in names:
        if name.endswith(".py") or os.sep in name:
            raise ValueError(f"--import {name}: give a module name such as mypkg.ops, not a "
                             f"file; put its folder on PYTHONPATH or run from it")
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - any failure of the user's code is reported
            message = str(error).splitlines()[0] if str(error) else ""
            raise ValueError(f"--import {name} failed: {type(error).__name__}: {message}"
                             f"{_where(error)}") from None


def _where(error: BaseException) -> str:
    """' (at file:line)': the innermost line of the traceback in the user's code (outside
    kernelhub, the standard library and installed packages), the line that failed; '' when there
    is none (a module that was not found)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    installed = tuple(os.path.join(sysconfig.get_paths()[kind], "")
                      for kind in ("stdlib", "purelib", "platlib"))
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith(("<", package, *installed))]
    if isinstance(error, SyntaxError) or not frames:
        return ""  # a SyntaxError's message names its file and line itself
    return f" (at {frames[-1].filename}:{frames[-1].lineno})"
