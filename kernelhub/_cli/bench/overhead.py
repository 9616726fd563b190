"""`kernelhub bench --overhead`: what a call outside jit costs beyond its kernel.

An eager call of `kernelhub.grouped_matmul(...)` binds its arguments to the contract, checks
their types and shapes, validates them (group sizes are read back to the host), selects an
implementation and runs it. At a tiny shape the kernel's own time is small, so the difference
from calling the selected implementation directly, with the arguments it receives, is the
dispatcher's cost per call. Under jax.jit all of it happens once, when the call is traced; the
jitted column shows that steady state.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

import kernelhub
from kernelhub._cli import _tables
from kernelhub._cli.bench.timing import best_medians

COLUMNS = ("op", "shape", "call us", "directly us", "overhead us", "inside jit us")


@dataclasses.dataclass(frozen=True)
class Overhead:
    op: str
    shape: str
    entry: float  # seconds per call, eager, through kernelhub
    direct: float  # the selected implementation called directly
    jitted: float  # a jitted function that calls kernelhub

    def cells(self) -> list[str]:
        short = "gmm" if self.op == "grouped_matmul" else "tgmm"
        return [short, self.shape, *(f"{t * 1e6:.0f}" for t in (self.entry, self.direct)),
                f"{(self.entry - self.direct) * 1e6:.0f}", f"{self.jitted * 1e6:.0f}"]


def _calls(op: str) -> tuple[str, Callable[[], jax.Array], Callable[[], jax.Array],
                             Callable[[], jax.Array]]:
    sizes = jnp.array([3, 5], jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    spec = kernelhub.resolve(op)
    f32 = jnp.dtype(jnp.float32)
    if op == "grouped_matmul":
        lhs, rhs = jnp.ones((8, 4)), jnp.ones((2, 4, 4))
        entry = lambda: kernelhub.grouped_matmul(lhs, rhs, sizes)  # noqa: E731
        direct = lambda: spec.fn(lhs, rhs, sizes, f32, None, zero, None, False)  # noqa: E731
        jitted_op = jax.jit(lambda a, b, s: kernelhub.grouped_matmul(a, b, s))
        return "m=8 k=4 n=4 G=2", entry, direct, lambda: jitted_op(lhs, rhs, sizes)
    lhs, rhs = jnp.ones((4, 8)), jnp.ones((8, 4))
    entry = lambda: kernelhub.transposed_grouped_matmul(lhs, rhs, sizes)  # noqa: E731
    direct = lambda: spec.fn(lhs, rhs, sizes, f32, None, zero, 2, None)  # noqa: E731
    jitted_op = jax.jit(lambda a, b, s: kernelhub.transposed_grouped_matmul(a, b, s))
    return "k=4 m=8 n=4 G=2", entry, direct, lambda: jitted_op(lhs, rhs, sizes)


def measure(op: str, reps: int, rounds: int) -> Overhead:
    """Best over `rounds` of the median of `reps` interleaved calls, per path."""
    shape, *fns = _calls(op)
    return Overhead(op, shape, *best_medians(lambda: fns, reps, rounds))


def run_overhead(args: argparse.Namespace) -> int:
    console = _tables.console()
    reps = args.reps or 300
    rows = [measure(op, reps, rounds=5).cells() for op in args.ops]
    header = _tables.run_header(
        "overhead", f"best of 5 rounds of the median of {reps} interleaved eager calls")
    _tables.report(console, header, COLUMNS, rows, args.out)
    return 0
