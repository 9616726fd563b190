"""tokamax's ragged dot as a peer of the GPU scoreboard: one kernel call per pass, each the call
tokamax's own VJP makes for that pass, and a check that it is.

tokamax (https://github.com/openxla/tokamax) is not a dependency: the GPU machine has no network,
so scripts/gpu_bench.sh installs the wheel carried in .gpu-wheels/ (scripts/gpu_wheels.sh fetches
it here; docs/gpu.md). Where it cannot be imported, or an implementation refuses the call (no
GPU, an unsupported architecture, an API its jax lacks), the row carries the reason instead.

tokamax gets the local rows and experts, as jax.lax.ragged_dot does (its group_offset, where an
implementation takes it, leaves the other experts' rows unwritten unless zero_initialize). Its VJP
computes d lhs as a ragged dot of the cotangent with the weights' last two axes contracted
(`(([1], [2]), ...)`, which its kernels run on the transposed weights) and d rhs as a ragged dot
whose contraction (the rows) is ragged.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

# The GPU implementations tokamax has (`implementation=` of tokamax.ragged_dot); "mosaic" is its
# Mosaic GPU kernel on an NVIDIA device.
IMPLEMENTATIONS = ("triton", "mosaic")
# Runs on a CPU: smoke mode times it as well, so that the tokamax path is exercised end to end
# where neither GPU implementation can run.
SMOKE_STAND_IN = "xla"

# Lists, as tokamax spells them: it picks a kernel by comparing dimension numbers for equality,
# and ([1], [2]) is not equal to ((1,), (2,)).
_LHS_GRADIENT = jax.lax.RaggedDotDimensionNumbers((([1], [2]), ([], [])), [0], [0])
_RHS_GRADIENT = jax.lax.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])
DIMENSIONS = {"lhs_gradient": _LHS_GRADIENT, "rhs_gradient": _RHS_GRADIENT}


@functools.cache
def load() -> tuple[Any, str | None]:
    """(the tokamax module, None), or (None, why it cannot be used here); tried once, as a
    failing import is slow and fails the same way for every pass."""
    try:
        import tokamax
    except Exception as error:  # noqa: BLE001 - any import failure is the row's reason
        if isinstance(error, ModuleNotFoundError) and error.name == "tokamax":
            return None, ("tokamax is not installed here (carry .gpu-wheels, made by "
                          "scripts/gpu_wheels.sh: docs/gpu.md)")
        return None, f"tokamax cannot be imported here: {_reason(error)}"
    # tokamax reads absl flags, and absl parses sys.argv on the first read: the benchmark's own
    # arguments would be refused. Its flags keep their defaults.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return tokamax, None


def version(tokamax: Any) -> str:
    return str(getattr(tokamax, "__version__", "?"))


# tokamax registers an implementation only where its module imports (its Triton ragged dot, a
# jax-triton kernel since 0.0.15, needs jax-triton 0.4 and Triton 3.7); asked for one it lacks,
# it says only "Unknown implementation". The module's own import error says why; its name is
# the implementation's, with or without tokamax's "pallas_" and "_gpu".
_MODULE_NAMES = ("{}", "pallas_{}", "pallas_{}_gpu")


def unavailable(tokamax: Any, implementation: str) -> str | None:
    """Why this tokamax has no `implementation` here, or None where it has it (or where its
    layout is not the one this function knows: the call then says for itself)."""
    try:
        api = importlib.import_module("tokamax._src.ops.ragged_dot.api")
        registered = set(api.IMPLEMENTATIONS)
    except Exception:  # noqa: BLE001 - another layout: the call reports its own failure
        return None
    if not registered.isdisjoint((implementation, f"{implementation}_gpu")):
        return None
    reasons = []
    for module in (name.format(implementation) for name in _MODULE_NAMES):
        try:
            importlib.import_module(f"tokamax._src.ops.ragged_dot.{module}")
        except ModuleNotFoundError as error:
            if error.name != f"tokamax._src.ops.ragged_dot.{module}":
                reasons.append(_reason(error))
        except Exception as error:  # noqa: BLE001 - the import's failure is the reason
            reasons.append(_reason(error))
    return (f"tokamax {version(tokamax)} has no {implementation} implementation here"
            + (f" ({'; '.join(reasons)})" if reasons else ""))


def pass_function(tokamax: Any, implementation: str, pass_name: str,
                  out_dtype: Any = jnp.bfloat16) -> Callable[..., jax.Array]:
    """The pass as one tokamax call: forward (x[R, k], w[g, k, n]); lhs_gradient (dy[R, n],
    w[g, k, n]); rhs_gradient (x[R, k], dy[R, n]) -> [g, k, n]."""
    if pass_name == "forward":
        def forward(lhs, rhs, group_sizes):
            return tokamax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=out_dtype,
                                      implementation=implementation)

        return forward
    dimensions = DIMENSIONS[pass_name]

    def call(lhs, rhs, group_sizes):
        return tokamax.ragged_dot_general(
            lhs, rhs, group_sizes, dimensions, preferred_element_type=out_dtype,
            implementation=implementation)

    return call


def quantized(values: jax.Array, scale: jax.Array) -> Any:
    """A qwix QArray (tokamax's quantized operand) of fp8 values and a float32 scale of the same
    rank, one per row or column."""
    import qwix

    return qwix.QArray(qvalue=values, scale=scale, qtype=values.dtype)


def vjp_check(tokamax: Any, implementation: str, pass_name: str, x: jax.Array, w: jax.Array,
              dy: jax.Array, group_sizes: jax.Array) -> str:
    """Whether the pass's call is a kernel call tokamax's own VJP makes: both are traced (not
    run) and their kernel calls compared (primitive, kernel name, grid, result type). Returns
    the finding, for the row's note."""
    if pass_name == "forward":
        return ""
    try:
        if pass_name == "lhs_gradient":
            ours = kernel_calls(pass_function(tokamax, implementation, pass_name),
                                dy, w, group_sizes)
        else:
            ours = kernel_calls(pass_function(tokamax, implementation, pass_name),
                                x, dy, group_sizes)

        def gradients(x, w, dy):
            forward = pass_function(tokamax, implementation, "forward")
            _, pullback = jax.vjp(lambda x, w: forward(x, w, group_sizes), x, w)
            return pullback(dy)

        theirs = kernel_calls(gradients, x, w, dy)
    except Exception as error:  # noqa: BLE001 - the check's failure is reported, not fatal
        return f"not checked against tokamax's VJP ({_reason(error)})"
    if len(ours) == 1 and ours[0] in theirs:
        return "the kernel call tokamax's VJP makes for this pass"
    return (f"NOT the call tokamax's VJP makes: this pass runs {len(ours)} kernel call(s), "
            f"its VJP {len(theirs)}")


# Primitives that are one kernel call: Pallas kernels of a grid (pallas_call: Triton, and Mosaic
# GPU's pallas_call), Pallas kernels of a mesh (mpmd_map, core_map: Mosaic GPU's plgpu.kernel,
# tokamax's Hopper kernels among them), and XLA's ragged dot (tokamax's xla implementation).
_KERNEL_PRIMITIVES = ("pallas_call", "mpmd_map", "core_map", "ragged_dot_general")


def kernel_calls(fn: Callable[..., Any], *args: Any) -> list[tuple[str, ...]]:
    """Each kernel call `fn` makes on `args`, as (primitive, kernel name, grid or dimension
    numbers, result types), found by tracing it."""
    closed = jax.make_jaxpr(fn)(*args)
    return list(_walk(closed.jaxpr))


def _walk(jaxpr: Any):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _KERNEL_PRIMITIVES:
            params = eqn.params
            meshes = params.get("meshes", (params["mesh"],) if "mesh" in params else ())
            name = params.get("name_and_src_info", params.get("name")) or next(
                (mesh.kernel_name for mesh in meshes if getattr(mesh, "kernel_name", None)), "")
            grid = getattr(params.get("grid_mapping"), "grid", None) or tuple(
                getattr(mesh, "grid", getattr(mesh, "shape", None)) for mesh in meshes) or None
            layout = params.get("ragged_dot_dimension_numbers", grid)
            yield (eqn.primitive.name, str(getattr(name, "name", name)), str(layout),
                   " ".join(str(v.aval) for v in eqn.outvars))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's, or a Jaxpr itself
                if hasattr(inner, "eqns"):
                    yield from _walk(inner)


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"
