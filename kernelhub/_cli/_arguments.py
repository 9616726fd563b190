"""Command-line values the subcommands share: ops, dtypes and numbers, each read with an error
that says what is accepted."""

from __future__ import annotations

import argparse

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
