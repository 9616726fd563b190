"""The GPU's own counters for kernelhub's kernels, from Nsight Compute (ncu): one call of each
case at the fine-grained shapes, in one process per shape that ncu watches, summed into
counters.md after each shape (ncu writes its page only when its process ends).

    python -m kernelhub._cli.bench.kernel_counters --shapes deepseek-v3 qwen3-moe --out DIR

The on-device profiler (mosaic_profile.py) says where a Mosaic GPU kernel's time goes between
its own regions; the counters say what the memory system did meanwhile: how busy DRAM was
(its throughput as a share of the peak), the bytes per second it moved, L2's hit rate, how
busy the SMs were, and the registers, shared memory and occupancy each kernel launched with.
A forward at half of HBM's rate with DRAM half busy waits on something else than HBM; one
with DRAM busy moves bytes it need not. The cases put the Mosaic GPU and Triton kernels side
by side on the same operands (CASES). ncu profiles only kernels whose name holds
`kernelhub` (both backends name theirs so), one launch per case, in CASES order: a case's
row is the n-th such launch. Clocks are left as the driver sets them (`--clock-control
none`), so durations are the ones a user sees.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (name, platform, pass): the passes as the scoreboard makes them; `forward_k_major` is the
# forward on weights stored [G, n, k], `forward_deep` in 8 stages rather than 4,
# `lhs_gradient_spread_fills` with the zero-writing visits spread among the computing ones
# (mosaic_profile.py; its schedule knob set while the case lowers).
CASES = (
    ("mosaic forward", "mosaic", "forward"),
    ("triton forward", "triton", "forward"),
    ("mosaic forward, weights [G, n, k]", "mosaic", "forward_k_major"),
    ("mosaic forward, 8 stages", "mosaic", "forward_deep"),
    ("mosaic lhs_gradient", "mosaic", "lhs_gradient"),
    ("triton lhs_gradient", "triton", "lhs_gradient"),
    ("mosaic lhs_gradient, fills spread", "mosaic", "lhs_gradient_spread_fills"),
    ("triton lhs_gradient, fills spread", "triton", "lhs_gradient_spread_fills"),
    ("mosaic rhs_gradient", "mosaic", "rhs_gradient"),
    ("triton rhs_gradient", "triton", "rhs_gradient"),
)
# The counters in the table: (column, section of ncu's details page, metric name there).
COLUMNS = (
    ("duration", "GPU Speed Of Light Throughput", "Duration"),
    ("DRAM busy %", "GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("memory rate", "Memory Workload Analysis", "Memory Throughput"),
    ("L2 hit %", "Memory Workload Analysis", "L2 Hit Rate"),
    ("L2 busy %", "GPU Speed Of Light Throughput", "L2 Cache Throughput"),
    ("SM busy %", "GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("registers", "Launch Statistics", "Registers Per Thread"),
    ("shared KB", "Launch Statistics", "Dynamic Shared Memory Per Block"),
    ("grid", "Launch Statistics", "Grid Size"),
    ("occupancy %", "Occupancy", "Achieved Occupancy"),
)
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "LaunchStats", "Occupancy")
# Both backends' kernels carry it (their launches' names; Mosaic GPU adds a suffix).
KERNEL_NAME = "kernelhub"


# This module's importable name: run with `python -m`, as gpu_bench.sh does, its __name__ is
# "__main__", which ncu's `python -m __main__` cannot find (the H100 run of 2026-11-28).
_MODULE = __spec__.name if __spec__ is not None else __name__


def ncu_command(ncu: str, out: Path, shape: str) -> list[str]:
    """ncu over this module's --target run at one shape: its details page as CSV in
    out/counters-<shape>.csv, the cases' tilings in out/cases-<shape>.json."""
    sections = [arg for section in SECTIONS for arg in ("--section", section)]
    return [ncu, "--target-processes", "all", "--kernel-name", f"regex:{KERNEL_NAME}",
            "--clock-control", "none", *sections, "--csv", "--page", "details",
            "--log-file", str(out / f"counters-{shape}.csv"), sys.executable, "-m", _MODULE,
            "--target", "--out", str(out), "--shapes", shape]


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for root in sorted(Path("/usr/local").glob("cuda*"), reverse=True):
        if (root / "bin" / "ncu").exists():
            return str(root / "bin" / "ncu")
    return None


def case_calls(shape: Any) -> list[tuple[str, Callable[[], Any], tuple]]:
    """(label, a maker of the jitted call, arguments) of each case at `shape`, balanced sizes:
    each call launches one kernelhub kernel."""
    from kernelhub._cli.bench import gpu_scoreboard_calls as calls
    from kernelhub._cli.bench import mosaic_profile

    ops = calls.make_operands(shape, "balanced")
    made = []
    for label, platform, pass_name in CASES:
        args, make = mosaic_profile._pass(ops, shape, pass_name, platform)
        made.append((f"{shape.name}: {label}", make, args))
    return made


def run_target(shapes: list[str], out: Path) -> None:
    """Each case compiled ahead (no launch), then run once: one launch of a kernelhub kernel
    per case, in order, for ncu. out/cases-<shape>.json gets each case's label and the tiling its
    kernel ran (the table's in force, or the heuristic's)."""
    import jax

    from kernelhub._cli.bench import gpu_scoreboard_calls as calls
    from kernelhub._cli.bench import mosaic_profile
    from kernelhub._cli.bench.gpu_measurement import SHAPES

    for shape in (s for s in SHAPES if s.name in shapes):
        ran = []
        for (label, make, args), (_, _, pass_name) in zip(case_calls(shape), CASES):
            with mosaic_profile.schedule_knob(pass_name):
                kernels = calls.kernel_tilings(make(), args) or []
                ran.append({"case": label, "tilings": [k["tiling"] for k in kernels]})
                (out / f"cases-{shape.name}.json").write_text(json.dumps(ran, indent=1))
                compiled = make().lower(*args).compile()
            jax.block_until_ready(compiled(*args))
            print(f"ran {label}", flush=True)


def kernel_rows(text: str) -> list[dict[str, Any]]:
    """ncu's details page (CSV) as one row per profiled launch, in launch order: its kernel
    name and {(section, metric): "value unit"}."""
    start = text.find('"ID"')
    if start < 0:
        return []
    launches: dict[str, dict[str, Any]] = {}
    for record in csv.DictReader(io.StringIO(text[start:])):
        launch = launches.setdefault(record["ID"], {"kernel": record.get("Kernel Name", "?"),
                                                    "metrics": {}})
        unit = record.get("Metric Unit", "").strip()
        value = record.get("Metric Value", "").strip()
        launch["metrics"][(record.get("Section Name", ""), record.get("Metric Name", ""))] = (
            f"{value} {unit}".strip())
    return [launches[key] for key in sorted(launches, key=lambda k: int(k))]


def report(labels: list[str], launches: list[dict[str, Any]],
           tilings: dict[str, list[list[int]]] | None = None) -> str:
    """counters.md: a row per case (the n-th launch is the n-th case's; None or none left: not
    profiled), with the tiling its kernel ran where `tilings` (case: tilings) has it."""
    lines = ["# kernelhub's kernels as Nsight Compute counts them", "",
             "One launch per case, balanced group sizes, bf16; clocks as the driver sets them. "
             "DRAM busy: DRAM throughput as a share of its peak; memory rate: the bytes DRAM "
             "moved per second.", "",
             "| case | tiling | kernel | " + " | ".join(column for column, _, _ in COLUMNS)
             + " |",
             "|---|---|---|" + "---:|" * len(COLUMNS)]
    for index, label in enumerate(labels):
        tiling = " ".join("x".join(map(str, t)) for t in (tilings or {}).get(label, [])) or "?"
        if index >= len(launches) or launches[index] is None:
            lines.append(f"| {label} | {tiling} | not profiled |" + " |" * len(COLUMNS))
            continue
        launch = launches[index]
        cells = [launch["metrics"].get((section, metric), "-") for _, section, metric in COLUMNS]
        lines.append(f"| {label} | {tiling} | {launch['kernel'][:48]} | " + " | ".join(cells)
                     + " |")
    if len(launches) > len(labels):
        lines += ["", f"{len(launches) - len(labels)} more launches than cases: the rows may "
                  "be shifted (a case launched two kernelhub kernels)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["deepseek-v3", "qwen3-moe"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--target", action="store_true",
                        help="run the cases once each (what ncu watches)")
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("--out is required")
    if args.target:
        run_target(args.shapes, args.out)
        return 0
    # No jax here: a backend started in this process would hold GPU memory beside the target's.
    ncu = find_ncu()
    if ncu is None:
        parser.error("ncu (Nsight Compute) is not on PATH or under /usr/local/cuda*/bin")
    args.out.mkdir(parents=True, exist_ok=True)
    from kernelhub._cli.bench.gpu_measurement import SHAPES

    # One ncu run per shape, the table written after each: ncu prints its page only when its
    # target ends, so a run stopped for time keeps the shapes done before it.
    labels, launches, tilings, extra, failed = [], [], {}, [], 0
    table = report(labels, launches)
    for shape in (s.name for s in SHAPES if s.name in args.shapes):
        done = subprocess.run(ncu_command(ncu, args.out, shape), env=dict(os.environ))
        log, cases = args.out / f"counters-{shape}.csv", args.out / f"cases-{shape}.json"
        text = log.read_text() if log.exists() else ""
        found = kernel_rows(text)
        if len(found) > len(CASES):
            extra.append(f"{shape}: {len(found) - len(CASES)} more launches than cases, its "
                         f"rows may be shifted (a case launched two kernelhub kernels).")
        # Each shape's rows stand on their own: a missing launch shifts none of the next's.
        labels += [f"{shape}: {label}" for label, _, _ in CASES]
        launches += (found + [None] * len(CASES))[:len(CASES)]
        if cases.exists():
            tilings.update({c["case"]: c["tilings"] for c in json.loads(cases.read_text())})
        table = report(labels, launches, tilings) + "".join(f"\n{line}\n" for line in extra)
        (args.out / "counters.md").write_text(table)
        if done.returncode != 0:
            failed = done.returncode
            print(f"ncu exited {done.returncode} at {shape}; the end of its log:\n"
                  f"{text[-3000:]}")
    print(table)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
