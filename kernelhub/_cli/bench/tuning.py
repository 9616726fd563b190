"""`kernelhub bench --tuning`: tuned tilings against the heuristic's, on held-out group sizes.

Each case is one op at the benchmark's shape (or --shape), timed two ways in turns in one
process: every kernel on its implementation's heuristic tiling (`kernelhub.tuning.heuristic()`),
and every kernel on the table in force (the one shipped for this device, or --tuning-table
FILE). Both the forward call and a training step (forward and both gradients) are timed. The
skewed sizes are the benchmark's own draw, which the tuner never times (it draws from a stream
of its own), so a table that only fits the sizes it was tuned on shows no gain here.

Before timing, each case is traced once to find its kernel calls' tuning keys: a case the table
has no entry for would time the heuristic against itself for minutes, so it is skipped and named
up front, and a run with no case left is an error that says what the table holds.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp

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


def _step(op: str, dtype, platform: str | None, with_gradients: bool,
          out_dtype: str | None = None) -> Callable:
    call = kernelhub.get(op, platform=platform)
    # None keeps the ops' default (float32), the shipped tables' and the published figures'.
    result = {} if out_dtype is None else {"preferred_element_type": jnp.dtype(out_dtype)}

    def loss(lhs, rhs, sizes):
        return jnp.sum(call(lhs, rhs, sizes, **result).astype(jnp.float32))

    if with_gradients:
        return jax.jit(jax.grad(loss, argnums=(0, 1)))
    return jax.jit(lambda lhs, rhs, sizes: call(lhs, rhs, sizes, **result))


def _operands(op: str, m: int, k: int, n: int, groups: int, dtype, key: jax.Array):
    """Fresh operands drawn on the device (as the tuner's: on the host a GPU shape's weights
    take seconds a draw)."""
    shapes = ((m, k), (groups, k, n)) if op == "grouped_matmul" else ((k, m), (m, n))
    return tuple(_autotune.random_array(part, shape, jnp.dtype(dtype))
                 for part, shape in zip(jax.random.split(key), shapes))


def _kernel_calls(fn: Callable, args: tuple) -> dict:
    """The kernel calls `fn` makes on `args`, by tuning key (traced, not run)."""
    recorder = _autotune.Recorder()
    with _active.activated(recorder):
        jax.eval_shape(fn, *args)
    return recorder.calls


def _changed(table: tuning.Tuning | None, fn: Callable, args: tuple) -> str:
    """The passes the table tiles otherwise than the heuristic, e.g. 'forward 1024x1024x1024'."""
    changed = []
    for key, call in sorted(_kernel_calls(fn, args).items()):
        chosen = table.tiling_for(call) if table is not None else _table.shipped_tiling(call)
        if chosen is not None and tuple(chosen) != tuple(call.space.default(call.kernel_problem)):
            changed.append(f"{key.pass_name} {'x'.join(map(str, chosen))}")
    return ", ".join(changed) or "none"


def _abstract_operands(op: str, m: int, k: int, n: int, groups: int, dtype) -> tuple:
    if op == "grouped_matmul":
        shapes = ((m, k), (groups, k, n))
    else:
        shapes = ((k, m), (m, n))
    return (*(jax.ShapeDtypeStruct(shape, dtype) for shape in shapes),
            jax.ShapeDtypeStruct((groups,), jnp.int32))


def _problem(key) -> str:
    """One kernel call's problem as a user spells it: 'gmm 4096x1024x1024, 64 groups, bfloat16
    -> float32' (m, k and n rounded up to powers of two, as tables file them)."""
    p = key.problem
    groups = (f"{p.num_groups} groups" if p.local_groups == p.num_groups
              else f"{p.local_groups} of {p.num_groups} groups")
    return f"{p.kernel} {p.m}x{p.k}x{p.n}, {groups}, {p.lhs_dtype} -> {p.out_dtype}"


def _listed(items: list[str], most: int = 3) -> str:
    shown = "; ".join(items[:most])
    return shown + (f"; and {len(items) - most} more" if len(items) > most else "")


def covered_cases(cases: list[tuple[str, int, str]], m: int, k: int, n: int,
                  table: tuning.Tuning, source: str, platform: str | None,
                  out_dtype: str | None) -> tuple[list[tuple[str, int, str]], str]:
    """The cases (op, groups, dtype) `table` has an entry for, and a note naming the others;
    a ValueError saying what the table holds when it has an entry for none of them."""
    covered, missed = [], []
    for op, groups, dtype_name in cases:
        dtype = jnp.dtype(dtype_name)
        # The training step makes every pass's call, the forward one included.
        fn = _step(op, dtype, platform, with_gradients=True, out_dtype=out_dtype)
        calls = _kernel_calls(fn, _abstract_operands(op, m, k, n, groups, dtype))
        if any(key in table.entries for key in calls):
            covered.append((op, groups, dtype_name))
        else:
            missed += [_problem(key) for key in calls if key.pass_name == "forward"]
    if not covered:
        held = sorted({f"{_problem(key)} on {key.device_kind}" for key in table.entries})
        holds = f"it holds {_listed(held)}" if held else "it is empty"
        raise ValueError(
            f"{source} has no entry for the calls this bench would time ({_listed(missed)}); "
            f"{holds}: give --shape, --groups, --dtypes and --out-dtype of a tuned call")
    note = "" if not missed else (
        f"skipped, as {source} has no entry for them (they would time the heuristic against "
        f"itself): {_listed(missed, most=len(missed))}")
    return covered, note


def measure(op: str, m: int, k: int, n: int, groups: int, dtype_name: str, pattern: str,
            table: tuning.Tuning | None, reps: int, draws: int,
            platform: str | None, out_dtype: str | None = None) -> list[list[str]]:
    dtype = jnp.dtype(dtype_name)
    sizes = jnp.asarray(group_sizes(m, groups, pattern))
    draws_made = itertools.count()

    def fresh():
        return _operands(op, m, k, n, groups, dtype,
                         jax.random.fold_in(jax.random.key(1), next(draws_made)))

    rows = []
    for step_name in STEPS:
        fn = _step(op, dtype, platform, with_gradients=step_name != "forward",
                   out_dtype=out_dtype)

        def heuristic(lhs, rhs, fn=fn):
            with tuning.heuristic():
                return fn(lhs, rhs, sizes)

        def tuned(lhs, rhs, fn=fn):
            with table if table is not None else contextlib.nullcontext():
                return fn(lhs, rhs, sizes)

        def turns():
            lhs, rhs = fresh()
            return [lambda: heuristic(lhs, rhs), lambda: tuned(lhs, rhs)]

        best = best_medians(turns, reps, draws)
        changed = _changed(table, fn, (*fresh(), sizes))
        rows.append(["gmm" if op == "grouped_matmul" else "tgmm", str(groups), dtype_name,
                     pattern, step_name, f"{best[0] * 1e3:.3g}", f"{best[1] * 1e3:.3g}",
                     f"{best[0] / best[1]:.2f}x", changed])
    return rows


def run_tuning(args: argparse.Namespace) -> int:
    console = _tables.console()
    reps = args.reps or (3 if args.quick else 5)
    draws = args.draws or (1 if args.quick else 2)
    m, k, n = args.shape or ((2048, 512, 512) if args.quick else (4096, 1024, 1024))
    groups = args.groups or ([8, 64] if args.quick else [8, 64, 256])
    out_dtype = args.out_dtype
    table = tuning.load(args.tuning_table) if args.tuning_table else None
    device = jax.devices()[0].device_kind
    source = str(args.tuning_table) if table else f"the table shipped for {device!r}"
    cases = [(op, count, dtype_name) for op in args.ops for dtype_name in args.dtypes
             for count in groups]
    with console.status("finding the table's entries for each case"):
        cases, skipped = covered_cases(cases, m, k, n, table or _table.shipped(device), source,
                                       args.platform, out_dtype)
    if skipped:
        console.print(skipped, soft_wrap=True)  # one line, as the terminal wraps it
    rows = []
    for op, count, dtype_name in cases:
        for pattern in PATTERNS:
            with console.status(f"{op} {count} groups {dtype_name} {pattern}"):
                rows += measure(op, m, k, n, count, dtype_name, pattern, table, reps,
                                draws, args.platform, out_dtype)
    results = "float32 results (the ops' default)" if out_dtype is None else f"{out_dtype} results"
    header = _tables.run_header(
        "tuning", f"{m}x{k}x{n}, {results}, tuned: {source}; best of {draws} input draws, "
        f"median of {reps} turns each")
    _tables.report(console, header, COLUMNS, rows, args.out, NOTES)
    return 0
