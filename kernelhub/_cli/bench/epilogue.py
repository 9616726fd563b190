"""`kernelhub bench --epilogue`: grouped_matmul's fused epilogues against the same math unfused.

A MoE expert layer's gate-and-up projection: x [m, k] (rows sorted by expert), w [G, k, 2n]
(gate and up columns), bias [G, 2n], balanced group sizes; the output is in the operands' dtype.

- fused: one call, `grouped_matmul(x, w, sizes, glu="silu")`, or with `bias=` and
  `activation="gelu"`, or with `bias=`, `glu="swiglu_oai"` and `glu_layout="interleaved"`;
- unfused: the same math written by hand: z = grouped_matmul(x, w, sizes) in the output dtype
  (as hand-written mixed-precision code keeps it), plus each row's group bias, then the
  activation or gate in float32 in XLA, cast once.

Each pair runs forward, and forward + gradient (jax.value_and_grad of the output's float32 sum
with respect to x, w and the bias: the forward stays live, as in training), jitted and compiled
ahead. Their results must agree (TOLERANCE) before anything is timed. Time: the median of turns
in which fused and unfused alternate (load from other processes hits both), best of the input
draws. Memory: the compiled executable's memory_analysis(), temporaries + outputs; XLA's buffer
assignment reuses dead buffers, so this is the program's peak beyond its arguments (the same
arrays on both sides, left out).

The checkpoint-policy table times forward + gradient of the fused glu="silu" call as it is
(the forward keeps the pre-activation z for the backward pass), inside jax.checkpoint with a
policy that saves z by its name (kernelhub_pre_activation), and with nothing_saveable (the
backward pass runs the forward kernel again), and shows what each VJP keeps between its
forward and backward passes.

The GPU benchmark (gpu.py) takes its fused-against-unfused rows from `measure_gpu` here.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import kernelhub
from kernelhub._cli import _tables
from kernelhub._cli._group_sizes import group_sizes
from kernelhub._cli.bench.gpu_measurement import Measurement, Shape, relative_error
from kernelhub._cli.bench.timing import best_medians, median_seconds
from kernelhub._grouped_matmul import names
from kernelhub._grouped_matmul.groups import running_sum

GMM = names.GROUPED_MATMUL
PLATFORM = "xla"  # this benchmark's implementation unless --platform says otherwise
# (m, k, n, groups): rows, model dim, expert dim (w holds 2n columns: gate and up), experts.
SHAPE = (2048, 512, 512, 8)
QUICK_SHAPE = (256, 128, 128, 4)
FORWARD = "forward"
GRADIENT = "forward + grad"
PASSES = (FORWARD, GRADIENT)
# Largest max |fused - unfused| / max |unfused| accepted, per dtype. In bfloat16 the unfused z
# is rounded to bfloat16 before its epilogue, the fused one is not: they differ by its rounding.
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}
SWIGLU_OAI_LIMIT, SWIGLU_OAI_ALPHA = 7.0, 1.702


# ---------------------------------------------------------------- the two ways to compute it


@dataclasses.dataclass(frozen=True)
class Variant:
    """An epilogue: grouped_matmul's arguments for it, and the same math written by hand."""

    name: str
    glu: str | None = None
    activation: str | None = None
    bias: bool = False
    glu_layout: str = "concatenated"
    # Weights stored [G, 2n, k] (GPT-OSS's checkpoints, with interleaved halves), not [G, k, 2n].
    transpose_rhs: bool = False

    @property
    def features(self) -> list[str]:
        """The registry features a fused call uses (kernelhub/_grouped_matmul/names.py)."""
        used = [names.BIAS] if self.bias else []
        used += [names.GLU] if self.glu else []
        return used + ([names.ACTIVATION] if self.activation else [])

    @property
    def differentiated(self) -> tuple[int, ...]:
        """The arguments (x, w, bias, sizes) the gradient is taken with respect to."""
        return (0, 1, 2) if self.bias else (0, 1)

    def fused(self, gmm: Callable[..., jax.Array], dtype: Any,
              group_offset: Any = None) -> Callable[..., jax.Array]:
        def call(x, w, bias, sizes):
            return gmm(x, w, sizes, preferred_element_type=dtype, group_offset=group_offset,
                       bias=bias, activation=self.activation, glu=self.glu,
                       glu_layout=self.glu_layout, transpose_rhs=self.transpose_rhs)
        return call

    def unfused(self, gmm: Callable[..., jax.Array], dtype: Any, group_offset: int = 0,
                every_row_local: bool = True) -> Callable[..., jax.Array]:
        """The same math by hand. Without `every_row_local` (rows of other shards' groups, or
        past the sizes' sum), those rows are set to 0 as grouped_matmul sets them."""
        def call(x, w, bias, sizes):
            z = gmm(x, w, sizes, preferred_element_type=dtype, group_offset=group_offset,
                    transpose_rhs=self.transpose_rhs).astype(jnp.float32)
            local_groups = w.shape[0]
            if bias is not None or not every_row_local:
                groups, local = row_groups(sizes, group_offset, local_groups, x.shape[0])
            if bias is not None:
                z = z + bias.astype(jnp.float32)[groups]
            out = self.by_hand(z).astype(dtype)
            return out if every_row_local else jnp.where(local[:, None], out, jnp.zeros((), dtype))
        return call

    def by_hand(self, z: jax.Array) -> jax.Array:
        """The epilogue of float32 z [rows, 2n] in plain jax."""
        if self.glu is None:
            return ACTIVATIONS[self.activation](z)
        if self.glu_layout == "interleaved":
            gate, up = z[:, 0::2], z[:, 1::2]
        else:
            gate, up = jnp.split(z, 2, axis=1)
        return GLUS[self.glu](gate, up)


def _swiglu_oai(gate: jax.Array, up: jax.Array) -> jax.Array:
    gate = jnp.minimum(gate, SWIGLU_OAI_LIMIT)
    up = jnp.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return (up + 1.0) * gate * jax.nn.sigmoid(SWIGLU_OAI_ALPHA * gate)


ACTIVATIONS: dict[str | None, Callable[[jax.Array], jax.Array]] = {
    None: lambda z: z, "identity": lambda z: z, "relu": jax.nn.relu, "silu": jax.nn.silu,
    "gelu": lambda z: jax.nn.gelu(z, approximate=False),
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
    "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid,
}
GLUS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "silu": lambda gate, up: jax.nn.silu(gate) * up,
    "gelu": lambda gate, up: jax.nn.gelu(gate, approximate=False) * up,
    "gelu_tanh": lambda gate, up: jax.nn.gelu(gate, approximate=True) * up,
    "swiglu_oai": _swiglu_oai,
}

VARIANTS = (
    Variant("glu silu", glu="silu"),
    Variant("bias + gelu", activation="gelu", bias=True),
    Variant("bias + glu swiglu_oai, interleaved", glu="swiglu_oai", bias=True,
            glu_layout="interleaved"),
)
POLICY_VARIANT = VARIANTS[0]


def row_groups(sizes: jax.Array, group_offset: int, local_groups: int,
               m: int) -> tuple[jax.Array, jax.Array]:
    """(each row's local group, clipped into range; whether the row belongs to a local group)."""
    ends = running_sum(sizes)
    groups = jnp.searchsorted(ends, jnp.arange(m), side="right") - group_offset
    local = (groups >= 0) & (groups < local_groups)
    return jnp.clip(groups, 0, local_groups - 1), local


def with_gradient(fn: Callable[..., jax.Array], variant: Variant) -> Callable[..., Any]:
    """(sum of fn's float32 output, its gradients wrt x, w and the bias when there is one)."""
    return jax.value_and_grad(lambda x, w, bias, sizes: jnp.sum(fn(x, w, bias, sizes).astype(
        jnp.float32)), argnums=variant.differentiated)


def in_pass(fn: Callable[..., jax.Array], variant: Variant, pass_name: str) -> Callable[..., Any]:
    return fn if pass_name == FORWARD else with_gradient(fn, variant)


# ---------------------------------------------------------------- inputs, checks, memory


@dataclasses.dataclass(frozen=True)
class Layer:
    m: int
    k: int
    n: int  # the output's columns; w has 2n
    groups: int

    @property
    def description(self) -> str:
        return (f"x [{self.m}, {self.k}] @ w [{self.groups}, {self.k}, {2 * self.n}] -> "
                f"[{self.m}, {self.n}] (glu; [{self.m}, {2 * self.n}] with an activation), "
                f"{self.groups} balanced groups")


def inputs(layer: Layer, dtype: Any, bias: bool, rng: np.random.Generator) -> tuple:
    """(x, w, bias or None, sizes), freshly drawn."""
    dtype = jnp.dtype(dtype)
    x = jnp.asarray(rng.standard_normal((layer.m, layer.k), np.float32), dtype)
    w = jnp.asarray(rng.standard_normal((layer.groups, layer.k, 2 * layer.n), np.float32)
                    / np.sqrt(layer.k), dtype)
    b = (jnp.asarray(0.5 * rng.standard_normal((layer.groups, 2 * layer.n), np.float32), dtype)
         if bias else None)
    return x, w, b, jnp.asarray(group_sizes(layer.m, layer.groups, "balanced"))


def difference(actual: Any, expected: Any) -> float:
    """The largest max |actual - expected| / max |expected| over the arrays of two results."""
    pairs = zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True)
    return max(relative_error(a, e) for a, e in pairs)


def check_agreement(what: str, actual: Any, expected: Any, dtype: Any) -> float:
    """`difference`, raising if it is past the dtype's TOLERANCE: a benchmark of two functions
    that compute different things would measure nothing."""
    found = difference(actual, expected)
    bound = TOLERANCE[jnp.dtype(dtype).name]
    if not found <= bound:
        raise AssertionError(f"{what}: max |difference| / max |reference| = {found:.2e} > "
                             f"{bound:.0e}; not timing two different computations")
    return found


def peak_bytes(compiled: Any) -> int | None:
    """Temporaries + outputs of a compiled executable (memory_analysis()), None when the
    backend does not say."""
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError):
        return None
    if stats is None:
        return None
    return int(stats.temp_size_in_bytes + stats.output_size_in_bytes)


def vjp_bytes(fn: Callable[..., jax.Array], args: tuple, variant: Variant) -> int:
    """Bytes of the arrays jax.vjp of `fn` keeps for its backward pass (inputs included)."""
    wrt = variant.differentiated

    def pullback(*primals):
        def of_primals(*values):
            full = list(args)
            for i, value in zip(wrt, values):
                full[i] = value
            return fn(*full)
        return jax.vjp(of_primals, *primals)[1]

    kept = jax.eval_shape(pullback, *(args[i] for i in wrt))
    return sum(int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
               for leaf in jax.tree.leaves(kept) if hasattr(leaf, "dtype"))


def _compiled(fn: Callable[..., Any], args: tuple) -> Any:
    return jax.jit(fn).lower(*args).compile()


def _mib(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**20:.{2 if value < 10 * 2**20 else 1}f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if not ours or not theirs else f"{ours / theirs:.2f}"


# ---------------------------------------------------------------- fused against unfused


@dataclasses.dataclass(frozen=True)
class Row:
    variant: str
    pass_name: str
    fused: float  # seconds
    unfused: float
    fused_bytes: int | None
    unfused_bytes: int | None
    difference: float

    def cells(self) -> list[str]:
        return [self.variant, self.pass_name, f"{self.fused * 1e3:.2f}",
                f"{self.unfused * 1e3:.2f}", _ratio(self.fused, self.unfused),
                _mib(self.fused_bytes), _mib(self.unfused_bytes),
                _ratio(self.fused_bytes, self.unfused_bytes), f"{self.difference:.1e}"]


COLUMNS = ("epilogue", "pass", "fused ms", "unfused ms", "fused/unfused", "fused MiB",
           "unfused MiB", "fused/unfused MiB", "max diff")


def measure(gmm: Callable[..., jax.Array], layer: Layer, dtype: str, variant: Variant,
            pass_name: str, reps: int, draws: int) -> Row:
    """One epilogue in one pass, fused and unfused: checked to agree, then timed in turns."""
    rng = np.random.default_rng(0)
    args = inputs(layer, dtype, variant.bias, rng)
    fns = [in_pass(way(gmm, dtype), variant, pass_name)
           for way in (variant.fused, variant.unfused)]
    compiled = [_compiled(fn, args) for fn in fns]
    found = check_agreement(f"{variant.name}, {pass_name}, {dtype}", compiled[0](*args),
                            compiled[1](*args), dtype)

    def draw() -> list[Callable[[], Any]]:
        fresh = inputs(layer, dtype, variant.bias, rng)
        return [lambda run=run: run(*fresh) for run in compiled]

    fused, unfused = best_medians(draw, reps, draws)
    return Row(variant.name, pass_name, fused, unfused, *map(peak_bytes, compiled), found)


# ---------------------------------------------------------------- checkpoint policies


# What a jax.checkpoint around the fused call keeps of its pre-activation z: no checkpoint
# (z kept), a policy that saves z by its name, one that saves nothing (z recomputed).
POLICIES = {
    "no checkpoint": None,
    "save z": jax.checkpoint_policies.save_only_these_names(names.PRE_ACTIVATION),
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
}


@dataclasses.dataclass(frozen=True)
class PolicyRow:
    dtype: str
    seconds: dict[str, float]  # per policy
    peak: dict[str, int | None]
    kept: dict[str, int]  # what the VJP keeps between its passes
    difference: float  # the largest of each policy's results against no checkpoint's

    def cells(self) -> list[str]:
        cells = [SHORT_DTYPES.get(self.dtype, self.dtype)]
        for policy in POLICIES:
            cells += [f"{self.seconds[policy] * 1e3:.2f}", _mib(self.peak[policy]),
                      _mib(self.kept[policy])]
        return cells + [f"{self.difference:.1e}"]


POLICY_COLUMNS = ("dtype", *(f"{policy} {what}" for policy in POLICIES
                             for what in ("ms", "MiB", "VJP keeps MiB")), "max diff")
SHORT_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def measure_policies(gmm: Callable[..., jax.Array], layer: Layer, dtype: str, reps: int,
                     draws: int, variant: Variant = POLICY_VARIANT) -> PolicyRow:
    """Forward + gradient of the fused call under each checkpoint policy, timed in turns."""
    rng = np.random.default_rng(0)
    args = inputs(layer, dtype, variant.bias, rng)
    fused = variant.fused(gmm, dtype)
    under = {policy: fused if chosen is None else jax.checkpoint(fused, policy=chosen)
             for policy, chosen in POLICIES.items()}
    compiled = {policy: _compiled(with_gradient(fn, variant), args)
                for policy, fn in under.items()}
    kept = {policy: vjp_bytes(fn, args, variant) for policy, fn in under.items()}
    runs = list(compiled.values())
    found = max(check_agreement(f"checkpoint policy {policy}, {dtype}", run(*args),
                                runs[0](*args), dtype)
                for policy, run in compiled.items())

    def draw() -> list[Callable[[], Any]]:
        fresh = inputs(layer, dtype, variant.bias, rng)
        return [lambda run=run: run(*fresh) for run in runs]

    seconds = dict(zip(POLICIES, best_medians(draw, reps, draws)))
    peak = {policy: peak_bytes(run) for policy, run in compiled.items()}
    return PolicyRow(dtype, seconds, peak, kept, found)


# ---------------------------------------------------------------- the command


@dataclasses.dataclass(frozen=True)
class Table:
    title: str
    columns: Sequence[str]
    results: list[Row] | list[PolicyRow]
    notes: str

    @property
    def rows(self) -> list[list[str]]:
        return [result.cells() for result in self.results]


NOTES = ("fused/unfused (time, MiB): below 1, the fused call is faster or smaller. MiB: "
         "temporaries + outputs of the compiled executable (memory_analysis()), arguments left "
         "out. unfused: z = grouped_matmul(x, w, sizes) in the output dtype, + bias[group of "
         "row], then the activation or gate in float32. max diff: max |fused - unfused| / max "
         "|unfused| over the outputs (and gradients), checked before timing. forward + grad: "
         "jax.value_and_grad of the output's sum wrt x, w (and the bias): the fused forward "
         "kernel writes the pre-activation z, the epilogue follows in XLA, and z is kept for "
         "the backward pass.")
POLICY_NOTES = ("Forward + grad of the fused glu=\"silu\" call: as it is (no checkpoint: the "
                "pre-activation z is kept), inside jax.checkpoint with save_only_these_names("
                "\"kernelhub_pre_activation\") (z kept by its name), and with nothing_saveable "
                "(the backward pass runs the forward kernel again). VJP keeps: the arrays "
                "jax.vjp holds for the backward pass, inputs included. max diff: each policy's "
                "results against no checkpoint's.")


def layers(args: argparse.Namespace) -> list[Layer]:
    m, k, n, groups = QUICK_SHAPE if args.quick else SHAPE
    return [Layer(m, k, n, count) for count in (getattr(args, "groups", None) or [groups])]


def tables(args: argparse.Namespace, status: Callable[[str], Any] | None = None) -> list[Table]:
    """Every table of the run: fused against unfused per layer and dtype, then the checkpoint
    policies per layer. --quick: a small layer, glu="silu" only, and only the last of --dtypes
    (bfloat16 by default): each pair costs two compilations of about a second here."""
    platform = args.platform or PLATFORM
    reps = args.reps or (3 if args.quick else 5)
    draws = args.draws or (1 if args.quick else 2)
    variants = VARIANTS[:1] if args.quick else VARIANTS
    dtypes = args.dtypes[-1:] if args.quick else args.dtypes
    gmm = kernelhub.get(GMM, platform=platform)
    timing = f"median of {reps} turns" + (f", best of {draws} input draws" if draws > 1 else "")
    run = "" if not args.quick else " --quick"
    notes = NOTES
    status = status or (lambda text: None)
    out = []
    for layer in layers(args):
        for dtype in dtypes:
            rows = []
            for variant in variants:
                for pass_name in PASSES:
                    status(f"{variant.name}, {pass_name}, {dtype}, {layer.groups} groups")
                    rows.append(measure(gmm, layer, dtype, variant, pass_name, reps, draws))
            title = _tables.run_header(
                f"epilogue{run}", f"fused against unfused, {dtype} operands and output, "
                f"{layer.description}; {platform}; {timing}")
            out.append(Table(title, COLUMNS, rows, notes))
        rows = []
        for dtype in dtypes:
            status(f"checkpoint policies, {dtype}, {layer.groups} groups")
            rows.append(measure_policies(gmm, layer, dtype, reps, draws))
        title = _tables.run_header(
            f"epilogue{run}", f"checkpoint policies, forward + grad of glu=\"silu\", "
            f"{', '.join(dtypes)} operands and output, {layer.description}; "
            f"{platform}; {timing}")
        out.append(Table(title, POLICY_COLUMNS, rows, POLICY_NOTES))
    return out


def markdown(done: Sequence[Table]) -> str:
    return "\n".join(_tables.markdown(f"{t.title}\n\n{t.notes}", t.columns, t.rows)
                     for t in done)


def run_epilogue(args: argparse.Namespace) -> int:
    console = _tables.console()
    started = time.perf_counter()
    with console.status("epilogue") as shown:
        done = tables(args, lambda text: shown.update(text))
    for table in done:
        console.print(_tables.table(table.title, table.columns, table.rows))
        console.print(table.notes)
    console.print(f"{time.perf_counter() - started:.0f} s in all, compilation included")
    if args.out:
        _tables.write(args.out, markdown(done))
        console.print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------- rows of the GPU benchmark

GPU_PATTERN = "balanced"
# GPT-OSS's layer as its checkpoints store it: the Mosaic GPU gmm reads those weights in place,
# where it gathers interleaved [G, k, 2n] ones into the concatenated layout first.
GPU_VARIANTS = (VARIANTS[0], VARIANTS[2],
                Variant("bias + glu swiglu_oai, interleaved, w [G, 2n, k]", glu="swiglu_oai",
                        bias=True, glu_layout="interleaved", transpose_rhs=True))


class EpilogueMeasurement(Measurement):
    """A main-table measurement of one epilogue in one pass (kept in `pass_name`): the fused
    call as kernelhub, the unfused one as its peer; max_relative_error is between the two."""

    PEERS = {"unfused": 2}


def measure_gpu(shape: Shape, dtype: Any, reps: int, warmup: int, platform: str = "triton",
                variants: Sequence[Variant] = GPU_VARIANTS) -> list[EpilogueMeasurement]:
    """Fused against unfused at one of the GPU benchmark's shapes (gate and up: w [local, k,
    2n], or [local, 2n, k] for a variant so stored), with its group offset; FLOPs count the
    computed rows (forward + grad: 3x)."""
    sizes = jnp.asarray(group_sizes(shape.m, shape.experts, GPU_PATTERN))
    first = int(sizes[: shape.offset].sum())
    rows = slice(first, first + int(sizes[shape.offset: shape.offset + shape.local].sum()))
    every_row_local = rows.stop - rows.start == shape.m
    keys = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(keys[0], (shape.m, shape.k), dtype)
    w = jax.random.normal(keys[1], (shape.local, shape.k, 2 * shape.hidden), dtype) / float(
        np.sqrt(shape.k))
    bias = 0.5 * jax.random.normal(keys[2], (shape.local, 2 * shape.hidden), dtype)
    gmm = kernelhub.get(GMM, platform=platform)
    results = []
    stored = {False: w}
    for variant in variants:
        if variant.transpose_rhs not in stored:
            stored[variant.transpose_rhs] = jnp.swapaxes(w, 1, 2)  # made once, untimed
        args = (x, stored[variant.transpose_rhs], bias if variant.bias else None, sizes)
        for pass_name in PASSES:
            fused = jax.jit(in_pass(variant.fused(gmm, dtype, shape.offset), variant,
                                    pass_name))
            unfused = jax.jit(in_pass(variant.unfused(gmm, dtype, shape.offset, every_row_local),
                                      variant, pass_name))
            fns = {"kernelhub": lambda fn=fused: fn(*args),
                   "unfused": lambda fn=unfused: fn(*args)}
            seconds = median_seconds(fns, reps, warmup)
            error = None
            if seconds["kernelhub"] is not None and seconds["unfused"] is not None:
                error = difference(fns["kernelhub"](), fns["unfused"]())
            flops = 2.0 * (rows.stop - rows.start) * shape.k * 2 * shape.hidden
            flops *= 3 if pass_name == GRADIENT else 1
            # The Triton kernels' rows keep the names of the runs before the Mosaic GPU ones.
            label = f"{variant.name}, {pass_name}" + (
                "" if platform == "triton" else f" ({platform})")
            results.append(EpilogueMeasurement(shape, GPU_PATTERN, label, flops, seconds, error))
    return results


def gpu_one_line(m: EpilogueMeasurement) -> str:
    return m.one_line(f"{m.pass_name:45s}")


def gpu_markdown_lines(measurements: Sequence[EpilogueMeasurement]) -> list[str]:
    lines = ["## Fused epilogues (gate and up projection, w [local, k, 2n] unless named)", "",
             f"{GPU_PATTERN} group sizes, output in the operands' dtype. fused: one "
             "grouped_matmul call with the epilogue; unfused: grouped_matmul, then + bias[group "
             "of row] and the gate in XLA. forward + grad: jax.value_and_grad of the output's "
             "sum (FLOPs 3x). TFLOP/s count the matmuls' FLOPs; vs unfused: the fused call's speed "
             "over the unfused one's (> 1: fused is faster); error: fused against unfused.",
             "", "| shape | epilogue, pass | fused | unfused | vs unfused "
             "| max rel. error vs unfused |", "|---|---|---:|---:|---:|---:|"]
    return lines + [m.markdown_row(m.pass_name) for m in measurements] + [""]


def gpu_record(m: EpilogueMeasurement) -> dict[str, Any]:
    return m.record("pass")
