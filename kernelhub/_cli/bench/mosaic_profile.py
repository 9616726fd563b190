"""Where the Mosaic GPU kernels spend their time: one call of each pass at the scoreboard's
shapes with Mosaic GPU's on-device profiler on (kernelhub/_pallas/mosaic_gpu/profiling.py),
its traces summed into profile.md.

    python -m kernelhub._cli.bench.mosaic_profile --shapes deepseek-v3 qwen3-moe --out DIR

Every pass runs the heuristic's tiling, not a table's, so that the forward and its probes
share one tiling; the probes below that name a tiling run it.
For each pass, per warpgroup and then averaged: the kernel's span, the work items it ran, the
share of the span in each region (sums: a work item's pipeline; step: the wgmma issued and the
previous one waited for; store: epilogue and TMA store), and the time between steps, which is
the wait for a step's tiles. Eleven probes beside the passes:
- `forward_k_major`: the forward with the weights stored [G, n, k] (transpose_rhs=True), whether
  its loads go faster in that layout, where each weight tile's rows run along the contraction;
- `forward_banded`: the forward in bands of grouped_matmul.BAND n-tiles even where a group's
  rows fit one row tile, where the schedule now spans whole rows (band_width): the schedule
  before 2026-11-28 (at DeepSeek-V3 half of each weight row, 8 of 16 tiles, at once), so that
  the profile keeps measuring that choice (whole rows 557 us, bands 637, on the H100);
- `forward_warp_specialized`: the forward in the tables' warp-specialized tiling (a memory
  warpgroup loading for two compute warpgroups, whose regions are the ones profiled);
  `forward_warp_specialized_float32` the same with a float32 output, which that tiling
  stores from 64-row pieces of each accumulator (shared_memory.output_tile_rows): against the bf16
  probe, what storing a piece after another costs (its TB/s counts the wider output);
- `rhs_gradient_spans`: the weight gradient summing spans of 8 groups in one pipeline
  (group_spans.py), where a per-group pipeline of one chunk overlaps nothing (there a step
  holds its group's store, when it ends one);
- `rhs_gradient_warp_specialized`: the weight gradient in 128 x 128 tiles of two compute
  warpgroups of 64 columns and a memory warpgroup (tgmm_warp_specialized.py), 4 stages: the
  next tile's loads start while a tile is stored, where one or two chunks a tile leave the
  per-group pipeline nothing to overlap (what two programs per SM do for the heuristic);
- `forward_deep`, `forward_wide`, `forward_two_per_sm`: the forward in the heuristic's tiling
  at both fine-grained shapes (64 x 128 outputs, 64 of contraction a step, 4 stages) with one
  change each: 8 stages, 256 columns, or 3 stages in each of two programs per SM. The
  forwards wait between steps for 84-89% of their span and move 1.6-1.9 TB/s where XLA reads
  2.3-2.6 (H100, 2026-11-28): whether more bytes in flight per SM (deeper, or a second
  program's loads) or longer runs of each weight row per load (256 columns: 512 contiguous
  bytes a row of a tile, against 256) move them faster. (The padded-strides probes, which
  refuted power-of-two strides as the cause on 2026-11-28, gave them their place.)
- `forward_spread_fills`, `lhs_gradient_spread_fills`: the pass with the visits that write
  zeros (the rows of other experts, at DeepSeek-V3 14336 of 16384) spread among the computing
  ones (visits.SPREAD_FILLS), so that the zeros' writes share time with the weights' reads
  rather than taking a phase of their own (17% of the lhs gradient's span on the H100).
Each row also gives the pass's compulsory bytes (gpu_roofline.py) over its span, in TB/s.
Beside them, per shape, the rates at which XLA reads the local experts' weights once (a max
over them) and writes as many bytes (the weight gradient's output is that size): what this
GPU streams where nothing else is asked of it, against which each pass's own TB/s read. GPU
only: the profile buffer is read back through a host callback, which a cross-platform export
cannot lower.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kernelhub._cli.bench.gpu_roofline import OUT_BYTES, PassProblem
from kernelhub._pallas.mosaic_gpu import profiling
from kernelhub._pallas.mosaic_gpu.block_rules import HOPPER_SMS

# The forward probes that run a tiling of their own: the tables' warp-specialized forward at
# DeepSeek-V3 and Mixtral (128 x 256 output tiles, two compute warpgroups of 128 columns,
# 3 stages), and the heuristic's at the fine-grained shapes (64, 64, 128, 4) with one change.
TILED_FORWARDS = {"forward_warp_specialized": (128, 64, 256, 3, 2),
                  "forward_warp_specialized_float32": (128, 64, 256, 3, 2),
                  "forward_deep": (64, 64, 128, 8),
                  "forward_wide": (64, 64, 256, 4),
                  "forward_two_per_sm": (64, 64, 128, 3, 1, 1, 0, 2)}
# Probes whose output is not the scoreboard's bf16.
PROBE_OUTPUTS = {"forward_warp_specialized_float32": "float32"}

def region_times(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per trace (`tid`, one warpgroup): its span (first begin to last end, us) and, per
    region name, how many times it ran, its total time, and for `step` the time between one
    step's end and the next one's start within the same work item (`between_steps`)."""
    by_trace: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_trace[event["tid"]].append(event)
    result = {}
    for tid, trace in by_trace.items():
        trace.sort(key=lambda e: e["ts"])
        open_at: dict[str, list[float]] = defaultdict(list)
        totals: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        between = 0.0
        last_step_end = None
        for event in trace:
            name = event["name"]
            if event["ph"] == "B":
                open_at[name].append(event["ts"])
                if name == profiling.SUMS:
                    last_step_end = None  # a new work item: no wait between its items
                elif name == profiling.STEP and last_step_end is not None:
                    between += event["ts"] - last_step_end
            elif open_at[name]:
                totals[name] += event["ts"] - open_at[name].pop()
                counts[name] += 1
                if name == profiling.STEP:
                    last_step_end = event["ts"]
        span = trace[-1]["ts"] - trace[0]["ts"] if trace else 0.0
        result[tid] = dict(span=span, totals=dict(totals), counts=dict(counts),
                           between_steps=between)
    return result


def summary(per_trace: dict[int, dict[str, Any]]) -> dict[str, float]:
    """The means over warpgroups that ran at least one work item."""
    busy = [t for t in per_trace.values() if t["counts"].get(profiling.SUMS)]
    if not busy:
        return {}

    def mean(value):
        return statistics.fmean(value(t) for t in busy)

    items = mean(lambda t: t["counts"][profiling.SUMS])
    steps = mean(lambda t: t["counts"].get(profiling.STEP, 0))
    span = mean(lambda t: t["span"])
    out = dict(warpgroups=len(busy), span_us=span, items=items, steps=steps,
               us_per_item=span / items if items else math.nan)
    for name in profiling.REGIONS:
        out[f"{name}_share"] = mean(lambda t, n=name: t["totals"].get(n, 0.0) / t["span"]
                                    if t["span"] else 0.0)
    out["between_steps_share"] = mean(lambda t: t["between_steps"] / t["span"]
                                      if t["span"] else 0.0)
    return out


def report(rows: list[tuple[str, str, dict[str, float] | str]],
           streams: dict[str, float] | None = None) -> str:
    """profile.md: a row per pass (its tiling, its regions' shares) and, per shape in
    `streams`, XLA's rates reading the weights and writing as many bytes (TB/s)."""
    lines = ["# Mosaic GPU kernels: where a pass's time goes (on-device profiler)", "",
             "Per warpgroup, averaged over those that ran work: the kernel's span, work items "
             "and pipeline steps, and the share of the span in each region. `sums` holds "
             "the steps and the waits between them; `store` is the epilogue and TMA store; "
             "what is left is the persistent loop between items. TB/s: the pass's "
             "compulsory bytes over the span.", "",
             "| shape | pass | tiling | warpgroups | span us | TB/s | items | us per item | "
             "steps | sums | step | between steps | store |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shape, pass_name, found in rows:
        if isinstance(found, str):
            lines.append(f"| {shape} | {pass_name} | {found} |" + " |" * 10)
            continue
        tiling = "x".join(str(t) for t in found.get("tiling", ())) or "?"
        lines.append(
            f"| {shape} | {pass_name} | {tiling} | {found['warpgroups']} | "
            f"{found['span_us']:.0f} | {found.get('tbps', math.nan):.2f} | "
            f"{found['items']:.1f} | {found['us_per_item']:.2f} | "
            f"{found['steps']:.0f} | {found['sums_share']:.2f} | {found['step_share']:.2f} | "
            f"{found['between_steps_share']:.2f} | {found['store_share']:.2f} |")
    if streams:
        lines += ["", "XLA reading the local experts' weights once (a max over them) and "
                  "writing as many bytes (a filled array of their shape, as the weight "
                  "gradient writes), device time per call: what HBM gives a plain stream "
                  "here.", "",
                  "| shape | weights MB | read TB/s | write TB/s |", "|---|---:|---:|---:|"]
        lines += [f"| {shape} | {megabytes:.0f} | {read:.2f} | {write:.2f} |"
                  for shape, (megabytes, read, write) in streams.items()]
    return "\n".join(lines) + "\n"


def weight_stream(w: Any, repeats: int = 10) -> tuple[float, float, float]:
    """(megabytes, read TB/s, write TB/s) of XLA reading `w` once (a max over it) and writing
    as many bytes (an array of `w`'s shape filled with one traced value, as tgmm writes its
    [G, k, n] output): each the device's time per call, 5 calls back to back (timing.py),
    median of `repeats`."""
    import jax
    import jax.numpy as jnp

    from kernelhub._cli.bench.timing import median_seconds

    read = jax.jit(lambda w: jnp.max(w))
    write = jax.jit(lambda value: jnp.full(w.shape, value, w.dtype))
    value = jnp.asarray(1.0, w.dtype)
    seconds = median_seconds({"read": lambda: read(w), "write": lambda: write(value)},
                             repeats, warmup=1, calls_per_sample=5)
    size = w.size * w.dtype.itemsize
    return (size / 1e6, *(size / seconds[name] / 1e12 if seconds[name] else math.nan
                          for name in ("read", "write")))


def regions_for(shape: Any, pass_name: str, kernel: str, tiling: list[int]) -> int:
    """An upper bound of the regions one program enters in a pass at balanced sizes, from the
    tiling its kernel runs: work items per program times the regions of one item (its
    pipeline, its steps, its stores). The buffer takes 16 bytes a region of shared memory
    beside the kernel's; where that is too much, compiling says so (a program entering more
    regions than its buffer holds would overwrite the kernel's shared memory instead)."""
    block_m, block_k, block_n = tiling[:3]
    programs = HOPPER_SMS * (tiling[7] if len(tiling) == 8 else 1)
    if kernel == "tgmm":
        # A work item sums `span` groups: per group its chunks (one more where a group's rows
        # straddle a chunk boundary) and a store.
        span = tiling[5] if len(tiling) >= 6 else 1
        items = (math.ceil(shape.local / span) * math.ceil(shape.k / block_k)
                 * math.ceil(shape.n / block_n))
        per_item = 1 + span * (math.ceil(shape.m / shape.experts / block_m) + 2)
    else:
        forward = pass_name.startswith("forward")
        columns = shape.n if forward else shape.k
        contraction = shape.k if forward else shape.n
        # Only the local groups' visits enter regions (a visit of other rows stores zeros,
        # outside them); a group's rows take at most two visits more than their row tiles.
        local_rows = shape.m * shape.local // shape.experts
        items = ((math.ceil(local_rows / block_m) + 2 * shape.local)
                 * math.ceil(columns / block_n))
        per_item = 2 + math.ceil(contraction / block_k)
    return math.ceil(items / programs) * per_item + 32


def run(shapes: list[str], passes: list[str], out: Path) -> str:
    import jax

    from kernelhub._cli.bench import gpu_scoreboard_calls as calls
    from kernelhub._cli.bench.gpu_measurement import SHAPES
    from kernelhub.tuning import heuristic

    rows = []
    streams = {}
    for shape in (s for s in SHAPES if s.name in shapes):
        ops = calls.make_operands(shape, "balanced")
        streams[shape.name] = weight_stream(ops.w)
        for pass_name in passes:
            args, make = _pass(ops, shape, pass_name)
            folder = out / f"{shape.name}-{pass_name}"
            folder.mkdir(parents=True, exist_ok=True)
            started = time.time()
            try:
                # Under the heuristic: the forward and its probes in one tiling (a probe
                # that names its own runs that).
                with heuristic(), schedule_knob(pass_name):
                    (ran,) = calls.kernel_tilings(make(), args)
                    ran["tiling"] = list(explicit_tiling(shape, pass_name) or ran["tiling"])
                    regions = regions_for(shape, pass_name, ran["kernel"], ran["tiling"])
                    with profiling.profiled(str(folder), regions):
                        fn = make()  # traced and lowered in here
                        jax.block_until_ready(fn(*args))
                jax.effects_barrier()
                traces = [p for p in folder.iterdir() if p.suffix == ".json"
                          and p.stat().st_mtime >= started - 1]
                events = [e for p in traces for e in json.loads(p.read_text())["traceEvents"]]
                found = summary(region_times(events)) or "no events recorded"
                if isinstance(found, dict):
                    found["tiling"] = tuple(ran["tiling"])
                    found["tbps"] = (compulsory_bytes(shape, ops.rows, pass_name)
                                     / (found["span_us"] * 1e-6) / 1e12)
            except Exception as error:  # noqa: BLE001 - the row says why
                found = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
            rows.append((shape.name, pass_name, found))
            print(rows[-1], flush=True)
    return report(rows, streams)


# The pass each probe is a form of (its roofline's bytes).
PROBE_PASS = {"forward_k_major": "forward", "forward_banded": "forward",
              **dict.fromkeys(TILED_FORWARDS, "forward"),
              "forward_spread_fills": "forward", "lhs_gradient_spread_fills": "lhs_gradient",
              "rhs_gradient_spans": "rhs_gradient",
              "rhs_gradient_warp_specialized": "rhs_gradient"}


def compulsory_bytes(shape: Any, rows: int, pass_name: str) -> float:
    """The bytes the roofline has the pass move (gpu_roofline.py), bf16, at `shape` with
    `rows` computed rows."""
    problem = PassProblem(PROBE_PASS.get(pass_name, pass_name), shape.m, shape.k, shape.n,
                          rows, shape.local, "bf16")
    # The forward probes' wider outputs: every one of the m x n elements written once.
    wider = (np.dtype(PROBE_OUTPUTS[pass_name]).itemsize - OUT_BYTES
             if pass_name in PROBE_OUTPUTS else 0)
    return problem.compulsory_bytes + wider * shape.m * shape.n


def _pass(ops: Any, shape: Any, pass_name: str, platform: str = "mosaic"
          ) -> tuple[tuple, Any]:
    """(arguments, a maker of the jitted call) of one pass or probe on `platform` (the
    profiler's is Mosaic GPU; kernel_counters.py also makes the Triton kernels' passes)."""
    import jax
    import jax.numpy as jnp

    import kernelhub
    from kernelhub._cli.bench import gpu_scoreboard_calls as calls

    if pass_name in ("rhs_gradient_spans", "rhs_gradient_warp_specialized"):
        call = kernelhub.get("transposed_grouped_matmul", platform="mosaic")
        return (ops.x, ops.dy, ops.sizes), lambda: jax.jit(lambda x, dy, s: call(
            x.T, dy, s, preferred_element_type=calls.OUT, group_offset=shape.offset,
            num_actual_groups=shape.local, tiling=explicit_tiling(shape, pass_name)))
    if pass_name in TILED_FORWARDS:
        call = kernelhub.get("grouped_matmul", platform="mosaic")
        out = PROBE_OUTPUTS.get(pass_name, calls.OUT)
        return (ops.x, ops.w, ops.sizes), lambda: jax.jit(lambda x, w, s: call(
            x, w, s, preferred_element_type=out, group_offset=shape.offset,
            tiling=explicit_tiling(shape, pass_name)))
    if pass_name in ("forward_banded", "forward_spread_fills", "lhs_gradient_spread_fills"):
        pass_name = PROBE_PASS[pass_name]
    if pass_name == "forward_k_major":
        call = kernelhub.get("grouped_matmul", platform="mosaic")
        args = (ops.x, jnp.swapaxes(ops.w, 1, 2), ops.sizes)  # stored [G, n, k] beforehand
        return args, lambda: jax.jit(lambda x, w, s: call(
            x, w, s, preferred_element_type=calls.OUT, group_offset=shape.offset,
            transpose_rhs=True))
    call = kernelhub.get(calls.PASS_OP[pass_name], platform=platform)
    operands = calls.pass_operands(ops, pass_name, "bf16")
    return (*operands.ours, ops.sizes), lambda: calls._pass_function(call, pass_name, shape)


def explicit_tiling(shape: Any, pass_name: str) -> tuple[int, ...] | None:
    """The tiling a probe passes its call (the heuristic's otherwise): TILED_FORWARDS';
    `rhs_gradient_spans` the heuristic's bf16 tgmm blocks (64 summed rows a step, 128 by 128
    outputs where they divide k and n), 4 stages, one program per SM, spans of 8 groups;
    `rhs_gradient_warp_specialized` the same blocks (128 columns: 64 a compute warpgroup) in
    4 stages, two compute warpgroups."""
    if pass_name in TILED_FORWARDS:
        return TILED_FORWARDS[pass_name]
    rows = 128 if shape.k % 128 == 0 else 64
    if pass_name == "rhs_gradient_warp_specialized":
        return (64, rows, 128, 4, 2)
    if pass_name != "rhs_gradient_spans":
        return None
    return (64, rows, 128 if shape.n % 128 == 0 else 64, 4, 1, 8)


# The schedule knobs a probe sets while its call is traced: Mosaic GPU's bands of BAND n-tiles
# even where groups fit one row tile, or the zero-writing visits spread among the computing
# ones (visits.SPREAD_FILLS, which both backends' gmm kernels read). (module, name, value).
_KNOBS = {"forward_banded": ("kernelhub._pallas.mosaic_gpu.grouped_matmul",
                             "WHOLE_ROWS_FOR_ONE_TILE_GROUPS", False),
          **dict.fromkeys(("forward_spread_fills", "lhs_gradient_spread_fills"),
                          ("kernelhub._grouped_matmul.visits", "SPREAD_FILLS", True))}


@contextlib.contextmanager
def schedule_knob(pass_name: str) -> Iterator[None]:
    """For a probe in _KNOBS, its knob set while the call is traced and lowered (jax's caches
    cleared on both sides, so no other pass reuses its kernel)."""
    if pass_name not in _KNOBS:
        yield
        return
    import importlib

    import jax

    module_name, name, value = _KNOBS[pass_name]
    module = importlib.import_module(module_name)
    saved = getattr(module, name)
    jax.clear_caches()
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)
        jax.clear_caches()


PASSES = ("forward", "forward_k_major", "forward_banded", "forward_warp_specialized",
          "forward_warp_specialized_float32", "forward_deep", "forward_wide", "forward_two_per_sm",
          "forward_spread_fills", "lhs_gradient", "lhs_gradient_spread_fills", "rhs_gradient",
          "rhs_gradient_spans", "rhs_gradient_warp_specialized")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["deepseek-v3", "qwen3-moe"])
    parser.add_argument("--passes", nargs="+", default=list(PASSES), choices=PASSES)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import jax

    if jax.default_backend() != "gpu":
        parser.error("the on-device profiler needs a GPU")
    text = run(args.shapes, args.passes, args.out)
    (args.out / "profile.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
