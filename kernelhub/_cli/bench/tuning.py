"""`kernelhub bench --tuning`: tuned tilings against the heuristic's, on held-out group sizes.

Each case is one op at the benchmark's shape, timed two ways in turns in one process: every
kernel on its implementation's heuristic tiling (`kernelhub.tuning.heuristic()`), and every
kernel on the table in force (the one shipped for this device, or --tuning-table FILE). Both
the forward call and a training step (forward and both gradients) are timed. The skewed sizes
are the benchmark's own draw, which the tuner never times (it draws from a stream of its own),
so a table that only fits the sizes it was tuned on shows no gain here.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import kernelhub
from kernelhub import tuning
from kernelhub._cli import _tables
from kernelhub._cli._group_sizes import PATTERNS, group_sizes
from kernelhub._cli.bench.timing import best_medians
from kernelhub._grouped_matmul import active_table as _active
from kernelhub._grouped_matmul import tables as _table
from kernelhub.tuning import _autotune

COLUMNS = ("op", "groups", "dtype", "sizes", "step", "heuristic ms", "tuned ms", "speed-up",
           "tilings changed")
STEPS = ("forward", "forward + gradients")
NOTES = ("heuristic: every kernel on its implementation's heuristic tiling; speed-up: "
         "heuristic ms / tuned ms; tilings changed: the passes the table tiles otherwise.")


def _step(op: str, dtype, platform: str | None, with_gradients: bool) -> Callable:
    call = kernelhub.get(op, platform=platform)

    def loss(lhs, rhs, sizes):
        return jnp.sum(call(lhs, rhs, sizes).astype(jnp.float32))

    if with_gradients:
        return jax.jit(jax.grad(loss, argnums=(0, 1)))
    return jax.jit(lambda lhs, rhs, sizes: call(lhs, rhs, sizes))


def _operands(op: str, m: int, k: int, n: int, groups: int, dtype, rng: np.random.Generator):
    def draw(*shape):
        return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)

    if op == "grouped_matmul":
        return draw(m, k), draw(groups, k, n)
    return draw(k, m), draw(m, n)


def _changed(table: tuning.Tuning | None, fn: Callable, args: tuple) -> str:
    """The passes the table tiles otherwise than the heuristic, e.g. 'forward 1024x1024x1024'."""
    recorder = _autotune.Recorder()
    with _active.activated(recorder):
        jax.eval_shape(fn, *args)
    changed = []
    for key, call in sorted(recorder.calls.items()):
        chosen = table.tiling_for(call) if table is not None else _table.shipped_tiling(call)
        if chosen is not None and tuple(chosen) != tuple(call.space.default(call.problem)):
            changed.append(f"{key.pass_name} {'x'.join(map(str, chosen))}")
    return ", ".join(changed) or "none"


def measure(op: str, m: int, k: int, n: int, groups: int, dtype_name: str, pattern: str,
            table: tuning.Tuning | None, reps: int, draws: int,
            platform: str | None) -> list[list[str]]:
    dtype = jnp.dtype(dtype_name)
    sizes = jnp.asarray(group_sizes(m, groups, pattern))
    rng = np.random.default_rng(1)
    rows = []
    for step_name in STEPS:
        fn = _step(op, dtype, platform, with_gradients=step_name != "forward")

        def heuristic(lhs, rhs, fn=fn):
            with tuning.heuristic():
                return fn(lhs, rhs, sizes)

        def tuned(lhs, rhs, fn=fn):
            with table if table is not None else contextlib.nullcontext():
                return fn(lhs, rhs, sizes)

        def turns():
            lhs, rhs = _operands(op, m, k, n, groups, dtype, rng)
            return [lambda: heuristic(lhs, rhs), lambda: tuned(lhs, rhs)]

        best = best_medians(turns, reps, draws)
        changed = _changed(table, fn, (*_operands(op, m, k, n, groups, dtype, rng), sizes))
        rows.append(["gmm" if op == "grouped_matmul" else "tgmm", str(groups), dtype_name,
                     pattern, step_name, f"{best[0] * 1e3:.1f}", f"{best[1] * 1e3:.1f}",
                     f"{best[0] / best[1]:.2f}x", changed])
    return rows


def run_tuning(args: argparse.Namespace) -> int:
    console = _tables.console()
    reps = args.reps or (3 if args.quick else 5)
    draws = args.draws or (1 if args.quick else 2)
    m, k, n = (2048, 512, 512) if args.quick else (4096, 1024, 1024)
    groups = args.groups or ([8, 64] if args.quick else [8, 64, 256])
    table = tuning.load(args.tuning_table) if args.tuning_table else None
    rows = []
    for op in args.ops:
        for dtype_name in args.dtypes:
            for count in groups:
                for pattern in PATTERNS:
                    with console.status(f"{op} {count} groups {dtype_name} {pattern}"):
                        rows += measure(op, m, k, n, count, dtype_name, pattern, table, reps,
                                        draws, args.platform)
    source = str(args.tuning_table) if table else (
        f"the table shipped for {jax.devices()[0].device_kind!r}")
    header = _tables.run_header(
        "tuning", f"{m}x{k}x{n}, tuned: {source}; best of {draws} input draws, median of {reps} "
        f"turns each")
    _tables.report(console, header, COLUMNS, rows, args.out, NOTES)
    return 0
