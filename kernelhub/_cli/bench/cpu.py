"""`kernelhub bench` without a benchmark flag: the grouped matmuls against a floor and a peer,
measured in one run on this host (the CPU, usually).

Floor: a batched matmul doing the same FLOPs with the rows split evenly over the groups
(einsum 'gmk,gkn->gmn'; for tgmm 'gkm,gmn->gkn'). Peer: jax.lax.ragged_dot(_general).
Ratios are times divided by the floor's (1.0 = as fast as the batched matmul) and the peer's time
divided by ours (how many times faster kernelhub is). Each case is timed on a few fresh input
draws, in turns, and each side keeps the median of its turns in its best draw; a shape's floor
is its best over all of that shape's cases (docs/xla.md says why: the floor has a fast and a
slow state on this kind of machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from rich.progress import Progress
from rich.table import Table

import kernelhub
from kernelhub._cli import _tables
from kernelhub._cli._group_sizes import group_sizes
from kernelhub._cli.bench.timing import interleaved_samples


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    m: int
    k: int
    n: int
    groups: int
    dtype: str
    sizes: str  # "balanced" or "skewed" (Dirichlet alpha 0.5)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


@dataclasses.dataclass
class Result:
    case: Case
    ours: float
    floor: float
    peer: float | None

    @property
    def vs_floor(self) -> float:
        return self.ours / self.floor

    @property
    def vs_peer(self) -> float | None:
        return None if self.peer is None else self.peer / self.ours


def _ragged_numbers(op: str):
    gmm = jax.lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), [0], [0])
    tgmm = jax.lax.RaggedDotDimensionNumbers((((1,), (0,)), ((), ())), [1], [])
    return gmm if op == "grouped_matmul" else tgmm


def _inputs(case: Case, rng: np.random.Generator):
    """(lhs, rhs) for the op and (a, b) for the floor, freshly allocated."""
    dtype = jnp.dtype(case.dtype)
    rows_per_group = case.m // case.groups

    def draw(*shape):
        return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)

    if case.op == "grouped_matmul":
        lhs, rhs = draw(case.m, case.k), draw(case.groups, case.k, case.n)
        return (lhs, rhs), (draw(case.groups, rows_per_group, case.k), rhs)
    lhs, rhs = draw(case.k, case.m), draw(case.m, case.n)
    return (lhs, rhs), (draw(case.groups, case.k, rows_per_group),
                        draw(case.groups, rows_per_group, case.n))


def measure(case: Case, reps: int, draws: int, peer_max_groups: int,
            platform: str | None) -> Result:
    rng = np.random.default_rng(1)
    sizes = jnp.asarray(group_sizes(case.m, case.groups, case.sizes))
    op = kernelhub.get(case.op, platform=platform)
    numbers = _ragged_numbers(case.op)
    floor_spec = "gmk,gkn->gmn" if case.op == "grouped_matmul" else "gkm,gmn->gkn"
    ours = jax.jit(lambda a, b, s: op(a, b, s))
    floor = jax.jit(lambda a, b: jnp.einsum(floor_spec, a, b, preferred_element_type=jnp.float32))
    peer = jax.jit(lambda a, b, s: jax.lax.ragged_dot_general(
        a, b, s, numbers, preferred_element_type=jnp.float32))
    ours_times, floor_times, peer_times = [], [], []
    for draw in range(draws):
        # Fresh arrays each draw. On XLA:CPU one executable can run in a fast or a slow state,
        # for whole runs at a time: the bf16 floor at 8 groups took 5-9 or 16-26 ms on arrays of
        # one shape (docs/xla.md; the cause is not pinned down). Each function keeps the median
        # of its turns in its best draw, so neither side is compared in its slow state against
        # the other's fast one.
        (lhs, rhs), batched = _inputs(case, rng)
        ours_turns, floor_turns = interleaved_samples(
            [lambda: ours(lhs, rhs, sizes), lambda: floor(*batched)], reps)
        ours_times.append(statistics.median(ours_turns))
        floor_times.append(statistics.median(floor_turns))
        if draw == 0 and case.groups <= peer_max_groups:
            # The peer is slow on CPU, and far enough behind that one draw in fewer turns does.
            (peer_turns,) = interleaved_samples([lambda: peer(lhs, rhs, sizes)], max(1, reps // 2))
            peer_times.append(statistics.median(peer_turns))
        del lhs, rhs, batched
    return Result(case, min(ours_times), min(floor_times), min(peer_times) if peer_times else None)


def shared_floors(results: list[Result]) -> list[Result]:
    """Each result against the best floor time of its shape over the whole run.

    Balanced and skewed cases of one shape time the same floor; its fast and slow states can
    fall one to each, and a ratio against the slow one would flatter kernelhub.
    """
    best: dict[Case, float] = {}
    for r in results:
        shape = dataclasses.replace(r.case, sizes="")
        best[shape] = min(best.get(shape, r.floor), r.floor)
    return [dataclasses.replace(r, floor=best[dataclasses.replace(r.case, sizes="")])
            for r in results]


def cases(args: argparse.Namespace) -> list[Case]:
    if args.quick:
        m, k, n, groups = 2048, 512, 512, args.groups or [8, 64]
    else:
        m, k, n, groups = 4096, 1024, 1024, args.groups or [8, 64, 256]
    if getattr(args, "shape", None):
        m, k, n = args.shape
    return [Case(op, m, k, n, g, dtype, kind) for op in args.ops for dtype in args.dtypes
            for g in groups for kind in ("balanced", "skewed")]


COLUMNS = ("op", "m x k x n", "groups", "dtype", "sizes", "kernelhub ms", "floor ms",
           "time / floor", "ragged_dot ms", "ragged_dot / kernelhub", "ragged_dot / floor")


def _cells(r: Result) -> list[str]:
    c = r.case
    # ragged_dot / floor is the most any implementation as fast as the floor could gain over
    # ragged_dot: it tells a slow kernel from a bound the machine sets.
    peer_cells = (["-"] * 3 if r.peer is None else
                  [f"{r.peer * 1e3:.0f}", f"{r.vs_peer:.0f}x", f"{r.peer / r.floor:.0f}x"])
    return ["gmm" if c.op == "grouped_matmul" else "tgmm", f"{c.m}x{c.k}x{c.n}", str(c.groups),
            c.dtype, c.sizes, f"{r.ours * 1e3:.1f}", f"{r.floor * 1e3:.1f}",
            f"{r.vs_floor:.2f}", *peer_cells]


# The terminal table fits 100 columns: the shape (one per run) goes to the title, and the
# headers are short enough to wrap at their spaces.
_SHORT_HEADERS = {"kernelhub ms": "ours ms", "time / floor": "ours / floor",
                  "ragged_dot ms": "lax ms", "ragged_dot / kernelhub": "lax / ours",
                  "ragged_dot / floor": "lax / floor"}
_SHAPE = COLUMNS.index("m x k x n")


def render(results: list[Result], title: str) -> Table:
    shapes = sorted({f"{r.case.m}x{r.case.k}x{r.case.n}" for r in results})
    table = Table(title=f"{title}; m x k x n = {', '.join(shapes)}")
    for column in COLUMNS[:_SHAPE] + COLUMNS[_SHAPE + 1:]:
        table.add_column(_SHORT_HEADERS.get(column, column),
                         justify="left" if column in COLUMNS[:5] else "right")
    for r in results:
        cells = _cells(r)
        table.add_row(*(cells[:_SHAPE] + cells[_SHAPE + 1:]))
    return table


def markdown(results: list[Result], header: str) -> str:
    return _tables.markdown(header, COLUMNS, [_cells(r) for r in results])


def run_cpu(args: argparse.Namespace) -> int:
    console = _tables.console()
    reps = args.reps or (3 if args.quick else 5)
    draws = args.draws or (1 if args.quick else 3)
    todo = cases(args)
    spec = {op: kernelhub.resolve(op, platform=args.platform) for op in args.ops}
    results = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(todo))
        for case in todo:
            progress.update(task, description=f"{case.op} G={case.groups} {case.dtype} {case.sizes}")
            results.append(measure(case, reps, draws, args.peer_max_groups, args.platform))
            progress.advance(task)
    chosen = ", ".join(f"{op}: {s.platform.value}/{s.backend.value}" for op, s in spec.items())
    drawn = f"best of {draws} input draws" if draws > 1 else "one input draw"
    header = (f"kernelhub bench{' --quick' if args.quick else ''}, {datetime.date.today()}, "
              f"jax {jax.__version__}, {jax.default_backend()} ({jax.devices()[0].device_kind}), "
              f"{drawn}, median of {reps} turns each; {chosen}")
    results = shared_floors(results)
    console.print(render(results, header))
    console.print("ours / floor: kernelhub's time over a batched matmul of the same FLOPs (lower "
                  "is better); lax: jax.lax.ragged_dot; lax / ours: kernelhub's speed-up over it; "
                  "lax / floor: the speed-up the floor itself would have.")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown(results, header))
        console.print(f"wrote {args.out}")
    return 0
