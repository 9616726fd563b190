"""`kernelhub bench --gpu --gpu-parts roofline`: the GPU scoreboard, every pass of every
implementation against the chip's roofline (gpu_roofline.py).

For each format (bf16, then fp8), shape, group-size pattern and pass, it makes one kernel call
per implementation (gpu_scoreboard_calls.py: kernelhub's platforms, cuBLAS dense, lax.ragged_dot,
tokamax's kernels), compiles them (several at once: compiling dominates the run), checks each
grouped result against a reference on the same operands, and times them in turns (timing.py).
Each row gets seconds, TFLOP/s, TB/s and its roofline fraction, or the reason it has none.

roofline.json, roofline.md and roofline.png are rewritten after every pass, so a run cut short
keeps what it measured; with a time budget the passes left get rows that say so.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import re
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from kernelhub._cli._group_sizes import PATTERNS, group_sizes
from kernelhub._cli.bench import gpu_roofline, gpu_scoreboard_calls, gpu_scoreboard_report, gpu_tokamax
from kernelhub._cli.bench.gpu_measurement import Shape
from kernelhub._cli.bench.gpu_roofline import PASSES, PassProblem
from kernelhub._cli.bench.timing import median_seconds

DTYPES = ("bf16", "fp8")
# A grouped result further than this from the reference's (max |difference| over max |value|)
# is named in its row's note: bf16 results of the same numbers differ by rounding only.
TOLERANCE = 5e-2
# The reference a pass's grouped results are compared with: the first of these that ran.
REFERENCES = ("kernelhub:xla", "lax.ragged_dot")


# Calls per timed sample, made back to back (timing.median_seconds): the roofline compares the
# device's time per call with the chip's limits, as published kernels' figures do, not one
# call's round trip from the host (its dispatch and the wait for its result: what the first
# four runs, to 2026-11-27, timed, and each row still records as `seconds_one_call`). Smoke mode takes the
# same path with fewer calls.
BACK_TO_BACK = 5
SMOKE_BACK_TO_BACK = 2


def folder_name(device_kind: str, date: datetime.date | None = None) -> str:
    """<date>-<gpu>, e.g. 2026-11-27-h100: where benchmarks/gpu keeps a run's files."""
    model = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", device_kind.upper())
    gpu = model.group(1).lower() if model else (
        re.sub(r"[^a-z0-9]+", "-", device_kind.lower()).strip("-") or "device")
    return f"{(date or datetime.date.today()).isoformat()}-{gpu}"


def run_scoreboard(out: Path, shapes: tuple[Shape, ...], dtypes: tuple[str, ...], reps: int,
                   warmup: int, smoke: bool, budget: float | None = None,
                   only: tuple[str, ...] | None = None, compile_threads: int = 4,
                   exclude: tuple[str, ...] = (), merge: bool = False,
                   heuristic_rows: bool = False) -> dict[str, Any]:
    """Measures every row, writing the files into `out` as it goes; returns the document.
    `only` keeps the implementations it names, `exclude` leaves those out. With `merge` the
    rows of `out`'s roofline.json stay, but for the problems and implementations measured
    now: a second process adds its implementations to the first's table (gpu_bench.sh runs
    the Mosaic GPU kernels so, where a fault in one cannot cost the other rows). With
    `heuristic_rows` each tabled kernel also runs under the heuristic (gpu_scoreboard_calls)."""
    started = time.monotonic()
    back_to_back = SMOKE_BACK_TO_BACK if smoke else BACK_TO_BACK
    earlier = _earlier_rows(out) if merge else []
    device_kind = jax.devices()[0].device_kind
    peak = gpu_roofline.peak_for(device_kind)
    peak_named = None if peak is None else f"{peak.name} (spec sheet)"
    if peak is None:
        # Smoke mode on a CPU, or a GPU without a spec line: the fractions need some peak, and
        # the report says which one stood in.
        peak = gpu_roofline.PEAKS[0]
        peak_named = f"{peak.name} (stand-in: no spec peak for {device_kind!r})"
    tokamax_names = gpu_tokamax.IMPLEMENTATIONS + ((gpu_tokamax.SMOKE_STAND_IN,) if smoke else ())
    tokamax, tokamax_missing = gpu_tokamax.load()
    document = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "gpu": device_kind,
        "jax": jax.__version__,
        "peak": {**peak.record(), "named": peak_named},
        "tokamax": gpu_tokamax.version(tokamax) if tokamax else tokamax_missing,
        "timing": (f"median of up to {reps} turns after compile + {warmup} warm-up calls, "
                   f"each turn {back_to_back} calls back to back over their number (the "
                   "device's time per call), implementations timed in turns in one process"),
        "mode": "smoke (interpret mode, tiny shapes: not a measurement)" if smoke else "full",
        "implementations": ("all" if only is None else list(only)) if not exclude else {
            "of": "all" if only is None else list(only), "excluding": list(exclude)},
        "rows": [],
    }
    if merge:
        document["merged"] = "rows of implementations measured in another process are kept"
    out.mkdir(parents=True, exist_ok=True)
    compiled: dict[Any, Any] = {}
    for dtype in dtypes:
        for shape in shapes:
            for pattern in PATTERNS:
                operands = None
                for pass_name in PASSES:
                    problem = _problem(shape, pattern, pass_name, dtype)
                    spent = time.monotonic() - started
                    if budget is not None and spent > budget:
                        note = f"not measured: the run's time budget of {budget:.0f} s was spent"
                        document["rows"] += [
                            gpu_roofline.row(shape.name, pattern, problem, name, default, peak,
                                             None, note)
                            for name, default in gpu_scoreboard_calls.implementation_names(
                                pass_name, dtype, tokamax_names, only, heuristic_rows)
                            if name not in exclude]
                        continue
                    operands = operands or gpu_scoreboard_calls.make_operands(shape, pattern)
                    calls = [call for call in gpu_scoreboard_calls.calls(
                        operands, pass_name, dtype, tokamax_names, only, heuristic_rows)
                        if call.implementation not in exclude]
                    for call, seconds, note, one_call in measure(
                            calls, reps, warmup, compiled, (shape.name, pass_name, dtype),
                            compile_threads, back_to_back):
                        record = gpu_roofline.row(shape.name, pattern, problem,
                                                  call.implementation, call.default, peak,
                                                  seconds, note, call.tilings, one_call)
                        document["rows"].append(record)
                        print(gpu_scoreboard_report.one_line(record), flush=True)
                    # How long a pass takes (compiling, mostly) sizes the next run's budget.
                    print(f"  [{time.monotonic() - started:.0f} s]", flush=True)
                    write(out, _merged(earlier, document))
    document = _merged(earlier, document)
    write(out, document, plot=True)
    return document


def _row_key(row: dict[str, Any]) -> tuple:
    return (row["dtype"], row["shape"], row["groups"], row["pass"], row["implementation"])


def _earlier_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "roofline.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def _merged(earlier: list[dict[str, Any]], document: dict[str, Any]) -> dict[str, Any]:
    """`document` with the earlier rows that none of its own replaces, earlier first. A row
    without a time (its run's budget was spent) replaces no measured row: the second process
    running out of time must not erase what the first measured."""
    if not earlier:
        return document
    measured_before = {_row_key(row) for row in earlier if row["seconds"] is not None}
    own = [row for row in document["rows"]
           if row["seconds"] is not None or _row_key(row) not in measured_before]
    replaced = {_row_key(row) for row in own}
    kept = [row for row in earlier if _row_key(row) not in replaced]
    return {**document, "rows": kept + own}


def _problem(shape: Shape, pattern: str, pass_name: str, dtype: str) -> PassProblem:
    sizes = group_sizes(shape.m, shape.experts, pattern)
    rows = int(sizes[shape.offset: shape.offset + shape.local].sum())
    return PassProblem(pass_name, shape.m, shape.k, shape.n, rows, shape.local, dtype)


def write(out: Path, document: dict[str, Any], plot: bool = False) -> None:
    (out / "roofline.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "roofline.md").write_text(gpu_scoreboard_report.markdown(document))
    if plot and not gpu_scoreboard_report.plot(document, out / "roofline.png"):
        print("no roofline.png: matplotlib (the plot extra) is not installed")


# ---------------------------------------------------------------- one pass's calls


def measure(calls: list[gpu_scoreboard_calls.Call], reps: int, warmup: int,
            compiled: dict[Any, Any], key: tuple, threads: int, back_to_back: int = 1
            ) -> list[tuple[gpu_scoreboard_calls.Call, float | None, str | None,
                            float | None]]:
    """Each call's median seconds per call of `back_to_back` made in a row (timing's
    median_seconds), its note (why it has no time; what its checks found), and its median
    seconds of one call waited for alone (None where back_to_back is 1: the same)."""
    notes: dict[str, list[str]] = {call.implementation: [call.note] if call.note else []
                                   for call in calls}
    runnable = _compiled(calls, compiled, key, threads, notes)
    thunks: dict[str, Any] = {}
    reference = next((c for name in REFERENCES for c in calls
                      if c.implementation == name and c.implementation in runnable), None)
    expected = None
    ordered = ([reference] if reference else []) + [c for c in calls if c is not reference]
    for call in ordered:
        if call.implementation not in runnable:
            continue
        executable = runnable[call.implementation]
        try:
            result = jax.block_until_ready(executable(*call.args))
        except Exception as error:  # noqa: BLE001 - out of memory, say: the row says why
            notes[call.implementation].append(f"failed to run: {_reason(error)}")
            continue
        if call.cut is not None:
            if call is reference:
                expected = call.cut(result)
                notes[call.implementation].append("the reference of the agreement checks")
            elif expected is not None:
                error = relative_error(call.cut(result), expected)
                verdict = "agrees with" if error <= TOLERANCE else "DIFFERS from"
                notes[call.implementation].append(
                    f"{verdict} {reference.implementation} ({error:.1e})")
        del result
        if call.check is not None:
            notes[call.implementation].append(call.check())
        thunks[call.implementation] = (lambda e=executable, a=call.args: e(*a))
    expected = None
    seconds = median_seconds(thunks, reps, warmup, back_to_back) if thunks else {}
    one_call = median_seconds(thunks, reps, 0) if thunks and back_to_back > 1 else {}
    for name in thunks:
        if seconds.get(name) is None:
            notes[name].append("failed while timed (its error is in the log)")
    return [(call, seconds.get(call.implementation),
             "; ".join(n for n in notes[call.implementation] if n) or None,
             one_call.get(call.implementation)) for call in calls]


def _compiled(calls, compiled: dict[Any, Any], key: tuple, threads: int,
              notes: dict[str, list[str]]) -> dict[str, Any]:
    """Each call's executable, compiled once per implementation, pass and argument types (the
    group sizes are data, so both patterns of a shape share one), several at a time."""
    runnable: dict[str, Any] = {}
    lowered = {}
    for call in calls:
        if call.fn is None:
            continue
        cache_key = (call.implementation, *key, _types(call.args))
        if cache_key in compiled:
            runnable[call.implementation] = compiled[cache_key]
            continue
        try:  # tracing and lowering stay on this thread; XLA's compiling runs in parallel
            lowered[call.implementation] = (cache_key, call.fn.lower(*call.args))
        except Exception as error:  # noqa: BLE001 - the row says why
            notes[call.implementation].append(f"failed to lower: {_reason(error)}")

    def compile_one(item):
        return item[0], item[1].compile()

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        futures = {pool.submit(compile_one, item): name for name, item in lowered.items()}
        for future, name in futures.items():
            try:
                cache_key, executable = future.result()
            except Exception as error:  # noqa: BLE001 - the row says why
                notes[name].append(f"failed to compile: {_reason(error)}")
                continue
            compiled[cache_key] = runnable[name] = executable
    return runnable


def _types(args: tuple) -> str:
    leaves, tree = jax.tree.flatten(args)
    return str(tree) + str([(tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves])


@jax.jit
def _error(actual: jax.Array, expected: jax.Array) -> jax.Array:
    # Fused reductions: no float32 copy of a large result is made.
    difference = jnp.max(jnp.abs(actual.astype(jnp.float32) - expected.astype(jnp.float32)))
    return difference / jnp.maximum(jnp.max(jnp.abs(expected.astype(jnp.float32))), 1e-30)


def relative_error(actual: jax.Array, expected: jax.Array) -> float:
    """max |actual - expected| / max |expected|."""
    if actual.shape != expected.shape:
        return float("inf")
    return float(_error(actual, expected))


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"
