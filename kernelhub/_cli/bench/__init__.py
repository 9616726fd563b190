"""`kernelhub bench`: its command-line arguments, and the benchmark each flag runs.

Without a flag it runs the CPU benchmark (cpu.py). Each benchmark is a module of this package,
imported only when its flag runs; they share their timing (timing.py), not this module.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kernelhub._cli import _arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small demo set (about a minute)")
    parser.add_argument("--gpu", action="store_true", help="the GPU benchmark (needs an NVIDIA GPU)")
    parser.add_argument("--overhead", action="store_true",
                        help="the cost of an eager call beyond its kernel, at a tiny shape")
    parser.add_argument("--ragged", action="store_true",
                        help="ragged_dot_general against jax.lax's, in its three modes")
    parser.add_argument("--compile", action="store_true",
                        help="compile time of grouped_matmul (forward, and with its gradient) "
                             "against jax.lax.ragged_dot")
    parser.add_argument("--quantized", action="store_true",
                        help="grouped_matmul on int8 and fp8 operands against bfloat16")
    parser.add_argument("--epilogue", action="store_true",
                        help="grouped_matmul's fused epilogues (bias, activation, glu) against the "
                             "same math unfused, forward and with gradients, time and memory, "
                             "and jax.checkpoint policies for the pre-activation; default "
                             "platform xla (with --quick: glu silu only, the last of --dtypes, "
                             "a small layer)")
    parser.add_argument("--tuning", action="store_true",
                        help="tuned tilings (the shipped table, or --tuning-table) against the "
                             "heuristic's, forward and with gradients")
    parser.add_argument("--tuning-table", type=Path, metavar="FILE",
                        help="with --tuning: a table saved by kernelhub tune --output")
    parser.add_argument("--shape", type=_arguments.shape, metavar="MxKxN",
                        help="the CPU benchmark's and --tuning's shape, as kernelhub tune takes "
                             "it: rows, model dim, expert dim (default 4096x1024x1024, "
                             "2048x512x512 with --quick)")
    parser.add_argument("--out-dtype", type=_arguments.dtype, metavar="DTYPE",
                        help="with --tuning: preferred_element_type of the calls timed (part of "
                             "a table's key); default float32, the ops' own; kernelhub tune "
                             "tunes the operands' dtype unless told --out-dtypes")
    parser.add_argument("--groups", type=_arguments.positive, nargs="+", metavar="G",
                        help="numbers of groups (default 8 64 256; 8 64 with --quick)")
    parser.add_argument("--dtypes", nargs="+", type=_arguments.dtype,
                        default=["float32", "bfloat16"], metavar="DTYPE",
                        help="input dtypes: float32 (f32), bfloat16 (bf16), float16 (f16); "
                             "default float32 bfloat16")
    parser.add_argument("--ops", nargs="+", type=_arguments.op,
                        default=list(_arguments.OPS.values()), metavar="OP",
                        help="grouped_matmul (gmm) and/or transposed_grouped_matmul (tgmm); "
                             "default both")
    parser.add_argument("--peer-max-groups", type=int, default=64,
                        help="time ragged_dot only up to this many groups (it is slow on CPU)")
    parser.add_argument("--reps", type=_arguments.positive, help="timed repetitions per input draw")
    parser.add_argument("--draws", type=_arguments.positive,
                        help="fresh input allocations per case (default 3, 1 with --quick); each "
                             "time is the median of its turns in its best draw")
    parser.add_argument("--out", type=Path, help="also write the table as markdown to this file")
    parser.add_argument("--platform", type=_arguments.platform,
                        help="force a kernelhub platform: xla, pallas or triton (default: the "
                             "dispatcher's choice)")
    _arguments.add_import_option(parser)
    try:
        from kernelhub._cli.bench import gpu
    except ImportError:  # the GPU options are left out where the GPU benchmark cannot load
        return
    gpu.add_gpu_arguments(parser)


# Options read by some benchmarks only: given to another, they would change nothing unseen.
_READ_BY = {"shape": ("the CPU benchmark (no flag)", "--tuning"),
            "tuning_table": ("--tuning",), "out_dtype": ("--tuning",)}


def _check_options_apply(args: argparse.Namespace) -> None:
    chosen = next((flag for flag in ("gpu", "overhead", "ragged", "compile", "tuning",
                                     "quantized", "epilogue") if getattr(args, flag)), None)
    for option, readers in _READ_BY.items():
        if getattr(args, option) is None:
            continue
        if chosen is None and "the CPU benchmark (no flag)" in readers:
            continue
        if chosen is not None and f"--{chosen}" in readers:
            continue
        raise ValueError(f"--{option.replace('_', '-')} is read by {' and '.join(readers)} only, "
                         f"not by {'--' + chosen if chosen else 'the CPU benchmark'}")


def run(args: argparse.Namespace) -> int:
    _check_options_apply(args)
    if args.gpu:
        from kernelhub._cli.bench import gpu

        return int(gpu.run_gpu_benchmark(args) or 0)
    if args.overhead:
        from kernelhub._cli.bench import overhead

        return overhead.run_overhead(args)
    if args.ragged:
        from kernelhub._cli.bench import ragged

        return ragged.run_ragged(args)
    if args.compile:
        from kernelhub._cli.bench import compile as compile_time  # not the builtin compile

        return compile_time.run_compile(args)
    if args.tuning:
        from kernelhub._cli.bench import tuning

        return tuning.run_tuning(args)
    if args.quantized:
        from kernelhub._cli.bench import quantized

        return quantized.run_quantized(args)
    if args.epilogue:
        from kernelhub._cli.bench import epilogue

        return epilogue.run_epilogue(args)
    from kernelhub._cli.bench import cpu

    return cpu.run_cpu(args)
