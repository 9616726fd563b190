"""`kernelhub bench --ragged`: kernelhub.ragged_dot_general against jax.lax's, in all three modes.

Each mode at one MoE shape, both called with the same dimension numbers, jitted, timed in turns
on the same arrays (best of a few input draws, median of the turns, as `kernelhub bench`). The
floor is a batched matmul of the same FLOPs: the groups as equal batch entries (for mode 3 it is
exactly what lax computes, since lax ignores the group sizes there).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import kernelhub
from kernelhub._cli import _tables
from kernelhub._cli._group_sizes import group_sizes
from kernelhub._cli.bench.timing import interleaved_samples

Numbers = jax.lax.RaggedDotDimensionNumbers


@dataclasses.dataclass(frozen=True)
class RaggedCase:
    mode: int
    m: int
    k: int
    n: int
    groups: int
    dtype: str

    @property
    def description(self) -> str:
        return {1: "1: ragged rows", 2: "2: ragged contraction", 3: "3: ragged batch"}[self.mode]

    @property
    def shapes(self) -> str:
        return {
            1: f"[{self.m}, {self.k}] x [{self.groups}, {self.k}, {self.n}]",
            2: f"[{self.m}, {self.k}] x [{self.m}, {self.n}]",
            3: f"[{self.groups * 8}, {self.m // (self.groups * 8)}, {self.k}] x "
               f"[{self.groups * 8}, {self.k}, {self.n}]",
        }[self.mode]


def _problem(case: RaggedCase, rng: np.random.Generator):
    """(lhs, rhs, group sizes, dimension numbers, floor operands) for one mode."""
    dtype = jnp.dtype(case.dtype)

    def draw(*shape):
        return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)

    g = case.groups
    rows = case.m // g
    if case.mode == 1:
        numbers = Numbers((([1], [1]), ([], [])), [0], [0])
        operands = draw(case.m, case.k), draw(g, case.k, case.n)
        sizes = group_sizes(case.m, g, "balanced")
        floor = draw(g, rows, case.k), operands[1]
        floor_spec = "gmk,gkn->gmn"
    elif case.mode == 2:
        numbers = Numbers((([0], [0]), ([], [])), [0], [])
        operands = draw(case.m, case.k), draw(case.m, case.n)
        sizes = group_sizes(case.m, g, "balanced")
        floor = draw(g, rows, case.k), draw(g, rows, case.n)
        floor_spec = "gmk,gmn->gkn"
    else:
        entries = g * 8  # eight batch entries per group
        per_entry = case.m // entries
        numbers = Numbers((([2], [1]), ([0], [0])), [0], [])
        operands = draw(entries, per_entry, case.k), draw(entries, case.k, case.n)
        sizes = group_sizes(entries, g, "balanced")
        floor = operands
        floor_spec = "bmk,bkn->bmn"
    return operands, jnp.asarray(sizes), numbers, floor, floor_spec


def measure(case: RaggedCase, reps: int, draws: int) -> dict[str, float]:
    rng = np.random.default_rng(2)
    times: dict[str, list[float]] = {"kernelhub": [], "lax": [], "floor": []}
    for _ in range(draws):
        (lhs, rhs), sizes, numbers, floor_operands, floor_spec = _problem(case, rng)
        ours = jax.jit(lambda a, b, s: kernelhub.ragged_dot_general(
            a, b, s, numbers, preferred_element_type=jnp.float32))
        theirs = jax.jit(lambda a, b, s: jax.lax.ragged_dot_general(
            a, b, s, numbers, preferred_element_type=jnp.float32))
        floor = jax.jit(lambda a, b: jnp.einsum(floor_spec, a, b, preferred_element_type=jnp.float32))
        samples = interleaved_samples([lambda: ours(lhs, rhs, sizes), lambda: floor(*floor_operands)],
                                      reps)
        times["kernelhub"].append(statistics.median(samples[0]))
        times["floor"].append(statistics.median(samples[1]))
        if not times["lax"]:  # lax is far behind on CPU: one draw, fewer turns
            (lax_turns,) = interleaved_samples([lambda: theirs(lhs, rhs, sizes)], max(1, reps // 2))
            times["lax"].append(statistics.median(lax_turns))
    return {name: min(values) for name, values in times.items()}


COLUMNS = ("mode", "groups", "dtype", "ours ms", "lax ms", "floor ms", "lax / ours",
           "ours / floor")


def cells(case: RaggedCase, t: dict[str, float]) -> list[str]:
    return [case.description, str(case.groups), case.dtype,
            f"{t['kernelhub'] * 1e3:.1f}", f"{t['lax'] * 1e3:.1f}", f"{t['floor'] * 1e3:.1f}",
            f"{t['lax'] / t['kernelhub']:.1f}x", f"{t['kernelhub'] / t['floor']:.2f}"]


def cases(quick: bool, dtypes: list[str]) -> list[RaggedCase]:
    m, k, n, groups = (2048, 512, 512, 8) if quick else (4096, 1024, 1024, 64)
    return [RaggedCase(mode, m, k, n, groups, dtype) for dtype in dtypes for mode in (1, 2, 3)]


def run_ragged(args: argparse.Namespace) -> int:
    console = _tables.console()
    reps = args.reps or (3 if args.quick else 5)
    draws = args.draws or (1 if args.quick else 2)
    rows = []
    for case in cases(args.quick, args.dtypes):
        with console.status(f"mode {case.mode} {case.dtype}"):
            rows.append(cells(case, measure(case, reps, draws)))
    header = (f"kernelhub bench --ragged{' --quick' if args.quick else ''}, {datetime.date.today()}, "
              f"jax {jax.__version__}, {jax.default_backend()}; ragged_dot_general of both, jitted, "
              f"float32 result, balanced groups; {kernelhub.resolve('ragged_dot_general').platform.value}")
    todo = cases(args.quick, args.dtypes)
    legend = "; ".join(f"mode {c.mode}: {c.shapes}" for c in todo[:3])
    notes = (f"{legend}. lax / ours: speed-up over jax.lax.ragged_dot_general; ours / floor: "
             "time over a batched matmul of the same FLOPs (lower is better).")
    _tables.report(console, header, COLUMNS, rows, args.out, notes)
    return 0
