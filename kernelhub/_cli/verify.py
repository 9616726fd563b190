"""`kernelhub verify`: compile the kernels ahead of time for hardware this host does not have.

`--tpu` compiles the Pallas TPU kernels (forward and VJP, default tiling) for chips of TPU
generations with libtpu and no TPU (kernelhub/_verify/tpu_ahead_of_time.py), at real MoE
shapes, and prints the tiling each kernel chose and whether it compiles and fits VMEM. Run it
before renting a TPU. Each hardware mode is one `verify_*` function.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernelhub._cli import _tables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kernelhub._verify.tpu_ahead_of_time import SHAPES, TOPOLOGIES

    parser.add_argument("--tpu", action="store_true",
                        help="compile the Pallas TPU kernels for TPU generations (needs the tpu "
                             "extra: pip install 'kernelhub[tpu]')")
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES),
                        help="comma-separated TPU generations (default: all of "
                             f"{', '.join(TOPOLOGIES)})")
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help="comma-separated MoE shapes: " + "; ".join(
                            f"{s.name} (m={s.m}, k={s.k}, n={s.n}, {s.experts} experts"
                            + (f", {s.local} local" if s.local else "") + ")"
                            for s in SHAPES.values()))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                        help="input (and forward output) dtype (default bfloat16)")
    parser.add_argument("--forward-only", action="store_true",
                        help="compile the forward gmm only, not its VJP")
    parser.add_argument("--out", type=Path,
                        help="also write the rows as docs/tpu.md's markdown table to this file")


def run(args: argparse.Namespace) -> int:
    console = _tables.console()
    if args.tpu:
        return verify_tpu(_names(args.topologies), _names(args.shapes), args.dtype,
                          not args.forward_only, console, args.out)
    console.print("kernelhub verify: choose what to verify, e.g. --tpu")
    return 2


def verify_tpu(generations: list[str], shapes: list[str], dtype: str, backward: bool,
               console: Console, out: Path | None = None) -> int:
    """Compiles for each generation x shape and prints a table; 0 when every one compiles."""
    # Only compiling here: keep jax off any local accelerator (and libtpu's warnings about
    # missing TPU metadata quiet), unless the user chose platforms.
    if not os.environ.get("JAX_PLATFORMS"):
        import jax

        jax.config.update("jax_platforms", "cpu")
    from kernelhub._verify import tpu_ahead_of_time as aot
    from kernelhub._pallas.tpu import hardware

    unknown = [g for g in generations if g not in aot.TOPOLOGIES]
    unknown += [s for s in shapes if s not in aot.SHAPES]
    if unknown:
        console.print(f"[red]unknown generation or shape: {', '.join(unknown)}[/red]; generations: "
                      f"{', '.join(aot.TOPOLOGIES)}; shapes: {', '.join(aot.SHAPES)}")
        return 2
    if not aot.libtpu_available():
        console.print("[red]libtpu is not installed[/red]: pip install 'kernelhub\\[tpu]' "
                      "(jax\\[tpu]) to compile for TPUs without one")
        return 2

    table = Table(title=f"Pallas TPU kernels compiled ahead of time ({dtype}, "
                        f"{'forward + VJP' if backward else 'forward'}, default tiling)",
                  caption="tiles are tm/tk/tn; " + "; ".join(
                      f"{s.name}: {s.m}x{s.k}x{s.n}, {s.experts} experts"
                      + (f" ({s.local} local)" if s.local else "")
                      for s in (aot.SHAPES[name] for name in shapes)))
    for column in ("TPU", "shape", "gmm", "gmm_t (d lhs)", "tgmm (d rhs)", "VMEM est.", "time",
                   "result"):
        table.add_column(column)
    failures, rows = 0, []
    for generation in generations:
        vmem = hardware.chip_named(generation).vmem_bytes
        for name in shapes:
            with console.status(f"compiling {name} for {generation}..."):
                result = aot.compile_for(generation, aot.SHAPES[name], dtype, backward)
            failures += not result.ok
            estimates = aot.vmem_estimates(result)
            tiles = [_tiles(result.tilings.get(kernel)) for kernel in ("gmm", "gmm_t", "tgmm")]
            used = (f"{max(estimates.values()) / 2**20:.0f} of {vmem / 2**20:.0f} MiB"
                    if estimates else "-")
            rows.append([generation, name, *tiles, used, f"{result.seconds:.0f} s"])
            table.add_row(*rows[-1],
                          "[green]ok[/green]" if result.ok else f"[red]FAILED[/red] {result.error}")
    console.print(table)
    if out is not None:
        columns = ("TPU", "shape", "gmm", "gmm_t (d lhs)", "tgmm (d rhs)", "VMEM est.", "compile")
        lines = _tables.markdown("", columns, rows).splitlines()[2:]
        _tables.write(out, "\n".join(lines) + "\n")
    return 1 if failures else 0


def _names(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _tiles(tiles: tuple[int, int, int] | None) -> str:
    return "-" if tiles is None else "/".join(map(str, tiles))
