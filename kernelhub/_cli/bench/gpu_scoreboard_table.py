"""A tuning table from a scoreboard run: what each GPU kernel measured at the scoreboard's
shapes, with the tiling it ran, so that a plain call on that GPU lowers the kernel measured
faster for it (docs/dispatch.md, "Per call").

The scoreboard times each pass as one kernel call; a table entry is filed by op, pass and the
kernel's problem (kernelhub/_grouped_matmul/tables.py). Tracing the scoreboard's calls and a
training step's (forward and both gradients, of gmm and of tgmm) under a recorder gives every
key; a key gets an entry where its kernel's problem is one the scoreboard measured. An entry's
time is the mean over the balanced and skewed rows. A run with rows under the heuristic
(KERNELHUB_GPU_HEURISTIC_ROWS=1) beside those under a tuned table gives each pass two tilings
timed in one process: the entry keeps the tuned one only where it ran faster by more than
MIN_GAIN, which checks a tune by an independent measurement (table()). Nothing is tuned here:
`kernelhub tune` does that.

    python -m kernelhub._cli.bench.gpu_scoreboard_table benchmarks/gpu/<run>/roofline.json \
        --over-shipped --output kernelhub/tuning/defaults/<device kind>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import kernelhub
import kernelhub.tuning
from kernelhub._cli.bench import gpu_scoreboard_calls
from kernelhub._cli.bench.gpu_measurement import SHAPES, Shape
from kernelhub._cli.bench.gpu_roofline import PASSES
from kernelhub._grouped_matmul import active_table
from kernelhub._grouped_matmul.passes import KernelCall
from kernelhub._grouped_matmul.tables import Entry, Tuning, TuningKey, _file_name
from kernelhub.tuning._autotune import Recorder

# The GPU kernels' platforms; on a CPU host the same kernels trace as their interpreters,
# whose problems and heuristics are the compiled kernels' (only the implementation's name
# differs, "-interpret").
PLATFORMS = ("triton", "mosaic")
_INTERPRETED = "-interpret"
HEURISTIC = gpu_scoreboard_calls.HEURISTIC
# How much faster than the heuristic's tiling another must run to replace it (autotune's).
MIN_GAIN = 0.03


def recorded(fn: Callable[..., Any], *args: Any) -> list[KernelCall]:
    """The kernel calls `fn` makes for `args` (traced, not run), each with its problem."""
    recorder = Recorder()
    with active_table.activated(recorder):
        jax.eval_shape(fn, *args)
    return list(recorder.calls.values())


def _abstract(args: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)


def _scoreboard_arguments(shape: Shape, pass_name: str) -> tuple[Any, ...]:
    """The abstract operands the scoreboard gives kernelhub in `pass_name`, bf16 (no arrays
    are made: the shapes are the GPU's, far over a CPU's patience)."""
    m, k, n, g = shape.m, shape.k, shape.n, shape.local
    x, w, dy = (jax.ShapeDtypeStruct(dims, jnp.bfloat16) for dims in ((m, k), (g, k, n), (m, n)))
    sizes = jax.ShapeDtypeStruct((shape.experts,), jnp.int32)
    return (*gpu_scoreboard_calls.kernelhub_operands(x, w, dy, pass_name), sizes)


def _training_step(op: str, shape: Shape, platform: str) -> tuple[Callable[..., Any], tuple]:
    """A loss's gradient through one call of `op`, as an MoE layer trains it (bf16 results)."""
    call = kernelhub.get(op, platform=platform)
    sharded = {} if shape.local == shape.experts else {"group_offset": shape.offset}
    if op == "grouped_matmul":
        args = ((shape.m, shape.k), (shape.local, shape.k, shape.n))
    else:
        args = ((shape.k, shape.m), (shape.m, shape.n))
        if sharded:
            sharded["num_actual_groups"] = shape.local

    def loss(lhs, rhs, group_sizes):
        out = call(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16, **sharded)
        return jnp.sum(out.astype(jnp.float32))

    arrays = tuple(jax.ShapeDtypeStruct(a, jnp.bfloat16) for a in args)
    sizes = jax.ShapeDtypeStruct((shape.experts,), jnp.int32)
    return jax.grad(loss, argnums=(0, 1)), (*arrays, sizes)


def _compiled_name(implementation: str) -> str:
    return implementation.removesuffix(_INTERPRETED)


def _left_out(row: dict[str, Any], without: tuple[tuple[str, str, str], ...]) -> bool:
    """Whether `without` names the row's kernel (its rows under the heuristic too)."""
    kernel = "kernelhub:" + _parsed(row["implementation"])[0]
    return any(kernel == implementation and shape in ("*", row["shape"])
               and pass_name in ("*", row["pass"]) for implementation, shape, pass_name in without)


def _parsed(implementation: str) -> tuple[str, bool]:
    """(platform, whether the row ran under the heuristic) of a kernelhub row's name."""
    platform = implementation.split(":", 1)[1]
    return platform.removesuffix(HEURISTIC), platform.endswith(HEURISTIC)


def table(document: dict[str, Any], shapes: tuple[Shape, ...] = SHAPES,
          without: tuple[tuple[str, str, str], ...] = ()) -> Tuning:
    """The entries a scoreboard document (roofline.json) gives its GPU's kernels, each with the
    tiling its rows ran (their `tilings`; in a file older than that field, the heuristic's of
    today), but for the rows that `without`'s (implementation, shape, pass) triples name ("*"
    for any shape or pass). Where a kernel also has rows under the heuristic
    (`kernelhub:<platform>@heuristic`, a run with KERNELHUB_GPU_HEURISTIC_ROWS=1) and they ran
    another tiling than the table's, the entry takes the faster of the two, the heuristic's
    unless the other is faster by more than MIN_GAIN (the tuner's rule), and records both."""
    device = document["gpu"]
    # platform -> (shape, pass) -> tiling (None: not recorded) -> ms of each row
    times: dict[str, dict[tuple[str, str], dict[Any, list[float]]]] = {}
    heuristic_ran: dict[str, dict[tuple[str, str], tuple[int, ...]]] = {}
    for row in document["rows"]:
        if row["dtype"] == "bf16" and row["seconds"] is not None and \
                row["implementation"].startswith("kernelhub:") and not _left_out(row, without):
            platform, under_heuristic = _parsed(row["implementation"])
            where = (row["shape"], row["pass"])
            # A pass is one kernel call: its first tiling.
            tiling = tuple(row["tilings"][0]["tiling"]) if row.get("tilings") else None
            times.setdefault(platform, {}).setdefault(where, {}).setdefault(
                tiling, []).append(row["seconds"] * 1e3)
            if under_heuristic and tiling is not None:
                heuristic_ran.setdefault(platform, {})[where] = tiling
    entries: dict[TuningKey, Entry] = {}
    for platform in PLATFORMS:
        for shape in shapes:
            # The problem each of the scoreboard's passes ran: its entry.
            by_problem = {}
            for pass_name in PASSES:
                where = (shape.name, pass_name)
                measured = times.get(platform, {}).get(where)
                if not measured:
                    continue
                op = gpu_scoreboard_calls.PASS_OP[pass_name]
                fn = gpu_scoreboard_calls._pass_function(
                    kernelhub.get(op, platform=platform), pass_name, shape)
                (call,) = recorded(fn, *_scoreboard_arguments(shape, pass_name))
                default = heuristic_ran.get(platform, {}).get(where) or tuple(
                    call.space.default(call.kernel_problem))
                by_problem[call.problem] = _entry(measured, default, document)
            for op in ("grouped_matmul", "transposed_grouped_matmul"):
                step, step_args = _training_step(op, shape, platform)
                for call in recorded(step, *step_args):
                    if call.problem in by_problem:
                        key = TuningKey.of(device, _compiled_name(call.space.implementation),
                                           call.op, call.pass_name, call.problem)
                        entries[key] = by_problem[call.problem]
    return Tuning(entries, f"the scoreboard of {document['date'][:10]} on {device}")


def _entry(measured: dict[Any, list[float]], default: tuple[int, ...],
           document: dict[str, Any]) -> Entry:
    """One pass's entry from its rows' ms by the tiling they ran (None: the heuristic's)."""
    pooled: dict[tuple[int, ...], list[float]] = {}
    for tiling, ms in measured.items():
        pooled.setdefault(default if tiling is None else tiling, []).extend(ms)
    means = {tiling: statistics.fmean(ms) for tiling, ms in pooled.items()}
    groups = (f"the scoreboard of {document['date'][:10]} (jax {document['jax']}): "
              f"the mean of its balanced and skewed rows")
    candidates = tuple(sorted(means.items(), key=lambda item: item[1]))
    if default not in means:  # only the table's tiling ran: it is all there is to file
        tiling, ms = candidates[0]
        return Entry(tiling, tiling, ms, ms, groups, candidates)
    best, best_ms = candidates[0]
    default_ms = means[default]
    if best_ms * (1 + MIN_GAIN) < default_ms:
        return Entry(best, default, best_ms, default_ms, groups, candidates)
    return Entry(default, default, default_ms, default_ms, groups, candidates)


def completed(tuned: Tuning, shapes: tuple[Shape, ...] = SHAPES) -> Tuning:
    """`tuned` with an entry for every key a training step of either op looks up at `shapes`
    whose kernel problem one of its entries has under another op or pass (tgmm's forward is
    gmm's weight gradient): `kernelhub tune --ops gmm` then serves both ops, in half the time."""
    by_problem = {(key.device_kind, key.implementation, key.problem): entry
                  for key, entry in tuned.entries.items()}
    devices = {key.device_kind for key in tuned.entries}
    entries = dict(tuned.entries)
    for shape in shapes:
        for platform in PLATFORMS:
            for op in ("grouped_matmul", "transposed_grouped_matmul"):
                step, step_args = _training_step(op, shape, platform)
                for call in recorded(step, *step_args):
                    implementation = _compiled_name(call.space.implementation)
                    for device in devices:
                        key = TuningKey.of(device, implementation, call.op, call.pass_name,
                                           call.problem)
                        entry = by_problem.get((device, implementation, key.problem))
                        if entry is not None and key not in entries:
                            entries[key] = entry
    return Tuning(entries, tuned.source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roofline", type=Path, nargs="?",
                        help="a scoreboard run's roofline.json")
    parser.add_argument("--complete", type=Path, metavar="TABLE",
                        help="instead: add to a tuned table (kernelhub tune --output) the keys "
                             "of the other op whose kernel problems it has (completed())")
    parser.add_argument("--over-shipped", action="store_true",
                        help="keep the shipped table's entries for the table's GPU where the "
                             "made one has none (the file to ship)")
    parser.add_argument("--without", nargs="+", default=[],
                        metavar="IMPLEMENTATION@SHAPE[:PASS]",
                        help="rows to leave out, e.g. kernelhub:mosaic@gpt-oss or "
                             "kernelhub:triton@*:rhs_gradient ('*': every shape): a kernel whose "
                             "heuristic tiling changed after the run, where the file does not "
                             "hold the rows' tilings or the new tiling is the one wanted")
    parser.add_argument("--output", type=Path,
                        help="where to write the table (default: the file name that "
                             "kernelhub/tuning/defaults gives the run's GPU, in this folder; "
                             "with --complete, the table itself)")
    args = parser.parse_args(argv)
    if (args.roofline is None) == (args.complete is None):
        parser.error("give a roofline.json or --complete TABLE")
    if args.complete is not None:
        before = kernelhub.tuning.load(args.complete)
        made = completed(before)
        if args.over_shipped:
            for device in sorted({key.device_kind for key in made.entries}):
                made = kernelhub.tuning.shipped(device).merged(made)
        output = args.output or args.complete
        made.save(output)
        print(f"{len(before)} entries tuned, {len(made)} in all, written to {output}")
        return 0
    document = json.loads(args.roofline.read_text())
    without = []
    for item in args.without:
        implementation, at, where = item.partition("@")
        shape, _, pass_name = where.partition(":")
        if not at or not implementation.startswith("kernelhub:") or not shape or \
                pass_name not in ("", "*", *PASSES):
            parser.error(f"--without takes kernelhub:<platform>@<shape>[:<pass>] (a pass of "
                         f"{', '.join(PASSES)}; '*' for any shape or pass), got {item!r}")
        without.append((implementation, shape, pass_name or "*"))
    made = table(document, without=tuple(without))
    if args.over_shipped:
        made = kernelhub.tuning.shipped(document["gpu"]).merged(made)
    output = args.output or Path(_file_name(document["gpu"]))
    made.save(output)
    print(f"{len(made)} entries for {document['gpu']} written to {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
