"""`kernelhub tune`: autotune MoE grouped matmuls (and their gradients) on this device.

For each op, dtype and number of groups asked for, prints each pass's candidates with their
times and the winner; with --output, saves the table for `kernelhub.tuning.load` (nothing is
written without it). The tables shipped in kernelhub/tuning/defaults/ are made by this command
(docs/tuning.md gives the line).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import kernelhub
from kernelhub._cli import _arguments, _tables
from kernelhub._cli._arguments import dtype, non_negative, op, positive, short_op
from kernelhub.tuning import DEFAULT_SKEW, Tuning, autotune


# What --quick tunes unless told otherwise: `kernelhub bench --quick`'s shape, turns and draws.
QUICK_SHAPE, QUICK_REPEATS, QUICK_DRAWS = (2048, 512, 512), 3, 1
DEFAULT_SHAPE, DEFAULT_REPEATS, DEFAULT_DRAWS = (4096, 1024, 1024), 5, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a first look in about a minute: bench --quick's shape 2048x512x512 "
                             "(unless --shape), 3 turns, 1 draw; not a table to ship")
    parser.add_argument("--shape", type=_arguments.shape, metavar="MxKxN",
                        help="rows (tokens x top-k), model dim and expert dim; default "
                             "4096x1024x1024 (2048x512x512 with --quick)")
    parser.add_argument("--groups", type=positive, nargs="+", default=[64], metavar="G",
                        help="numbers of experts (default 64)")
    parser.add_argument("--local-groups", type=positive, metavar="L",
                        help="experts on this device when they are sharded (gmm's rhs holds L "
                             "of the groups, from group_offset 0; tgmm makes L); default all")
    parser.add_argument("--dtypes", "--dtype", type=_arguments.operand_dtype, nargs="+",
                        default=["bfloat16"], metavar="DTYPE",
                        help="operand dtypes: float32 (f32), bfloat16 (bf16), float16 (f16), or "
                             "quantized: fp8 (e4m3), e5m2, int8 (both operands quantized in "
                             "the call from bf16, one scale per row and column, the result "
                             "bf16); default bfloat16")
    parser.add_argument("--weights-only", action="store_true",
                        help="with a quantized --dtypes, quantize gmm's weights only: bf16 "
                             "activations beside 8-bit weights (weight-only quantization)")
    parser.add_argument("--scale-block", type=positive, metavar="N",
                        help="with a quantized --dtypes, scale blocks of N along the "
                             "contraction (128: DeepSeek-style 1x128 activations and 128x1 "
                             "weights; 32: MX formats' blocks) instead of one scale per row "
                             "and column; a table's key names the blocks")
    parser.add_argument("--out-dtypes", "--out-dtype", type=dtype, nargs="+", metavar="DTYPE",
                        help="preferred_element_type of the calls tuned (part of a table's "
                             "key): default the operands' dtype, as MoE layers call them; "
                             "float32 is the ops' own default")
    parser.add_argument("--ops", "--op", nargs="+", type=op, default=["grouped_matmul"],
                        help="grouped_matmul (gmm, default) and/or transposed_grouped_matmul (tgmm)")
    parser.add_argument("--skew", type=non_negative, nargs="+", default=[DEFAULT_SKEW],
                        help=f"group sizes: Dirichlet(1/skew) proportions of the rows; 0 is "
                             f"balanced; several values time them all (default {DEFAULT_SKEW:g})")
    parser.add_argument("--forward-only", action="store_true",
                        help="tune the forward pass only (default: forward and both gradients)")
    parser.add_argument("--platform", type=_arguments.platform,
                        help="force a kernelhub platform: xla, pallas, triton or mosaic "
                             "(default: the dispatcher's choice); a table tuned for two of "
                             "them also picks the faster per call (docs/dispatch.md)")
    parser.add_argument("--repeats", type=positive,
                        help="timing turns per candidate (default 5, 3 with --quick)")
    parser.add_argument("--draws", type=positive,
                        help="group-size draws per nonzero skew (default 2, 1 with --quick)")
    parser.add_argument("--min-gain", type=float, default=0.03,
                        help="how much faster than the heuristic a winner must be (default 0.03)")
    parser.add_argument("--output", type=Path,
                        help="save the table here (JSON for kernelhub.tuning.load); merged into "
                             "the file's entries when it exists")
    parser.add_argument("--markdown", type=Path, help="also write the tables as markdown here")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="start no kernel's tuning that would likely end past this many "
                             "seconds from the start (those keep no entry); with --output the "
                             "table is saved after each kernel, so a run stopped from outside "
                             "keeps what it finished")
    _arguments.add_import_option(parser)


def step_function(op: str, m: int, k: int, n: int, groups: int, operand_dtype: Any,
                  forward_only: bool, platform: str | None, local_groups: int | None = None,
                  out_dtype: Any = None, weights_only: bool = False,
                  scale_block: int | None = None):
    """The function tuned, and example arguments: one grouped matmul and its gradients. With
    an 8-bit operand dtype the arguments are bf16 and the call quantizes both to it along
    their contraction (one scale per row and column, or per `scale_block` elements along it),
    or with `weights_only` gmm's rhs only; its result is bf16 unless `out_dtype`."""
    sizes = jax.ShapeDtypeStruct((groups,), jnp.int32)
    call = kernelhub.get(op, platform=platform)
    local = groups if local_groups is None else local_groups
    if local > groups:
        raise ValueError(f"--local-groups must be at most --groups ({groups}), got {local}")
    sharded = {} if local == groups else {"group_offset": 0}
    quantized = jnp.dtype(operand_dtype).itemsize == 1
    if weights_only and not (quantized and op == "grouped_matmul"):
        raise ValueError(f"--weights-only quantizes grouped_matmul's weights to an 8-bit "
                         f"--dtypes; got {short_op(op)} with {jnp.dtype(operand_dtype).name}")
    if scale_block is not None and not quantized:
        raise ValueError(f"--scale-block blocks the scales of a quantized --dtypes (fp8, e5m2, "
                         f"int8); got {jnp.dtype(operand_dtype).name}")
    stored = jnp.dtype(jnp.bfloat16) if quantized else operand_dtype
    if op == "grouped_matmul":
        arguments = (jax.ShapeDtypeStruct((m, k), stored),
                     jax.ShapeDtypeStruct((local, k, n), stored))
        axes = (1, 1)  # gmm's contraction: lhs [m, k] and rhs [G, k, n] along k
    else:
        arguments = (jax.ShapeDtypeStruct((k, m), stored),
                     jax.ShapeDtypeStruct((m, n), stored))
        axes = (1, 0)  # tgmm's: lhs [k, m] and rhs [m, n] along m
        if sharded:
            sharded["num_actual_groups"] = local
    result = stored if out_dtype is None else out_dtype

    def loss(lhs, rhs, group_sizes):
        if quantized:
            rhs = kernelhub.quantize(rhs, operand_dtype, axis=axes[1], block_size=scale_block)
            if not weights_only:
                lhs = kernelhub.quantize(lhs, operand_dtype, axis=axes[0],
                                         block_size=scale_block)
        out = call(lhs, rhs, group_sizes, preferred_element_type=result, **sharded)
        return jnp.sum(out.astype(jnp.float32))

    if forward_only:
        return loss, (*arguments, sizes)
    return jax.grad(loss, argnums=(0, 1)), (*arguments, sizes)


COLUMNS = ("op", "groups", "dtype", "pass", "kernel", "tiling", "ms", "vs default", "")
_PASS_ORDER = {"forward": 0, "lhs_gradient": 1, "rhs_gradient": 2}


def _dtypes(problem: Any) -> str:
    """'bfloat16', 'bfloat16 x int8' where the operands' differ (with scale blocks,
    'float8_e4m3fn/k128'), and ' -> float32' after it when the result's dtype differs."""
    lhs, rhs = (dtype + (f"/{blocks}" if blocks else "") for dtype, blocks in
                ((problem.lhs_dtype, problem.lhs_blocks), (problem.rhs_dtype, problem.rhs_blocks)))
    operands = lhs if rhs == lhs else f"{lhs} x {rhs}"
    if problem.out_dtype == problem.lhs_dtype:
        return operands
    return f"{operands} -> {problem.out_dtype}"


def _ordered(tuning: Tuning) -> list:
    return sorted(tuning.entries.items(), key=lambda item: _PASS_ORDER[item[0].pass_name])


def rows(op: str, tuning: Tuning) -> list[list[str]]:
    shown = []
    for key, entry in _ordered(tuning):
        default_ms = dict(entry.candidates).get(entry.default_tiling) or entry.default_ms
        for tiling, ms in entry.candidates:
            mark = ("winner" if tiling == entry.tiling else "") + (
                " (default)" if tiling == entry.default_tiling else "")
            ratio = "failed" if ms is None else f"{default_ms / ms:.2f}x"
            problem = key.problem
            shown.append([op, str(problem.num_groups), _dtypes(problem), key.pass_name,
                          f"{problem.kernel} {problem.m}x{problem.k}x{problem.n}",
                          "x".join(map(str, tiling)),
                          "-" if ms is None else f"{ms:.2f}", ratio, mark.strip()])
    return shown


def summary(op: str, tuning: Tuning) -> str:
    key = next(iter(tuning.entries))
    passes = "; ".join(
        f"{key.pass_name} {entry.default_ms:.2f} -> {entry.tuned_ms:.2f} ms ({entry.speedup:.2f}x)"
        for key, entry in _ordered(tuning))
    return f"{op} {key.problem.num_groups} groups {_dtypes(key.problem)}: {passes}"


def run(args: argparse.Namespace) -> int:
    quick = getattr(args, "quick", False)
    m, k, n = args.shape or (QUICK_SHAPE if quick else DEFAULT_SHAPE)
    repeats = args.repeats or (QUICK_REPEATS if quick else DEFAULT_REPEATS)
    draws = args.draws or (QUICK_DRAWS if quick else DEFAULT_DRAWS)
    time_limit = getattr(args, "time_limit", None)
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"--time-limit must be a number of seconds > 0, got {time_limit}")
    started = time.monotonic()
    output = args.output
    earlier = kernelhub.tuning.load(output) if output and output.exists() else Tuning()
    tuned = Tuning()

    def save(key, entry) -> None:
        # Each kernel's entry as soon as it is decided, merged into what the file held.
        nonlocal tuned
        tuned = tuned.merged(Tuning({key: entry}))
        if output:
            earlier.merged(tuned).save(output)

    shown, notes, groups_described = [], [], ""
    for name in args.ops:
        for dtype_name, out_name, groups in itertools.product(
                args.dtypes, args.out_dtypes or [None], args.groups):
            left = None if time_limit is None else time_limit - (time.monotonic() - started)
            if left is not None and left <= 0:
                notes.append(f"{short_op(name)} {groups} groups {dtype_name}: not tuned, "
                             f"--time-limit {time_limit:g}s reached")
                continue
            fn, arguments = step_function(
                name, m, k, n, groups, jnp.dtype(dtype_name), args.forward_only, args.platform,
                args.local_groups, None if out_name is None else jnp.dtype(out_name),
                getattr(args, "weights_only", False), getattr(args, "scale_block", None))
            one = autotune(fn, *arguments, skew=tuple(args.skew), draws=draws,
                           repeats=repeats, min_gain=args.min_gain, time_limit=left,
                           on_entry=save)
            if not one.entries:
                continue
            groups_described = next(iter(one.entries.values())).groups
            shown += rows(short_op(name), one)
            notes.append(summary(short_op(name), one))
    device = jax.devices()[0].device_kind
    header = (f"kernelhub tune{' --quick' if quick else ''}, {datetime.date.today()}: "
              f"{m}x{k}x{n} on {device} (jax {jax.__version__}); group sizes: "
              f"{groups_described}; median of {repeats} turns")
    out = _tables.console()
    _tables.report(out, header, COLUMNS, shown, args.markdown,
                   notes="tuned vs default (the winner's second timing, on fresh operands):\n"
                   + "\n".join(notes))
    if output and not len(tuned):
        out.print(f"nothing tuned: {output} left as it was")
    elif output:
        saved = earlier.merged(tuned)
        saved.save(output)
        out.print(f"saved {len(tuned)} entries to {output} ({len(saved)} in all)")
    return 0
