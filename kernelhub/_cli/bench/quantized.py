"""`kernelhub bench --quantized`: grouped_matmul on int8, fp8, 4-bit and microscaled operands
against bfloat16.

Each format's gmm, timed in turns with the bfloat16 gmm and the bfloat16 floor (a batched
matmul of the same FLOPs) in one process, balanced groups, at the benchmark's shape.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import kernelhub
from kernelhub._cli import _tables
from kernelhub._cli._group_sizes import group_sizes
from kernelhub._cli.bench.timing import interleaved_samples

M, K, N = 4096, 1024, 1024
# name: (lhs format, rhs format); a format is None (bfloat16), (dtype, block_size) or the name
# of one of kernelhub.quantize's formats
Form = tuple | str | None
FORMATS: dict[str, tuple[Form, Form]] = {
    "bf16 x int8 weights (per column)": (None, (jnp.int8, None)),
    "bf16 x int4 weights (per column)": (None, (jnp.int4, None)),
    "bf16 x mxfp4 weights": (None, "mxfp4"),
    "int8 x int8 (per row / column)": ((jnp.int8, None), (jnp.int8, None)),
    "e4m3 x e4m3 (per row / column)": ((jnp.float8_e4m3fn, None), (jnp.float8_e4m3fn, None)),
    "e4m3 x e4m3 (blocks of 128 along k)": ((jnp.float8_e4m3fn, 128), (jnp.float8_e4m3fn, 128)),
    "mxfp8 x mxfp8": ("mxfp8", "mxfp8"),
    "mxfp4 x mxfp4": ("mxfp4", "mxfp4"),
    "nvfp4 x nvfp4": ("nvfp4", "nvfp4"),
}
COLUMNS = ("format", "groups", "ms", "bf16 ms", "ms / bf16", "ms / floor")
NOTES = ("bf16: the same gmm on bfloat16 operands; floor: a bfloat16 batched matmul of the same "
         "FLOPs. Outputs float32.")


def _operand(x: jax.Array, form: Form) -> object:
    if form is None:
        return x.astype(jnp.bfloat16)
    if isinstance(form, str):
        return kernelhub.quantize(x, form, axis=1)
    dtype, block_size = form
    return kernelhub.quantize(x, dtype, axis=1, block_size=block_size)


def measure(groups: int, reps: int, platform: str | None) -> list[list[str]]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((groups, K, N)), jnp.float32)
    sizes = jnp.asarray(group_sizes(M, groups, "balanced"))
    gmm = kernelhub.get("grouped_matmul", platform=platform)
    call = jax.jit(lambda lhs, rhs: gmm(lhs, rhs, sizes))
    batched = (x.astype(jnp.bfloat16).reshape(groups, M // groups, K), w.astype(jnp.bfloat16))
    floor = jax.jit(lambda a, b: jnp.einsum("gmk,gkn->gmn", a, b,
                                            preferred_element_type=jnp.float32))
    operands = [(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))]
    operands += [(_operand(x, lhs), _operand(w, rhs)) for lhs, rhs in FORMATS.values()]
    fns: list[Callable[[], jax.Array]] = [lambda: floor(*batched)]
    fns += [functools.partial(call, *pair) for pair in operands]
    times = [statistics.median(t) for t in interleaved_samples(fns, reps)]
    floor_time, bf16_time = times[0], times[1]
    return [[name, str(groups), f"{t * 1e3:.1f}", f"{bf16_time * 1e3:.1f}",
             f"{t / bf16_time:.2f}", f"{t / floor_time:.2f}"]
            for name, t in zip(FORMATS, times[2:])]


def run_quantized(args: argparse.Namespace) -> int:
    console = _tables.console()
    reps = args.reps or 7
    groups = args.groups or [8, 64]
    rows = []
    for count in groups:
        with console.status(f"quantized gmm, {count} groups"):
            rows += measure(count, reps, args.platform)
    chosen = kernelhub.resolve("grouped_matmul", platform=args.platform, features=["quantized"])
    header = _tables.run_header(
        "quantized", f"gmm {M}x{K}x{N}, balanced groups, median of {reps} turns; "
        f"{chosen.platform.value}/{chosen.backend.value}")
    _tables.report(console, header, COLUMNS, rows, args.out, NOTES)
    return 0
