"""`kernelhub bench --gpu`: the Triton grouped matmuls on an NVIDIA GPU at real MoE shapes.

For each shape and group-size pattern (balanced, skewed: Dirichlet alpha 0.5) it times gmm
forward, gmm backward (d lhs + d rhs through jax.vjp) and tgmm, each beside a dense floor of the
same FLOPs (jnp.dot on the computed rows, i.e. cuBLAS) and the peer jax.lax.ragged_dot; then gmm
forward on e4m3, int8, MXFP8 and 4-bit-weight operands beside dense bf16 and dense 8-bit floors
(gpu_quantized.py);
then fused epilogues (glu="silu"; bias + glu="swiglu_oai", interleaved) beside the same math
unfused, forward and forward + grad (epilogue.py), on the Triton kernels and, where the GPU has
them (Hopper), the Mosaic GPU ones (rows marked "(mosaic)").
It writes gpu_bench.md (tables, targets), gpu_bench.json (raw numbers) and gpu_bench.png (plot,
when matplotlib is installed) into the output folder. `--gpu-parts sweep` times a few block
configs per shape instead (gpu_sweep.md), the data for tuning kernelhub/_pallas/gpu/config.py.
`--gpu-parts roofline` runs the scoreboard (gpu_scoreboard.py): every pass of every kernelhub
implementation and peer against the chip's roofline, into roofline.json/.md/.png.

Also runnable without the rest of the CLI: `python -m kernelhub._cli.bench.gpu --gpu-out DIR`;
`--gpu-tables quantized epilogue` (say) measures only those tables, for a short GPU lease.

Without a GPU it refuses, unless `--gpu-smoke` asks for the tiny pipeline check (interpret mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import kernelhub
from kernelhub._cli._group_sizes import PATTERNS, group_sizes
from kernelhub._cli.bench.gpu_measurement import (SHAPES, SMOKE_SHAPES, Measurement, Shape,
                                                  format_number, relative_error)
from kernelhub._cli.bench.timing import median_seconds

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"
PASSES = ("gmm forward", "gmm backward", "tgmm")
TABLES = ("main", "quantized", "epilogue")
# The kernels whose fused epilogues the epilogue table times, each beside the unfused math.
EPILOGUE_PLATFORMS = ("triton", "mosaic")


# ---------------------------------------------------------------- command line


def add_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPU benchmark (with --gpu)")
    group.add_argument("--gpu-out", type=Path,
                       help="folder for gpu_bench.md/.json/.png (default: $OUT, else benchmarks/gpu)")
    group.add_argument("--gpu-shapes", nargs="+", choices=[s.name for s in SHAPES],
                       help="only these shapes")
    group.add_argument("--gpu-warmup", type=int, default=2, help="untimed calls after compiling")
    group.add_argument("--gpu-parts", nargs="+", choices=("bench", "sweep", "roofline"),
                       default=["bench"],
                       help="bench: the table against dense and ragged_dot (default); sweep: a few "
                            "block configs per shape (gpu_sweep.md); roofline: the scoreboard, "
                            "every pass of every implementation and peer against the chip's "
                            "roofline (roofline.json/.md/.png, gpu_scoreboard.py)")
    group.add_argument("--gpu-dtypes", nargs="+", choices=("bf16", "fp8"), default=["bf16", "fp8"],
                       help="roofline: operand formats (default both; fp8 is e4m3 with one "
                            "scale per row and column)")
    group.add_argument("--gpu-budget", type=float, metavar="SECONDS",
                       help="roofline: stop starting passes after this many seconds; the rest "
                            "get rows that say so (a GPU lease has a time limit)")
    group.add_argument("--gpu-implementations", nargs="+", metavar="NAME",
                       help="roofline: only these rows' implementations, e.g. kernelhub:triton "
                            "(again under KERNELHUB_TUNING, to compare a tuning table); default "
                            "all")
    group.add_argument("--gpu-exclude", nargs="+", metavar="NAME", default=[],
                       help="roofline: leave these implementations out, e.g. kernelhub:mosaic")
    group.add_argument("--gpu-merge", action="store_true",
                       help="roofline: keep the rows already in the folder's roofline.json, "
                            "replacing those this run measures (one table from several "
                            "processes)")
    group.add_argument("--gpu-heuristic-rows", action="store_true",
                       help="roofline: each tabled kernel (kernelhub:triton, kernelhub:mosaic) "
                            "again under kernelhub.tuning.heuristic(), as "
                            "kernelhub:<platform>@heuristic: a tuning table before and after")
    group.add_argument("--gpu-compile-threads", type=int, default=8, metavar="N",
                       help="roofline: executables compiled at once (default 8; 1: one at a time)")
    group.add_argument("--gpu-tables", nargs="+", choices=TABLES, default=list(TABLES),
                       help="which of the bench part's tables to measure (default: all); a short "
                            "GPU lease can take the new rows alone")
    group.add_argument("--gpu-smoke", action="store_true",
                       help="tiny shapes, allowed without a GPU (interpret mode): checks the pipeline")


def gpu_missing() -> str | None:
    """Why this host cannot run the GPU benchmark, or None."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError as error:
        return f"jax finds no GPU here ({error})"
    if not devices:
        return "jax finds no GPU here"
    return None


def run_gpu_benchmark(args: argparse.Namespace) -> int:
    """Entry point of `kernelhub bench --gpu`; returns the exit status."""
    smoke = bool(getattr(args, "gpu_smoke", False))
    missing = gpu_missing()
    if missing and not smoke:
        print(f"kernelhub bench --gpu needs an NVIDIA GPU: {missing}. Run it on a GPU machine "
              f"(scripts/gpu_bench.sh), or add --gpu-smoke for a tiny check of the pipeline here.")
        return 2
    chosen_out = getattr(args, "gpu_out", None) or os.environ.get("OUT")
    out = Path(chosen_out or "benchmarks/gpu")
    out.mkdir(parents=True, exist_ok=True)
    shapes = SMOKE_SHAPES if smoke else tuple(
        s for s in SHAPES if not getattr(args, "gpu_shapes", None) or s.name in args.gpu_shapes)
    reps = getattr(args, "reps", None) or (2 if smoke else 10)
    warmup = 1 if smoke else getattr(args, "gpu_warmup", 2)
    dtype = jnp.float32 if smoke else jnp.bfloat16

    header = report_header(reps, warmup, dtype, smoke)
    parts = getattr(args, "gpu_parts", None) or ["bench"]
    if "bench" in parts:
        from kernelhub._cli.bench import epilogue
        from kernelhub._cli.bench import gpu_quantized as quantized

        tables = getattr(args, "gpu_tables", None) or TABLES
        measurements = []
        for shape in shapes if "main" in tables else ():
            for pattern in PATTERNS:
                for result in measure_shape(shape, pattern, dtype, reps, warmup):
                    print(result.one_line(f"{result.pattern:8s} {result.pass_name:13s}"),
                          flush=True)
                    measurements.append(result)
        quantized_rows = []
        epilogue_rows = []

        def write_reports() -> None:
            (out / "gpu_bench.md").write_text(
                markdown_report(measurements, header) + "\n"
                + "\n".join((quantized.markdown_lines(quantized_rows) if quantized_rows else [])
                            + (epilogue.gpu_markdown_lines(epilogue_rows) if epilogue_rows
                               else [])))
            (out / "gpu_bench.json").write_text(json.dumps(
                {"header": header, "results": [as_record(m) for m in measurements],
                 "quantized": [quantized.as_record(m) for m in quantized_rows],
                 "epilogue": [epilogue.gpu_record(m) for m in epilogue_rows]}, indent=1))

        # Written after the main table and again after each quantized or epilogue shape, so
        # that a run cut short by a time limit still leaves what it measured.
        write_reports()
        plotted = bool(measurements) and plot(measurements, out / "gpu_bench.png")
        for shape in shapes if "quantized" in tables else ():
            for result in quantized.measure_quantized(shape, reps, warmup):
                print(quantized.one_line(result), flush=True)
                quantized_rows.append(result)
            write_reports()
        for shape in shapes if "epilogue" in tables else ():
            # Both GPU kernels where Hopper has the Mosaic GPU ones (the interpreter's, in a
            # smoke run, would take minutes).
            for platform in ("triton",) if smoke else EPILOGUE_PLATFORMS:
                try:
                    measured = epilogue.measure_gpu(shape, dtype, reps, warmup, platform=platform)
                except kernelhub.NoImplementationError as error:
                    print(f"epilogue, {platform}: not here: {str(error).splitlines()[0]}",
                          flush=True)
                    continue
                for result in measured:
                    print(epilogue.gpu_one_line(result), flush=True)
                    epilogue_rows.append(result)
                write_reports()
        print(f"wrote {out / 'gpu_bench.md'}, {out / 'gpu_bench.json'}"
              + (f", {out / 'gpu_bench.png'}" if plotted else " (no plot: matplotlib is missing)"))
    if "roofline" in parts:
        from kernelhub._cli.bench import gpu_scoreboard

        # Without a folder named, a run files itself as benchmarks/gpu/<date>-<gpu>/.
        folder = out if chosen_out else out / gpu_scoreboard.folder_name(
            jax.devices()[0].device_kind)
        gpu_scoreboard.run_scoreboard(
            folder, shapes, tuple(getattr(args, "gpu_dtypes", None) or gpu_scoreboard.DTYPES),
            reps, warmup, smoke, budget=getattr(args, "gpu_budget", None),
            only=tuple(args.gpu_implementations) if getattr(args, "gpu_implementations", None)
            else None,
            compile_threads=getattr(args, "gpu_compile_threads", 8),
            exclude=tuple(getattr(args, "gpu_exclude", None) or ()),
            merge=bool(getattr(args, "gpu_merge", False)),
            heuristic_rows=bool(getattr(args, "gpu_heuristic_rows", False)))
        print(f"wrote {folder / 'roofline.json'} and roofline.md")
    if "sweep" in parts:
        sweep = [row for shape in shapes for row in sweep_shape(shape, dtype, reps, warmup)]
        (out / "gpu_sweep.md").write_text(sweep_report(sweep, header))
        print(f"wrote {out / 'gpu_sweep.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelhub._cli.bench.gpu",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, help="timed repetitions per measurement (default 10)")
    add_gpu_arguments(parser)
    return run_gpu_benchmark(parser.parse_args(argv))


# ---------------------------------------------------------------- problems


@dataclasses.dataclass
class Problem:
    """Inputs of one shape and pattern, and where the computed (local) rows lie."""

    sizes: jax.Array
    local_sizes: jax.Array
    lhs: jax.Array  # [m, k]
    lhs_t: jax.Array  # [k, m], tgmm's layout
    rhs: jax.Array  # [local, k, n]
    d_out: jax.Array  # [m, n]
    first_row: int
    rows: int


def make_problem(shape: Shape, pattern: str, dtype: Any) -> Problem:
    sizes = group_sizes(shape.m, shape.experts, pattern)
    local = sizes[shape.offset: shape.offset + shape.local]
    keys = jax.random.split(jax.random.key(0), 3)
    lhs = jax.random.normal(keys[0], (shape.m, shape.k), dtype)
    # A Python float keeps dtype (a numpy float64 would promote the weights to float32).
    rhs = jax.random.normal(keys[1], (shape.local, shape.k, shape.n), dtype) / float(np.sqrt(shape.k))
    assert rhs.dtype == lhs.dtype == jnp.dtype(dtype), (lhs.dtype, rhs.dtype)
    d_out = jax.random.normal(keys[2], (shape.m, shape.n), dtype)
    return Problem(jnp.asarray(sizes), jnp.asarray(local), lhs, jnp.asarray(lhs.T), rhs, d_out,
                   int(sizes[: shape.offset].sum()), int(local.sum()))


def pass_functions(shape: Shape, problem: Problem, pass_name: str, dtype: Any
                   ) -> tuple[dict[str, Callable[[], Any]], Callable[[Any, Any], float]]:
    """The three implementations of one pass as thunks, and how to compare kernelhub's result
    with ragged_dot's."""
    p, offset, local = problem, shape.offset, shape.local
    rows = slice(p.first_row, p.first_row + p.rows)
    gmm = kernelhub.get(GMM, platform="triton")
    tgmm = kernelhub.get(TGMM, platform="triton")
    x_local, dy_local = p.lhs[rows], p.d_out[rows]
    dense_rhs = p.rhs[0]
    tgmm_numbers = jax.lax.RaggedDotDimensionNumbers((((1,), (0,)), ((), ())), [1], [])

    def ours_forward(x, w, s):
        return gmm(x, w, s, preferred_element_type=dtype, group_offset=offset)

    def ragged_forward(x, w, s):
        return jax.lax.ragged_dot(x, w, s, preferred_element_type=dtype)

    def backward(forward):
        def run(x, w, s, dy):
            _, vjp = jax.vjp(lambda x, w: forward(x, w, s), x, w)
            return vjp(dy)
        return jax.jit(run)

    if pass_name == "gmm forward":
        ours = jax.jit(ours_forward)
        dense = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=dtype))
        peer = jax.jit(ragged_forward)
        fns = {"kernelhub": lambda: ours(p.lhs, p.rhs, p.sizes),
               "dense": lambda: dense(x_local, dense_rhs),
               "ragged_dot": lambda: peer(x_local, p.rhs, p.local_sizes)}
        return fns, lambda a, b: relative_error(a[rows], b)
    if pass_name == "gmm backward":
        ours = backward(ours_forward)
        dense = backward(lambda x, w, s: jnp.dot(x, w, preferred_element_type=dtype))
        peer = backward(ragged_forward)
        fns = {"kernelhub": lambda: ours(p.lhs, p.rhs, p.sizes, p.d_out),
               "dense": lambda: dense(x_local, dense_rhs, None, dy_local),
               "ragged_dot": lambda: peer(x_local, p.rhs, p.local_sizes, dy_local)}
        return fns, lambda a, b: max(relative_error(a[0][rows], b[0]), relative_error(a[1], b[1]))
    ours = jax.jit(lambda xt, dy, s: tgmm(xt, dy, s, preferred_element_type=dtype,
                                          group_offset=offset, num_actual_groups=local))
    dense = jax.jit(lambda xt, dy: jnp.dot(xt, dy, preferred_element_type=dtype))
    peer = jax.jit(lambda xt, dy, s: jax.lax.ragged_dot_general(
        xt, dy, s, tgmm_numbers, preferred_element_type=dtype))
    x_local_t = p.lhs_t[:, rows]
    fns = {"kernelhub": lambda: ours(p.lhs_t, p.d_out, p.sizes),
           "dense": lambda: dense(x_local_t, dy_local),
           "ragged_dot": lambda: peer(x_local_t, dy_local, p.local_sizes)}
    return fns, relative_error


# ---------------------------------------------------------------- measurements


def measure_shape(shape: Shape, pattern: str, dtype: Any, reps: int, warmup: int
                  ) -> list[Measurement]:
    problem = make_problem(shape, pattern, dtype)
    results = []
    for pass_name in PASSES:
        fns, compare = pass_functions(shape, problem, pass_name, dtype)
        flops = 2.0 * problem.rows * shape.k * shape.n * (2 if pass_name == "gmm backward" else 1)
        seconds = median_seconds(fns, reps, warmup)
        error = None
        if seconds["kernelhub"] is not None and seconds["ragged_dot"] is not None:
            error = compare(fns["kernelhub"](), fns["ragged_dot"]())
        results.append(Measurement(shape, pattern, pass_name, flops, seconds, error))
    return results


# ---------------------------------------------------------------- block-config sweep

GMM_CANDIDATES = ((64, 64, 128, 4, 4), (128, 64, 128, 4, 4), (128, 64, 256, 8, 3),
                  (128, 32, 256, 8, 4), (64, 64, 256, 4, 3), (128, 128, 128, 8, 3),
                  (256, 64, 128, 8, 3))
TGMM_CANDIDATES = ((64, 128, 128, 4, 4), (32, 128, 128, 4, 4), (64, 64, 64, 4, 4),
                   (64, 128, 256, 8, 3), (128, 128, 128, 8, 3), (64, 64, 128, 4, 4))
SMOKE_CANDIDATES = ((16, 16, 16), (32, 16, 32))


def sweep_shape(shape: Shape, dtype: Any, reps: int, warmup: int) -> list[dict[str, Any]]:
    """Times gmm forward and tgmm (balanced sizes) at each candidate tiling and the heuristic's."""
    problem = make_problem(shape, "balanced", dtype)
    gmm = kernelhub.get(GMM, platform="triton")
    tgmm = kernelhub.get(TGMM, platform="triton")
    flops = 2.0 * problem.rows * shape.k * shape.n
    smoke = shape in SMOKE_SHAPES
    rows = []
    for op, candidates in ((GMM, GMM_CANDIDATES), (TGMM, TGMM_CANDIDATES)):
        fns = {}
        for tiling in (None, *(SMOKE_CANDIDATES if smoke else candidates)):
            if op == GMM:
                fn = jax.jit(lambda x, w, s, t=tiling: gmm(
                    x, w, s, preferred_element_type=dtype, tiling=t, group_offset=shape.offset))
                fns[str(tiling or "heuristic")] = lambda fn=fn: fn(problem.lhs, problem.rhs, problem.sizes)
            else:
                fn = jax.jit(lambda xt, dy, s, t=tiling: tgmm(
                    xt, dy, s, preferred_element_type=dtype, tiling=t, group_offset=shape.offset,
                    num_actual_groups=shape.local))
                fns[str(tiling or "heuristic")] = lambda fn=fn: fn(problem.lhs_t, problem.d_out, problem.sizes)
        for tiling, seconds in median_seconds(fns, reps, warmup).items():
            tflops = None if not seconds else flops / seconds / 1e12
            rows.append({"shape": shape.name, "op": op, "tiling": tiling, "seconds": seconds,
                         "tflops": tflops})
            print(f"  sweep {shape.name} {op} {tiling}: {format_number(tflops)} TFLOP/s",
                  flush=True)
    return rows


# ---------------------------------------------------------------- reports


def report_header(reps: int, warmup: int, dtype: Any, smoke: bool) -> dict[str, str]:
    device = jax.devices()[0]
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": f"{device.platform}: {getattr(device, 'device_kind', '?')}",
        "jax": jax.__version__,
        "jaxlib": _jaxlib_version(),
        "dtype": jnp.dtype(dtype).name,
        "timing": f"median of up to {reps} reps after compile + {warmup} warmup calls",
        "mode": "smoke (tiny shapes, not a measurement)" if smoke else "full",
    }


def _jaxlib_version() -> str:
    try:
        import jaxlib

        return jaxlib.__version__
    except (ImportError, AttributeError):
        return "?"


def targets(measurements: list[Measurement]) -> list[str]:
    """The targets this benchmark reports against, each met or missed."""
    lines = []
    mixtral = [m for m in measurements if m.shape.name == "mixtral" and m.pass_name == "gmm forward"]
    for m in mixtral:
        ratio = m.ratio("dense")
        verdict = "-" if ratio is None else ("met" if ratio >= 0.70 else "MISSED")
        lines.append(f"- Mixtral gmm forward ({m.pattern}) >= 70% of dense (aim 85%): "
                     f"{format_number(None if ratio is None else 100 * ratio, 0)}% -> {verdict}")
    for m in measurements:
        if m.shape.experts >= 64:
            ratio = m.ratio("ragged_dot")
            verdict = "-" if ratio is None else ("met" if ratio >= 10 else "MISSED")
            lines.append(f"- {m.shape.name} {m.pass_name} ({m.pattern}) >= 10x ragged_dot: "
                         f"{format_number(ratio, 1)}x -> {verdict}")
    return lines


def markdown_report(measurements: list[Measurement], header: dict[str, str]) -> str:
    lines = ["# kernelhub GPU benchmark (Triton kernels)", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    lines += ["", "Shapes (m x k x n, experts; local experts when sharded with group_offset):", ""]
    for shape in dict.fromkeys(m.shape for m in measurements) or SHAPES:
        local = f", {shape.local} local (group_offset {shape.offset})" if shape.local < shape.experts else ""
        lines.append(f"- {shape.name}: {shape.m} x {shape.k} x {shape.n}, {shape.experts} experts{local}")
    if not measurements:  # --gpu-tables without main: the other tables follow
        return "\n".join(lines + [""])
    lines += ["", "TFLOP/s count only the computed rows' FLOPs (backward: d lhs + d rhs = 2x). "
              "dense: jnp.dot on the same rows (cuBLAS); ratios: kernelhub's speed over theirs.", ""]
    lines.append("| shape | groups | pass | kernelhub | dense | ragged_dot | vs dense | vs ragged_dot "
                 "| max rel. error vs ragged_dot |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|")
    lines += [m.markdown_row(m.pattern, m.pass_name) for m in measurements]
    lines += ["", "Targets:", "", *(targets(measurements) or ["- (no shape here has a target)"]), ""]
    return "\n".join(lines)


def as_record(m: Measurement) -> dict[str, Any]:
    return m.record("pass")


def sweep_report(rows: list[dict[str, Any]], header: dict[str, str]) -> str:
    lines = ["# kernelhub GPU block-config sweep (balanced sizes)", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    lines += ["", "tiling = (block_m, block_k, block_n, num_warps, num_stages)", "",
              "| shape | op | tiling | TFLOP/s | ms |", "|---|---|---|---:|---:|"]
    for row in rows:
        ms = None if row["seconds"] is None else 1e3 * row["seconds"]
        lines.append(f"| {row['shape']} | {row['op']} | {row['tiling']} | "
                     f"{format_number(row['tflops'])} | {format_number(ms, 3)} |")
    return "\n".join(lines) + "\n"


def plot(measurements: list[Measurement], path: Path) -> bool:
    """TFLOP/s per case and implementation, log scale (ragged_dot can be 100x off)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{m.shape.name}\n{m.pattern}\n{m.pass_name}" for m in measurements]
    x = np.arange(len(measurements))
    width = 0.27
    fig, axis = plt.subplots(figsize=(max(8, 0.9 * len(measurements)), 5))
    for i, name in enumerate(Measurement.implementations()):
        values = [m.tflops(name) or 0.0 for m in measurements]
        axis.bar(x + (i - 1) * width, values, width, label=name)
    axis.set_yscale("log")
    axis.set_ylabel("TFLOP/s")
    axis.set_xticks(x, labels, fontsize=6)
    axis.legend()
    axis.set_title(f"kernelhub Triton grouped matmuls, {jax.devices()[0].device_kind}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


if __name__ == "__main__":
    raise SystemExit(main())
