"""`kernelhub bench --compile`: how long jax.jit takes to compile a grouped matmul, and lax's.

Forward, and forward with the gradient of both operands, of `kernelhub.grouped_matmul` and of
`jax.lax.ragged_dot` on the same arguments: trace, lower and compile, caches cleared before each,
best of a few rounds. A small MoE shape and the benchmark's shape.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

import kernelhub
from kernelhub._cli import _tables

SHAPES = ((512, 64, 128, 8), (4096, 1024, 1024, 64))  # (m, k, n, groups)
COLUMNS = ("m x k x n, groups", "pass", "ours ms", "lax ms", "ours / lax")


def _seconds_to_compile(fn: Callable[..., jax.Array], args: list, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        jax.clear_caches()
        start = time.perf_counter()
        jax.jit(fn).lower(*args).compile()
        best = min(best, time.perf_counter() - start)
    return best


def _passes(op: Callable[..., jax.Array]) -> dict[str, Callable[..., jax.Array]]:
    def loss(lhs, rhs, sizes):
        return jnp.sum(op(lhs, rhs, sizes).astype(jnp.float32))

    return {"forward": lambda lhs, rhs, sizes: op(lhs, rhs, sizes),
            "forward + gradient": jax.grad(loss, argnums=(0, 1))}


def measure(m: int, k: int, n: int, groups: int, dtype: str, rounds: int) -> list[list[str]]:
    args = [jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((groups, k, n), dtype),
            jax.ShapeDtypeStruct((groups,), jnp.int32)]
    ours, theirs = _passes(kernelhub.grouped_matmul), _passes(jax.lax.ragged_dot)
    rows = []
    for name in ours:
        t_ours = _seconds_to_compile(ours[name], args, rounds)
        t_lax = _seconds_to_compile(theirs[name], args, rounds)
        rows.append([f"{m}x{k}x{n}, {groups}", name, f"{t_ours * 1e3:.0f}", f"{t_lax * 1e3:.0f}",
                     f"{t_ours / t_lax:.1f}x"])
    return rows


def run_compile(args: argparse.Namespace) -> int:
    console = _tables.console()
    dtype = args.dtypes[-1] if args.dtypes else "bfloat16"
    rounds = args.reps or 3
    rows = []
    for shape in SHAPES:
        with console.status(f"compiling at {shape}"):
            rows += measure(*shape, dtype, rounds)
    header = _tables.run_header(
        "compile", f"{dtype}; trace + lower + compile, caches cleared, best of {rounds}; "
        f"{kernelhub.resolve('grouped_matmul').platform.value}")
    _tables.report(console, header, COLUMNS, rows, args.out)
    return 0
