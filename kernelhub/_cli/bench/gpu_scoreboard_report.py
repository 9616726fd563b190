"""How the GPU scoreboard is shown: a progress line per row, the markdown table (roofline
fraction per shape and pass, kernelhub's implementations beside the peers) and the plot."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kernelhub._cli.bench.gpu_roofline import PASS_CALLS


def _number(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if 0 < abs(value) < 10.0 ** -digits:
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def one_line(row: dict[str, Any]) -> str:
    ms = None if row["seconds"] is None else 1e3 * row["seconds"]
    figures = (f"{_number(ms, 3)} ms {_number(row['tflops'], 1)} TFLOP/s "
               f"{_number(row['tbps'])} TB/s roofline {_number(row['roofline_fraction'])}")
    mark = "*" if row["default"] else " "
    return (f"{row['dtype']:4s} {row['shape']:12s} {row['groups']:8s} {row['pass']:12s} "
            f"{row['implementation'] + mark:22s} {figures}"
            + (f"  [{row['note']}]" if row["note"] else ""))


def _implementations(rows: Iterable[dict[str, Any]]) -> list[str]:
    """kernelhub's first, then the peers, each in the order first met."""
    names = list(dict.fromkeys(row["implementation"] for row in rows))
    return ([n for n in names if n.startswith("kernelhub:")]
            + [n for n in names if not n.startswith("kernelhub:")])


def _problems(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    problems: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        problems.setdefault((row["dtype"], row["shape"], row["groups"], row["pass"]), []).append(row)
    return problems


def markdown(document: dict[str, Any]) -> str:
    rows = document["rows"]
    peak = document["peak"]
    flops = ", ".join(f"{value:g} TFLOP/s {name}" for name, value in peak["tflops"].items())
    lines = ["# kernelhub GPU scoreboard: every pass against the roofline", "",
             f"- date: {document['date']}", f"- gpu: {document['gpu']}", f"- jax: {document['jax']}",
             f"- tokamax: {document['tokamax']}",
             f"- peak: {peak['named']}: {flops} dense, {peak['tbps']:g} TB/s HBM",
             f"- timing: {document['timing']}", f"- mode: {document['mode']}", "",
             "Roofline time = max(FLOPs / peak FLOP/s, compulsory bytes / HBM bandwidth); the "
             "compulsory bytes are the computed rows of each input and the local experts' "
             "weights read once and every output element written once (docs/gpu.md). Each "
             "cell is the roofline time over the measured time (1 = at the roofline). Passes: "
             + "; ".join(f"{name} = {call}" for name, call in PASS_CALLS.items())
             + ". cublas_dense does the same FLOPs as one matmul on one expert's weights (fewer "
             "bytes): on a memory-bound pass it can pass 1. The default columns: the "
             "implementation a plain kernelhub call picks (marked *).", ""]
    names = _implementations(rows)
    lines.append("| dtype | shape | groups | pass | roofline ms | bound by | default | ms | "
                 "TFLOP/s | TB/s | " + " | ".join(names) + " |")
    lines.append("|---|---|---|---|---:|---|---|---:|---:|---:|" + "---:|" * len(names))
    for (dtype, shape, groups, pass_name), problem_rows in _problems(rows).items():
        by_name = {row["implementation"]: row for row in problem_rows}
        default = next((row for row in problem_rows if row["default"]), None)
        timed = next((row for row in problem_rows if row["roofline_fraction"]), None)
        roofline = (None if timed is None else
                    1e3 * timed["roofline_fraction"] * timed["seconds"])
        bound = "-" if timed is None else _bound(timed, peak)
        cells = [dtype, shape, groups, pass_name, _number(roofline, 3), bound,
                 default["implementation"] if default else "-",
                 _number(None if not default or default["seconds"] is None
                         else 1e3 * default["seconds"], 3),
                 _number(default["tflops"], 1) if default else "-",
                 _number(default["tbps"]) if default else "-"]
        cells += [_number(by_name[name]["roofline_fraction"]) + ("*" if by_name[name]["default"]
                                                                  else "")
                  if name in by_name else "" for name in names]
        lines.append("| " + " | ".join(cells) + " |")
    notes = _notes(rows)
    if notes:
        lines += ["", "Notes (rows without a time say why; checks of the grouped results "
                  "against kernelhub:xla or lax.ragged_dot on the same operands):", ""]
        lines += notes
    return "\n".join(lines) + "\n"


def _bound(row: dict[str, Any], peak: dict[str, Any]) -> str:
    """memory or compute: the larger term of the roofline, from the row's rates (bytes and
    FLOPs over the same seconds) against the peaks."""
    memory = row["tbps"] / peak["tbps"]
    compute = row["tflops"] / peak["tflops"][row["dtype"]]
    return "memory" if memory >= compute else "compute"


def _notes(rows: list[dict[str, Any]]) -> list[str]:
    """Each implementation's distinct notes, with how many rows carry it; agreement findings
    are summarised by their worst error."""
    by_note: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        for note in (row["note"] or "").split("; "):
            if note and not note.startswith("agrees with"):
                where = f"{row['dtype']} {row['shape']} {row['groups']} {row['pass']}"
                by_note.setdefault((row["implementation"], note), []).append(where)
    lines = []
    for (name, note), where in by_note.items():
        places = where[0] if len(where) == 1 else f"{len(where)} rows, e.g. {where[0]}"
        lines.append(f"- {name}: {note} ({places})")
    worst: dict[str, float] = {}
    for row in rows:
        for note in (row["note"] or "").split("; "):
            if note.startswith("agrees with"):
                value = float(note.rsplit("(", 1)[1].rstrip(")"))
                worst[row["implementation"]] = max(worst.get(row["implementation"], 0.0), value)
    lines += [f"- {name}: agrees with the reference, worst max |difference| / max |value| "
              f"{value:.1e}" for name, value in worst.items()]
    return lines


def plot(document: dict[str, Any], path: Path) -> bool:
    """Roofline fraction per shape and pass, one bar per implementation; one panel per format
    and group-size pattern. False when matplotlib (the `plot` extra) is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = document["rows"]
    panels = list(dict.fromkeys((row["dtype"], row["groups"]) for row in rows))
    if not panels:
        return False
    names = _implementations(rows)
    problems = list(dict.fromkeys((row["shape"], row["pass"]) for row in rows))
    figure, axes = plt.subplots(len(panels), 1, figsize=(max(10, 1.1 * len(problems)),
                                                          3.2 * len(panels)), squeeze=False)
    width = 0.8 / max(1, len(names))
    for axis, (dtype, groups) in zip(axes[:, 0], panels):
        for i, name in enumerate(names):
            values = []
            for shape, pass_name in problems:
                match = [row for row in rows if (row["dtype"], row["groups"], row["shape"],
                                                 row["pass"], row["implementation"])
                         == (dtype, groups, shape, pass_name, name)]
                values.append((match[0]["roofline_fraction"] or 0.0) if match else 0.0)
            axis.bar([j + (i - (len(names) - 1) / 2) * width for j in range(len(problems))],
                     values, width, label=name)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_ylabel("fraction of roofline")
        axis.set_title(f"{dtype}, {groups} groups", fontsize=9)
        axis.set_xticks(range(len(problems)), [f"{s}\n{p}" for s, p in problems], fontsize=6)
    axes[0, 0].legend(fontsize=6, ncol=4)
    figure.suptitle(f"kernelhub GPU scoreboard, {document['gpu']} ({document['peak']['named']})",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
