"""kernelhub.autotune: time each kernel's candidate tilings on realistic group sizes.

`fn` is traced once (jax.eval_shape) with a recorder as the active table: every grouped-matmul
kernel it would run, in every pass its gradients take, reports its implementation, problem and
arguments' shapes. Each distinct kernel is then compiled with each of its implementation's
candidate tilings and timed on fresh operands of those shapes, with group sizes drawn as the
caller says, candidates in turns so that a machine's drift does not favour one of them.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernelhub._core.shapes import symbolic_shapes
from kernelhub._core.turns import rotated, seconds_per_call
from kernelhub._grouped_matmul import active_table
from kernelhub._grouped_matmul.passes import KernelCall
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._grouped_matmul.tables import Entry, Tuning, TuningKey

# Dirichlet(1 / skew) proportions: 2.0 gives the benchmark's "skewed" sizes (alpha 0.5), about
# what a router produces early in training; 0 gives balanced sizes.
DEFAULT_SKEW = 2.0
# The tuner's group sizes come from a random stream of their own: `kernelhub bench` draws its
# skewed sizes with numpy's seed 0, and a tuning that had timed exactly those would flatter
# itself in `kernelhub bench --tuning`.
_DRAW_STREAM = 0x7475
# Candidates compiled at once at most (XLA's compiles release the GIL): a GPU host's cores
# build the kernels of a tuning run in parallel.
COMPILE_THREADS = 8
# The clock of time_limit (a test sets its own).
_clock = time.monotonic


class Recorder:
    """The active table while `fn` is traced: records each kernel call, answers the heuristic."""

    def __init__(self) -> None:
        self.calls: dict[TuningKey, KernelCall] = {}

    def tiling_for(self, call: KernelCall) -> None:
        key = call.key()
        if key not in self.calls:
            shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), call.arrays)
            self.calls[key] = call.with_arrays(shapes)
        return None


def group_size_draws(problem: Problem, group_sizes: Any, skew: float, draws: int,
                     seed: int) -> tuple[list[np.ndarray], str]:
    """int32 [num_groups] size vectors to time `problem` on, and a description of them."""
    rows, groups = problem.m, problem.num_groups
    if group_sizes is not None:
        given = [group_sizes] if np.ndim(group_sizes) == 1 else list(group_sizes)
        vectors = []
        for index, sizes in enumerate(given):
            sizes = np.asarray(sizes)
            if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer):
                raise TypeError(f"group_sizes must be integer vectors [num_groups], got "
                                f"{sizes.dtype} of shape {sizes.shape}")
            if sizes.shape[0] != groups or (sizes < 0).any() or sizes.sum() > rows:
                raise ValueError(
                    f"group_sizes[{index}] must hold {groups} sizes >= 0 summing to at most "
                    f"{rows} for a {problem.kernel} of {rows} rows in {groups} groups, got "
                    f"{sizes.shape[0]} sizes summing to {int(sizes.sum())}")
            vectors.append(sizes.astype(np.int32))
        return vectors, f"the caller's ({len(vectors)} vectors)"
    skews = (skew,) if np.ndim(skew) == 0 else tuple(skew)
    if not skews or any(value < 0 for value in skews):
        raise ValueError(f"skew must be >= 0 (0: balanced sizes), or a non-empty sequence of "
                         f"such values, got {skew}")
    vectors, described = [], []
    rng = np.random.default_rng((_DRAW_STREAM, seed))
    for value in skews:
        if value == 0:
            sizes = np.full(groups, rows // groups)
            sizes[: rows - sizes.sum()] += 1
            vectors.append(sizes.astype(np.int32))
            described.append("balanced")
            continue
        vectors += [rng.multinomial(rows, rng.dirichlet(np.full(groups, 1.0 / value)))
                    .astype(np.int32) for _ in range(draws)]
        described.append(f"Dirichlet skew {value:g} ({draws} draws)")
    return vectors, " + ".join(described)


@functools.partial(jax.jit, static_argnums=(1, 2))
def random_array(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Random values of `shape` made on the device: normal floats, integers in the dtype's
    range up to +-127. (Drawn on the host, DeepSeek-V3's 32 local experts' weights took 10 s
    a draw, a tuning run's time several times over.)"""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        values = jax.random.randint(key, shape, max(info.min, -127), min(info.max, 127) + 1)
        return values.astype(dtype)
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _lhs_held_transposed(call: KernelCall) -> bool:
    """Whether the call is a weight gradient's tgmm of a float lhs: in a backward that lhs is
    `x.T` of activations x [m, k], so the tuner holds x and transposes it inside the timed call
    as the backward does. A kernel that reads x as it is then pays no copy, and one that reads
    [k, m] pays the copy it pays in training."""
    lhs = call.arrays[0]
    return (call.pass_name == "rhs_gradient" and call.problem.kernel is Kernel.TGMM
            and isinstance(lhs, (jax.Array, jax.ShapeDtypeStruct)))


def operands(call: KernelCall, sizes: np.ndarray, seed: int) -> tuple:
    """Fresh arrays of `call`'s shapes, with `sizes` as group sizes and group_offset 0 (a
    weight gradient's lhs as the x it is the transpose of: `as_called`)."""
    lhs, rhs, _, group_offset, existing_out = call.arrays
    if _lhs_held_transposed(call):
        lhs = jax.ShapeDtypeStruct(lhs.shape[::-1], lhs.dtype)
    leaves, tree = jax.tree.flatten((lhs, rhs, existing_out))
    keys = jax.random.split(jax.random.key(seed), max(len(leaves), 1))
    filled = [random_array(key, tuple(leaf.shape), jnp.dtype(leaf.dtype))
              for key, leaf in zip(keys, leaves)]
    lhs, rhs, existing_out = jax.tree.unflatten(tree, filled)
    offset = jnp.zeros(group_offset.shape, group_offset.dtype)
    return (lhs, rhs, jnp.asarray(sizes), offset, existing_out)


def as_called(call: KernelCall, arrays: tuple) -> tuple:
    """`operands`' arrays as the kernel takes them (inside the timed function)."""
    if not _lhs_held_transposed(call):
        return arrays
    return (arrays[0].T, *arrays[1:])


def compile_candidates(call: KernelCall, candidates: Sequence[tuple[int, ...]], example: tuple,
                       advance: Callable[[], None], threads: int | None = None) -> list[Any]:
    """One executable per candidate tiling, run once; None for one that does not compile or
    run. Tracing and lowering stay on this thread; XLA's compiles, most of a candidate's time
    on a GPU, run `threads` at a time (default: one per CPU core, at most COMPILE_THREADS);
    the warm-up runs one after another. Candidates that lower to the same program (a kernel
    that cuts tilings to its call, as the Mosaic GPU kernels do for scale blocks, runs several
    of them alike) share the first one's executable: it is compiled and timed once."""
    lowered: list[Any] = []
    first_of: dict[str, int] = {}  # a program's text: the first candidate lowered to it
    twin_of: dict[int, int] = {}  # a later candidate with that program: the first
    for index, tiling in enumerate(candidates):
        fn = jax.jit(lambda arrays, tiling=tiling: call.invoke(as_called(call, arrays), tiling))
        try:
            lowering = fn.lower(example)
        except Exception:  # noqa: BLE001  (an illegal candidate is reported, not fatal)
            lowering = None
        if lowering is not None:
            first = first_of.setdefault(lowering.as_text(), index)
            if first != index:
                twin_of[index], lowering = first, None
        lowered.append(lowering)

    def compiled(lowering):
        try:
            return None if lowering is None else lowering.compile()
        except Exception:  # noqa: BLE001
            return None

    threads = threads or min(COMPILE_THREADS, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        executables = list(pool.map(compiled, lowered))
    for index, executable in enumerate(executables):
        if index in twin_of:  # (its first came before it: compiled, warmed up or failed)
            executables[index] = executables[twin_of[index]]
        elif executable is not None:
            try:
                jax.block_until_ready(executable(example))  # warm up
            except Exception:  # noqa: BLE001
                executables[index] = None
        advance()
    return executables


def time_candidates(executables: Sequence[Any], arrays: Sequence[tuple], repeats: int,
                    advance: Callable[[], None], calls_per_sample: int = 1
                    ) -> list[float | None]:
    """Milliseconds per call of each executable (the median over `repeats` turns of the mean
    over the group-size draws); None for a missing one. Each turn starts one executable
    further on: the default, candidate 0, is first in no more turns than any other. A sample
    makes `calls_per_sample` calls on each draw's operands back to back and waits once, at its
    end: on a GPU, a call waited for alone also times its round trip from the host, 0.1-0.3 ms
    at the fine-grained MoE shapes (the H100 scoreboard of 2026-11-28), which flattens every
    ratio there."""
    samples: list[list[float]] = [[] for _ in executables]
    # One executable shared by several candidates (compile_candidates) is timed once a turn,
    # and its times are theirs.
    first_of: dict[int, int] = {}
    for index, executable in enumerate(executables):
        if executable is not None:
            first_of.setdefault(id(executable), index)
    live = [(index, executables[index]) for index in first_of.values()]
    for turn in range(repeats):
        for index, executable in rotated(live, turn):
            # After an untimed call of its own executable, not another candidate's (on a GPU
            # what ran before cost up to 20%: kernelhub/_core/turns.py).
            draws = [functools.partial(executable, operand_set) for operand_set in arrays]
            samples[index].append(seconds_per_call(draws, calls_per_sample))
        advance()
    return [None if executable is None else
            statistics.median(samples[first_of[id(executable)]]) * 1e3
            for executable in executables]


def default_calls_per_sample() -> int:
    """Calls per timed sample where the caller gives none: one on a CPU, whose calls run on the
    calling thread (their round trip is nothing beside them), five on an accelerator."""
    return 1 if jax.default_backend() == "cpu" else 5


def _candidates(call: KernelCall) -> list[tuple[int, ...]]:
    """The implementation's candidates, its default first, each once."""
    default = tuple(call.space.default(call.kernel_problem))
    ordered = [default]
    for tiling in call.space.candidates(call.kernel_problem):
        if tuple(tiling) not in ordered:
            ordered.append(tuple(tiling))
    return ordered


def autotune(fn: Callable[..., Any], *example_args: Any, group_sizes: Any = None,
             skew: float | Sequence[float] = DEFAULT_SKEW, draws: int = 2, repeats: int = 5,
             min_gain: float = 0.03, seed: int = 0, progress: bool = True,
             time_limit: float | None = None,
             on_entry: Callable[[TuningKey, Entry], None] | None = None,
             calls_per_sample: int | None = None,
             **example_kwargs: Any) -> Tuning:
    """Tunes the tilings of every grouped-matmul kernel `fn` runs; see kernelhub.tuning."""
    started = _clock()
    if repeats < 1 or draws < 1:
        raise ValueError(f"repeats and draws must be >= 1, got repeats={repeats}, draws={draws}")
    if min_gain < 0:
        raise ValueError(f"min_gain must be >= 0, got {min_gain}")
    if calls_per_sample is None:
        calls_per_sample = default_calls_per_sample()
    if (isinstance(calls_per_sample, bool) or not isinstance(calls_per_sample, int)
            or calls_per_sample < 1):
        raise ValueError(f"calls_per_sample must be an int >= 1, got {calls_per_sample!r}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be a number of seconds > 0, got {time_limit}")
    symbolic = symbolic_shapes((example_args, example_kwargs))
    if symbolic:
        # A measurement needs arrays; a symbolic m gets the heuristic's tiling when exported.
        raise ValueError(f"autotune times kernels on concrete shapes: example arguments must "
                         f"have no symbolic dimension, got shape {symbolic[0]}; tune at the "
                         f"sizes you expect")
    recorder = Recorder()
    with active_table.activated(recorder):
        jax.eval_shape(fn, *example_args, **example_kwargs)
    if not recorder.calls:
        raise ValueError(
            "autotune: fn made no kernelhub grouped-matmul call whose tiling is left to the "
            "tuner (calls with an explicit tiling for a pass are not tuned)")
    plans = []
    for key, call in sorted(recorder.calls.items()):
        sizes, described = group_size_draws(call.problem, group_sizes, skew, draws, seed)
        plans.append((key, call, _candidates(call), sizes, described))
    # Each kernel: compile its candidates, time them all, then time the leader against the
    # default again on fresh operands (the confirmation).
    steps = sum(len(candidates) + 2 * repeats for _, _, candidates, _, _ in plans)
    entries = {}
    longest = 0.0  # seconds, the longest kernel's tuning so far
    with _progress(progress, steps) as advance:
        for key, call, candidates, sizes, described in plans:
            kernel_started = _clock()
            if time_limit is not None and entries and (
                    kernel_started - started + longest > time_limit):
                # The next kernel would likely end past the limit: it and the rest keep no
                # entry (their calls get the next source of tilings, the heuristic at last).
                skipped = [k.describe() for k, *_ in plans if k not in entries]
                warnings.warn(f"autotune: time_limit of {time_limit:g}s reached after "
                              f"{kernel_started - started:.0f}s; not tuned: "
                              + "; ".join(skipped), stacklevel=2)
                break
            arrays = [operands(call, vector, seed + i) for i, vector in enumerate(sizes)]
            executables = compile_candidates(call, candidates, arrays[0], advance)
            times = time_candidates(executables, arrays, repeats, advance, calls_per_sample)
            confirmed = None
            leader = _leader(key, candidates, times, min_gain)
            if leader is not None:
                fresh = [operands(call, vector, seed + len(sizes) + i)
                         for i, vector in enumerate(sizes)]
                confirmed = time_candidates([executables[0], executables[leader]], fresh,
                                            repeats, advance, calls_per_sample)
            else:
                for _ in range(repeats):
                    advance()
            entries[key] = _decide(candidates, times, leader, confirmed, described, min_gain)
            longest = max(longest, _clock() - kernel_started)
            if on_entry is not None:
                on_entry(key, entries[key])
    return Tuning(entries)


def _leader(key: TuningKey, candidates: list[tuple[int, ...]], times: list[float | None],
            min_gain: float) -> int | None:
    """The index of the fastest candidate when it beats the default by more than min_gain."""
    default_ms = times[0]
    if default_ms is None:
        raise RuntimeError(f"autotune: the default tiling {candidates[0]} of {key.describe()} "
                           f"failed to compile or run")
    best_ms, best = min((ms, index) for index, ms in enumerate(times) if ms is not None)
    # Within min_gain of the default is noise on a busy machine: keep the default.
    return best if best > 0 and best_ms * (1 + min_gain) < default_ms else None


def _decide(candidates: list[tuple[int, ...]], times: list[float | None], leader: int | None,
            confirmed: list[float | None] | None, described: str, min_gain: float) -> Entry:
    """The leader replaces the default only if it wins again, by more than min_gain, when the
    two are timed once more on fresh operands: the fastest of many noisy times is flattered
    by its noise (the winner's curse), and an independent second timing is not. The entry
    keeps the second timing's figures."""
    default, measured = candidates[0], tuple(zip(candidates, times))
    if leader is None or confirmed is None:
        return Entry(default, default, times[0], times[0], described, measured)
    default_ms, leader_ms = confirmed
    if leader_ms is not None and leader_ms * (1 + min_gain) < default_ms:
        return Entry(candidates[leader], default, leader_ms, default_ms, described, measured)
    return Entry(default, default, default_ms, default_ms, described, measured)


class _progress:
    """A rich progress bar on stderr (transient), or nothing."""

    def __init__(self, shown: bool, total: int):
        self.shown, self.total = shown, total

    def __enter__(self) -> Callable[[], None]:
        if not self.shown:
            self.bar = None
            return lambda: None
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("autotune", total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc_info) -> None:
        if self.bar is not None:
            self.bar.stop()
