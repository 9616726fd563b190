"""`kernelhub bench`: the grouped matmuls against a floor and a peer, measured in one run.

Floor: a batched matmul doing the same FLOPs with the rows split evenly over the groups
(einsum 'gmk,gkn->gmn'; for tgmm 'gkm,gmn->gkn'). Peer: jax.lax.ragged_dot(_general).
Ratios are times divided by the floor's (1.0 = as fast as the batched matmul) and the peer's time
divided by ours (how many times faster kernelhub is).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import kernelhub
from kernelhub._cli._group_sizes import group_sizes


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small demo set (about a minute)")
    parser.add_argument("--gpu", action="store_true", help="the GPU benchmark (needs an NVIDIA GPU)")
    parser.add_argument("--groups", type=int, nargs="+", help="numbers of groups (default 8 64 256)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--ops", nargs="+", default=["grouped_matmul", "transposed_grouped_matmul"])
    parser.add_argument("--peer-max-groups", type=int, default=64,
                        help="time ragged_dot only up to this many groups (it is slow on CPU)")
    parser.add_argument("--reps", type=int, help="timed repetitions per measurement")
    parser.add_argument("--out", type=Path, help="also write the table as markdown to this file")
    parser.add_argument("--platform", help="force a kernelhub platform (default: the dispatcher's)")
    try:
        from kernelhub._cli import bench_gpu
    except ImportError:
        return
    if hasattr(bench_gpu, "add_gpu_arguments"):
        bench_gpu.add_gpu_arguments(parser)


def interleaved_seconds(fns: list[Callable[[], jax.Array]], reps: int) -> list[float]:
    """Median seconds of each function, timed in turns so that load from other processes hits
    all of them alike and the ratios between them stay fair."""
    for fn in fns:
        jax.block_until_ready(fn())  # compile and warm up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, record in zip(fns, times):
            start = time.perf_counter()
            jax.block_until_ready(fn())
            record.append(time.perf_counter() - start)
    return [statistics.median(record) for record in times]


def _ragged_numbers(op: str):
    gmm = jax.lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), [0], [0])
    tgmm = jax.lax.RaggedDotDimensionNumbers((((1,), (0,)), ((), ())), [1], [])
    return gmm if op == "grouped_matmul" else tgmm


def measure(case: Case, reps: int, peer_max_groups: int, platform: str | None) -> Result:
    dtype = jnp.dtype(case.dtype)
    rng = np.random.default_rng(1)
    sizes = jnp.asarray(group_sizes(case.m, case.groups, case.sizes))
    rows_per_group = case.m // case.groups
    op = kernelhub.get(case.op, platform=platform)
    numbers = _ragged_numbers(case.op)
    if case.op == "grouped_matmul":
        lhs = jnp.asarray(rng.standard_normal((case.m, case.k)), dtype)
        rhs = jnp.asarray(rng.standard_normal((case.groups, case.k, case.n)), dtype)
        batched = (jnp.asarray(rng.standard_normal((case.groups, rows_per_group, case.k)), dtype), rhs)
        floor_spec = "gmk,gkn->gmn"
    else:
        lhs = jnp.asarray(rng.standard_normal((case.k, case.m)), dtype)
        rhs = jnp.asarray(rng.standard_normal((case.m, case.n)), dtype)
        batched = (jnp.asarray(rng.standard_normal((case.groups, case.k, rows_per_group)), dtype),
                   jnp.asarray(rng.standard_normal((case.groups, rows_per_group, case.n)), dtype))
        floor_spec = "gkm,gmn->gkn"
    ours = jax.jit(lambda a, b, s: op(a, b, s))
    floor = jax.jit(lambda a, b: jnp.einsum(floor_spec, a, b, preferred_element_type=jnp.float32))
    peer = jax.jit(lambda a, b, s: jax.lax.ragged_dot_general(
        a, b, s, numbers, preferred_element_type=jnp.float32))
    timed = [lambda: ours(lhs, rhs, sizes), lambda: floor(*batched)]
    if case.groups <= peer_max_groups:
        # The peer is slow on CPU: time it in fewer turns of its own.
        timed.append(lambda: peer(lhs, rhs, sizes))
    seconds = interleaved_seconds(timed[:2], reps)
    peer_seconds = interleaved_seconds(timed[2:], max(1, reps // 2)) if len(timed) > 2 else [None]
    return Result(case, seconds[0], seconds[1], peer_seconds[0])


def cases(args: argparse.Namespace) -> list[Case]:
    if args.quick:
        m, k, n, groups = 2048, 512, 512, args.groups or [8, 64]
    else:
        m, k, n, groups = 4096, 1024, 1024, args.groups or [8, 64, 256]
    return [Case(op, m, k, n, g, dtype, kind) for op in args.ops for dtype in args.dtypes
            for g in groups for kind in ("balanced", "skewed")]


def render(results: list[Result], title: str) -> Table:
    table = Table(title=title)
    for column in ("op", "m x k x n", "groups", "dtype", "sizes", "kernelhub ms", "floor ms",
                   "vs floor", "ragged_dot ms", "speedup vs ragged_dot"):
        table.add_column(column, justify="right" if column.endswith(("ms", "floor", "dot")) else "left")
    for r in results:
        c = r.case
        table.add_row(
            "gmm" if c.op == "grouped_matmul" else "tgmm", f"{c.m}x{c.k}x{c.n}", str(c.groups),
            c.dtype, c.sizes, f"{r.ours * 1e3:.1f}", f"{r.floor * 1e3:.1f}", f"{r.vs_floor:.2f}x",
            "-" if r.peer is None else f"{r.peer * 1e3:.0f}",
            "-" if r.vs_peer is None else f"{r.vs_peer:.0f}x",
        )
    return table


def markdown(results: list[Result], header: str) -> str:
    lines = [header, "", "| op | m x k x n | groups | dtype | sizes | kernelhub ms | floor ms | "
             "time / floor | ragged_dot ms | ragged_dot / kernelhub |", "|" + "---|" * 10]
    for r in results:
        c = r.case
        lines.append(
            f"| {'gmm' if c.op == 'grouped_matmul' else 'tgmm'} | {c.m}x{c.k}x{c.n} | {c.groups} | "
            f"{c.dtype} | {c.sizes} | {r.ours * 1e3:.1f} | {r.floor * 1e3:.1f} | {r.vs_floor:.2f} | "
            f"{'-' if r.peer is None else f'{r.peer * 1e3:.0f}'} | "
            f"{'-' if r.vs_peer is None else f'{r.vs_peer:.0f}x'} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if args.gpu:
        from kernelhub._cli import bench_gpu

        return int(bench_gpu.run_gpu_benchmark(args) or 0)
    console = Console()
    if not console.is_terminal:
        console.width = 160
    reps = args.reps or (3 if args.quick else 5)
    todo = cases(args)
    spec = {op: kernelhub.resolve(op, platform=args.platform) for op in args.ops}
    results = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(todo))
        for case in todo:
            progress.update(task, description=f"{case.op} G={case.groups} {case.dtype} {case.sizes}")
            results.append(measure(case, reps, args.peer_max_groups, args.platform))
            progress.advance(task)
    chosen = ", ".join(f"{op}: {s.platform.value}/{s.backend.value}" for op, s in spec.items())
    header = (f"kernelhub bench{' --quick' if args.quick else ''}, {datetime.date.today()}, "
              f"jax {jax.__version__}, {jax.default_backend()} ({jax.devices()[0].device_kind}), "
              f"median of {reps}; {chosen}")
    console.print(render(results, header))
    console.print("vs floor: kernelhub time / batched matmul of the same FLOPs (lower is better); "
                  "speedup: ragged_dot time / kernelhub time.")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown(results, header))
        console.print(f"wrote {args.out}")
    return 0
