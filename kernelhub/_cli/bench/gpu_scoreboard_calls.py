"""The calls the GPU scoreboard times for one pass: kernelhub's implementations and its peers,
each one jitted kernel call on operands made once per shape, group sizes and format.

kernelhub's calls take all m rows and `group_offset` (rows outside the local experts are
skipped by the kernel); the peers, which take no offset, get the local rows and experts sliced
beforehand (not timed). With fp8, every pass quantizes its two operands along its contraction
(one float32 scale per row or column, kernelhub.quantize), once: the peers get slices of the
same values and scales, so every implementation multiplies the same numbers.

| pass | kernelhub | lax.ragged_dot / tokamax | cublas_dense (the same FLOPs, one matmul) |
|---|---|---|---|
| forward | gmm(x, w) | x[R] against w | x[R] @ w[0] |
| lhs_gradient | gmm(dy, w, transpose_rhs) | dy[R] against w, contracting n | dy[R] @ w[0]^T |
| rhs_gradient | tgmm(x^T, dy) | ragged contraction over R | x[R]^T @ dy[R] |

kernelhub's bf16 rhs_gradient takes x [m, k] and transposes it inside the timed call, as the
weight gradient of a training step does (tokamax takes x [R, k] too): a kernel that reads x as
it is pays nothing for it, one that needs x^T pays its copy. fp8 takes x^T quantized along m.

With `heuristic_rows`, each GPU kernel platform also gets a row `kernelhub:<platform>@heuristic`:
the same call lowered under `kernelhub.tuning.heuristic()`, so one run shows a tuning table's
rows before and after, beside the peers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import kernelhub
import kernelhub.export
import kernelhub.tuning
from kernelhub._cli._group_sizes import group_sizes
from kernelhub._cli.bench import gpu_tokamax
from kernelhub._cli.bench.gpu_measurement import Shape

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"
OUT = jnp.bfloat16
FP8 = jnp.float8_e4m3fn
# The op each pass is a call of.
PASS_OP = {"forward": GMM, "lhs_gradient": GMM, "rhs_gradient": TGMM}
# jax.lax's ragged dot for the two gradient passes: d lhs contracts the weights' last axis;
# d rhs (lhs [k, R], rhs [R, n]) contracts the ragged rows (docs in JAX-NOTES).
_LAX_LHS_GRADIENT = jax.lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), [0], [0])
_LAX_RHS_GRADIENT = jax.lax.RaggedDotDimensionNumbers((((1,), (0,)), ((), ())), [1], [])


@dataclasses.dataclass
class Operands:
    """One shape's inputs at one group-size pattern: bf16 activations x [m, k], weights of the
    local experts w [local, k, n] and an output cotangent dy [m, n]."""

    shape: Shape
    pattern: str
    sizes: jax.Array  # every expert's
    local_sizes: jax.Array
    first_row: int
    rows: int  # the computed rows R, those of the local experts
    x: jax.Array
    w: jax.Array
    dy: jax.Array

    @property
    def local(self) -> slice:
        return slice(self.first_row, self.first_row + self.rows)


def make_operands(shape: Shape, pattern: str, seed: int = 0) -> Operands:
    sizes = group_sizes(shape.m, shape.experts, pattern)
    local = sizes[shape.offset: shape.offset + shape.local]
    keys = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(keys[0], (shape.m, shape.k), jnp.bfloat16)
    # A Python float keeps bf16 (a numpy float64 would promote the weights to float32).
    w = jax.random.normal(keys[1], (shape.local, shape.k, shape.n), jnp.bfloat16) / float(
        np.sqrt(shape.k))
    dy = jax.random.normal(keys[2], (shape.m, shape.n), jnp.bfloat16)
    return Operands(shape, pattern, jnp.asarray(sizes), jnp.asarray(local),
                    int(sizes[: shape.offset].sum()), int(local.sum()), x, w, dy)


@dataclasses.dataclass
class Call:
    """One implementation of one pass: a function and its arguments, or the reason there is
    none; `cut` takes from its result the part every implementation computes (the local rows),
    None where it computes something else (the dense peer)."""

    implementation: str
    fn: Callable[..., Any] | None = None
    args: tuple = ()
    default: bool = False
    note: str | None = None
    cut: Callable[[Any], Any] | None = None
    check: Callable[[], str] | None = None  # a finding for the note (tokamax's VJP check)
    tilings: list[dict[str, Any]] | None = None  # kernelhub's: [{"kernel", "tiling"}] per call


@dataclasses.dataclass
class PassOperands:
    """One pass's two operands, as kernelhub takes them (all rows) and as the peers take them
    (local rows), quantized or not; `scales` says how a peer's fp8 product is scaled back."""

    ours: tuple
    local: tuple  # lax's and the dense peer's layout
    tokamax: tuple  # tokamax's layout (rhs_gradient: x [R, k] rather than x^T); fp8: pairs
    scales: tuple = ()  # fp8: the local operands' scales, each of the same rank as its values


def kernelhub_operands(x: Any, w: Any, dy: Any, pass_name: str) -> tuple[Any, Any]:
    """kernelhub's bf16 operands of a pass (arrays or shape structs): the weight gradient takes
    x itself (its call transposes it, `_pass_function`)."""
    return {"forward": (x, w), "lhs_gradient": (dy, w), "rhs_gradient": (x, dy)}[pass_name]


def pass_operands(ops: Operands, pass_name: str, dtype: str) -> PassOperands:
    r = ops.local
    if pass_name == "forward":
        left, right, left_axis, right_axis = ops.x, ops.w, 1, 1
    elif pass_name == "lhs_gradient":
        left, right, left_axis, right_axis = ops.dy, ops.w, 1, 2
    else:
        left, right, left_axis, right_axis = ops.x.T, ops.dy, 1, 0
    if dtype == "bf16":
        ours = kernelhub_operands(ops.x, ops.w, ops.dy, pass_name)
        if pass_name == "rhs_gradient":
            local = (left[:, r], right[r])
            return PassOperands(ours, local, (ops.x[r], local[1]))
        local = (left[r], right)
        return PassOperands(ours, local, local)
    ql = kernelhub.quantize(left, FP8, axis=left_axis)
    qr = kernelhub.quantize(right, FP8, axis=right_axis)
    ours = (ql, qr)
    if pass_name == "rhs_gradient":
        values = (ql.values[:, r], qr.values[r])
        scales = (ql.scale, qr.scale)  # [k, 1] and [1, n]: no row of theirs is cut
        # tokamax's d rhs takes x [R, k]: the same values and scales, transposed.
        token = ((values[0].T, scales[0].T), (values[1], scales[1]))
    else:
        values = (ql.values[r], qr.values)
        scales = (ql.scale[r], qr.scale)  # [R, 1] and [g, 1, n] or [g, k, 1]
        token = ((values[0], scales[0]), (values[1], scales[1]))
    # tokamax's operands stay (values, scale) pairs, made QArrays inside its timed function: no
    # qwix import where tokamax is absent.
    return PassOperands(ours, values, token, scales)


# ---------------------------------------------------------------- kernelhub


def kernelhub_platforms(op: str) -> list[str]:
    """Every platform with a GPU implementation of `op` (and the portable ones), from the
    registry: a platform registered later (Mosaic GPU, say) gets its rows with no change here.
    On a host without a GPU the same platforms run their interpret-mode stand-ins (smoke)."""
    specs = kernelhub.implementations(op)
    return sorted({spec.platform.value for spec in specs
                   if spec.backend.value in ("gpu", "any")})


def default_platform(op: str, dtype: str) -> str | None:
    """The platform a plain call of `op` picks here (with quantized operands for fp8)."""
    try:
        return kernelhub.resolve(op, features=["quantized"] if dtype == "fp8" else []).platform.value
    except Exception:  # noqa: BLE001 - no default here: no row is marked
        return None


def _pass_function(call: Callable[..., Any], pass_name: str, shape: Any,
                   dtype: str = "bf16") -> Callable[..., Any]:
    """`call` (an op's entry point) jitted as the pass makes it."""
    if pass_name == "forward":
        return jax.jit(lambda x, w, s: call(
            x, w, s, preferred_element_type=OUT, group_offset=shape.offset))
    if pass_name == "lhs_gradient":
        return jax.jit(lambda dy, w, s: call(
            dy, w, s, preferred_element_type=OUT, group_offset=shape.offset,
            transpose_rhs=True))
    if dtype == "bf16":  # x [m, k], transposed here as the weight gradient does
        return jax.jit(lambda x, dy, s: call(
            x.T, dy, s, preferred_element_type=OUT, group_offset=shape.offset,
            num_actual_groups=shape.local))
    return jax.jit(lambda xt, dy, s: call(
        xt, dy, s, preferred_element_type=OUT, group_offset=shape.offset,
        num_actual_groups=shape.local))


# The kernel calls of each GPU platform in a lowering (kernelhub.export.kernels_by_platform).
_KERNEL_PLATFORM = {"mosaic_gpu": "mosaic", "triton": "triton"}


def lowered_platform(fn: Callable[..., Any], args: Sequence[Any]) -> str | None:
    """The platform whose kernels a plain call's lowering for this GPU holds: per call, a
    shipped or active table can pick another than `kernelhub.resolve`'s (docs/dispatch.md,
    "Per call"). None where that cannot be told (no GPU here, or no kernel in it)."""
    try:
        exported = kernelhub.export.export(fn, *args, platforms=("cuda",))
        kinds = kernelhub.export.kernels_by_platform(exported).get("cuda", {})
    except Exception:  # noqa: BLE001 - then the registered default marks the row
        return None
    found = {_KERNEL_PLATFORM[kind] for kind in kinds if kind in _KERNEL_PLATFORM}
    return found.pop() if len(found) == 1 else None


def _tables_may_choose(device_kind: str | None = None) -> bool:
    """Whether a tuning table can make a plain call lower another kernel than resolve's on
    device_kind (default: the first device's): one named by KERNELHUB_TUNING, or one shipped
    for it with entries of two kernels. Else the lowering is not read (an export per pass
    costs the run's GPU seconds)."""
    if os.environ.get("KERNELHUB_TUNING"):
        return True
    table = kernelhub.tuning.shipped(device_kind or jax.devices()[0].device_kind)
    return len({key.implementation for key in table.entries}) > 1


# The platforms whose tilings a GPU table holds: they get heuristic rows on request.
TABLED_PLATFORMS = ("mosaic", "triton")
HEURISTIC = "@heuristic"


class UnderHeuristic:
    """A jitted pass lowered and run with every tuning table off (the heuristic's tilings)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def lower(self, *args: Any) -> Any:
        with kernelhub.tuning.heuristic():
            return self.fn.lower(*args)

    def __call__(self, *args: Any) -> Any:
        with kernelhub.tuning.heuristic():
            return self.fn(*args)


def kernelhub_calls(ops: Operands, pass_name: str, dtype: str,
                    operands: PassOperands, heuristic_rows: bool = False) -> list[Call]:
    op = PASS_OP[pass_name]
    shape = ops.shape
    args = (*operands.ours, ops.sizes)
    default = default_platform(op, dtype)
    if jax.default_backend() == "gpu" and _tables_may_choose():
        default = lowered_platform(_pass_function(kernelhub.get(op), pass_name, shape, dtype),
                                   args) or default
    rows = ops.local
    calls = []
    for platform in kernelhub_platforms(op):
        implementation = f"kernelhub:{platform}"
        try:
            call = kernelhub.get(op, platform=platform)
        except Exception as error:  # noqa: BLE001 - the row says why
            calls.append(Call(implementation, note=_reason(error)))
            continue
        fn = _pass_function(call, pass_name, shape, dtype)
        cut = (lambda out: out) if pass_name == "rhs_gradient" else (lambda out: out[rows])
        calls.append(Call(implementation, fn, args, default=platform == default, cut=cut,
                          tilings=kernel_tilings(fn, args)))
        if heuristic_rows and platform in TABLED_PLATFORMS:
            with kernelhub.tuning.heuristic():
                tilings = kernel_tilings(fn, args)
            calls.append(Call(implementation + HEURISTIC, UnderHeuristic(fn), args, cut=cut,
                              tilings=tilings))
    return calls


def kernel_tilings(fn: Callable[..., Any], args: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The kernel calls `fn` makes for `args` (traced, not run), each with the tiling it runs:
    the table's in force (KERNELHUB_TUNING, the shipped one) or the heuristic's. None where
    it cannot be traced (its row then says why it failed)."""
    from kernelhub._grouped_matmul import active_table, tables

    observer = tables.Observer(tables.active())
    try:
        with active_table.activated(observer):
            jax.eval_shape(fn, *args)
    except Exception:  # noqa: BLE001 - compiling it reports the error in the row's note
        return None
    return [{"kernel": call.problem.kernel.value,
             "tiling": list(observer.tiling_for(call) or call.space.default(call.kernel_problem))}
            for call in observer.calls]


# ---------------------------------------------------------------- peers


def local_rows_note(ops: Operands, pass_name: str) -> str | None:
    """What a peer given the local rows only does not do where the shape has other experts'
    rows: write them (zeros), which kernelhub's call and the roofline's bytes count."""
    if pass_name == "rhs_gradient" or ops.rows == ops.shape.m:
        return None
    columns = ops.shape.n if pass_name == "forward" else ops.shape.k
    megabytes = (ops.shape.m - ops.rows) * columns * jnp.dtype(OUT).itemsize / 1e6
    return (f"given the local rows only (no group_offset): {megabytes:.3g} MB of the "
            f"roofline's bytes, the other experts' rows of the output, not written")


def lax_call(ops: Operands, pass_name: str, dtype: str, operands: PassOperands) -> Call:
    """jax.lax.ragged_dot(_general) on the local rows; fp8: on the stored values with float32
    sums, then scaled per row and column as a user of lax would."""
    sizes = ops.local_sizes

    def product(left, right, s, result):
        if pass_name == "forward":
            return jax.lax.ragged_dot(left, right, s, preferred_element_type=result)
        numbers = _LAX_LHS_GRADIENT if pass_name == "lhs_gradient" else _LAX_RHS_GRADIENT
        return jax.lax.ragged_dot_general(left, right, s, numbers, preferred_element_type=result)

    if dtype == "bf16":
        fn = jax.jit(lambda left, right, s: product(left, right, s, OUT))
        return Call("lax.ragged_dot", fn, (*operands.local, sizes), cut=lambda out: out,
                    note=local_rows_note(ops, pass_name))

    def scaled(left, right, left_scale, right_scale, s):
        total = product(left, right, s, jnp.float32)
        return (total * _scale_of_result(pass_name, left_scale, right_scale, s, total.shape)
                ).astype(OUT)

    return Call("lax.ragged_dot", jax.jit(scaled), (*operands.local, *operands.scales, sizes),
                cut=lambda out: out, note=local_rows_note(ops, pass_name))


def _scale_of_result(pass_name: str, left_scale, right_scale, sizes, shape) -> jax.Array:
    """The scale of each element of a peer's fp8 result: row scale times column scale, the
    column scale being its expert's (found per row by repeating the experts' scales)."""
    if pass_name == "rhs_gradient":  # [g, k, n] from scales [k, 1] and [1, n]
        return (left_scale * right_scale)[None]
    per_expert = right_scale[:, 0, :] if pass_name == "forward" else right_scale[:, :, 0]
    per_row = jnp.repeat(per_expert, sizes, axis=0, total_repeat_length=shape[0])
    return left_scale * per_row


def dense_call(ops: Operands, pass_name: str, dtype: str, operands: PassOperands) -> Call:
    """cuBLAS on the same FLOPs as one matmul: the local rows against the first expert."""
    left, right = operands.local
    if pass_name == "rhs_gradient":
        dims = (((1,), (0,)), ((), ()))
    else:
        right = right[0]
        dims = (((1,), (1 if pass_name == "lhs_gradient" else 0,)), ((), ()))
    if dtype == "bf16":
        fn = jax.jit(lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=OUT))
        return Call("cublas_dense", fn, (left, right))
    left_scale, right_scale = operands.scales
    if pass_name != "rhs_gradient":
        right_scale = right_scale[0]
        right_scale = right_scale if pass_name == "forward" else right_scale.T

    def scaled(a, b, sa, sb):
        # fp8 x fp8 summed in float32: XLA sends it to cuBLASLt's fp8 matmul on a Hopper.
        total = jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
        return (total * sa * sb).astype(OUT)

    return Call("cublas_dense", jax.jit(scaled), (left, right, left_scale, right_scale))


def tokamax_calls(ops: Operands, pass_name: str, dtype: str, operands: PassOperands,
                  names: tuple[str, ...]) -> list[Call]:
    tokamax, missing = gpu_tokamax.load()
    if tokamax is None:
        return [Call(f"tokamax:{name}", note=missing) for name in names]
    calls = []
    for name in names:
        implementation = f"tokamax:{name}"
        if (absent := gpu_tokamax.unavailable(tokamax, name)) is not None:
            calls.append(Call(implementation, note=absent))
            continue
        call = gpu_tokamax.pass_function(tokamax, name, pass_name)
        if dtype == "bf16":
            fn = jax.jit(call)
        else:
            def fn_quantized(left, right, s, call=call):
                return call(gpu_tokamax.quantized(*left), gpu_tokamax.quantized(*right), s)

            fn = jax.jit(fn_quantized)
        args = (*operands.tokamax, ops.local_sizes)
        check = None
        if pass_name != "forward" and dtype == "bf16":
            r = ops.local

            def check(name=name, r=r):
                return gpu_tokamax.vjp_check(tokamax, name, pass_name, ops.x[r], ops.w,
                                             ops.dy[r], ops.local_sizes)

        notes = [local_rows_note(ops, pass_name),
                 None if dtype == "bf16" or pass_name == "forward" else
                 "fp8: its VJP's call (the VJP is not traced with quantized operands)"]
        calls.append(Call(implementation, fn, args, cut=lambda out: out, check=check,
                          note="; ".join(n for n in notes if n) or None))
    return calls


def implementation_names(pass_name: str, dtype: str, tokamax_names: tuple[str, ...],
                         only: tuple[str, ...] | None = None,
                         heuristic_rows: bool = False) -> list[tuple[str, bool]]:
    """(implementation, default) of every row of a pass, without making its calls: the rows a
    run out of time still writes, each with its reason. `only` keeps the names it lists."""
    op = PASS_OP[pass_name]
    default = default_platform(op, dtype)
    ours = sorted(((f"kernelhub:{p}", p == default) for p in kernelhub_platforms(op)),
                  key=lambda item: not item[1])
    if heuristic_rows:
        ours += [(f"kernelhub:{p}{HEURISTIC}", False) for p in kernelhub_platforms(op)
                 if p in TABLED_PLATFORMS]
    names = [*ours, ("cublas_dense", False), ("lax.ragged_dot", False),
             *((f"tokamax:{name}", False) for name in tokamax_names)]
    return [item for item in names if only is None or item[0] in only]


def calls(ops: Operands, pass_name: str, dtype: str, tokamax_names: tuple[str, ...],
          only: tuple[str, ...] | None = None, heuristic_rows: bool = False) -> list[Call]:
    """Every implementation of one pass: kernelhub's (the default first), then the peers;
    `only` keeps the implementations it names (no call is made for the others)."""
    operands = pass_operands(ops, pass_name, dtype)
    wanted = (lambda name: only is None or name in only)
    made = sorted(kernelhub_calls(ops, pass_name, dtype, operands, heuristic_rows),
                  key=lambda c: not c.default)
    if wanted("cublas_dense"):
        made.append(dense_call(ops, pass_name, dtype, operands))
    if wanted("lax.ragged_dot"):
        made.append(lax_call(ops, pass_name, dtype, operands))
    names = tuple(name for name in tokamax_names if wanted(f"tokamax:{name}"))
    if names:
        made += tokamax_calls(ops, pass_name, dtype, operands, names)
    return [call for call in made if wanted(call.implementation)]


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"
