"""The few private jax functions kernelhub needs, in one place.

jax has no public way to trace a function into a jaxpr for given abstract values (with the manual
mesh axes they vary over), to drop a jaxpr's dead equations, to lower a jaxpr inside a lowering
rule, to add a configuration option that jax.jit caches on, to read a lowered module's operations,
to add a primitive to Pallas's Triton lowering (and build Triton IR there), to make that lowering's
pointer offsets wide enough for 8-bit arrays, to name the GPU it compiles for on a host without one,
to read Pallas's dynamic-shape export flag, to type a host callback's result as its operands are
typed under shard_map, or to learn how many threads XLA's CPU client runs computations on.
Everything kernelhub takes from `jax._src` for those goes through this module (the Triton IR capture
of kernelhub/_verify/cuda_lowering.py aside), so a jax upgrade that moves them breaks here. Checked
with jax 0.10.2 and 0.11.2.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from jax._src import api_util, config, core, effects
from jax._src import linear_util as lu
from jax._src.interpreters import mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lib.mlir import ir


def trace(fn: Callable[..., Sequence[Any]],
          avals: Sequence[core.AbstractValue]) -> core.ClosedJaxpr:
    """The jaxpr of `fn(*args)` (flat arrays in, a flat sequence out) for abstract `avals`."""
    debug = api_util.debug_info("kernelhub", fn, tuple(avals), {})
    traced = pe.trace_to_jaxpr_dynamic(lu.wrap_init(fn, debug_info=debug), list(avals))
    # (jaxpr, out_avals, consts) in 0.10; the consts come last in every version seen.
    return core.ClosedJaxpr(traced[0], traced[-1])


def without_dead_code(closed: core.ClosedJaxpr) -> core.ClosedJaxpr:
    """`closed` with the equations that feed no output removed (a pullback traced from
    `jax.vjp` also holds the forward pass whose result it does not use)."""
    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    return core.ClosedJaxpr(jaxpr, closed.consts)


def lower_jaxpr(ctx: mlir.LoweringRuleContext, closed: core.ClosedJaxpr,
                *args: Any) -> Sequence[Any]:
    """Emits `closed` inline at the lowering rule's insertion point, for `ctx`'s platforms."""
    module = ctx.module_context
    if ctx.platforms is not None:  # one branch of a multi-platform lowering
        module = module.replace(platforms=ctx.platforms)
    options = dict(dim_var_values=ctx.dim_var_values,
                   const_lowering=getattr(ctx, "const_lowering", None), outer_traceback=None)
    accepted = inspect.signature(mlir.jaxpr_subcomp).parameters
    outs, tokens = mlir.jaxpr_subcomp(
        module, closed.jaxpr, ctx.name_stack, ctx.tokens_in,
        mlir.ir_consts(closed.consts, [v.aval for v in closed.jaxpr.constvars]), *args,
        **{name: value for name, value in options.items() if name in accepted})
    ctx.set_tokens_out(tokens)
    return outs


def unsupported_effects(closed: core.ClosedJaxpr) -> set:
    """The effects of `closed` that a primitive wrapped in a custom VJP cannot carry (I/O,
    callbacks, state); naming a mesh axis (what collectives do) is allowed."""
    return set(effects.custom_derivatives_allowed_effects.filter_not_in(closed.effects))


def varying_axes(aval: core.AbstractValue) -> frozenset:
    """The manual mesh axes `aval` varies over (0.10: aval.manual_axis_type; later: aval.vma)."""
    axes = getattr(aval, "vma", None)
    if axes is None:
        axes = getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())
    return frozenset(axes)


def invariant(aval: core.AbstractValue) -> core.AbstractValue:
    """`aval` without manual axes, as shard_map(check_vma=False) types its values."""
    if not varying_axes(aval):
        return aval
    return varying(aval, frozenset())


def varying(aval: core.AbstractValue, axes: frozenset) -> core.AbstractValue:
    """`aval` typed as varying over exactly the manual mesh `axes`."""
    manual_axis_type = getattr(core, "ManualAxisType", None)
    if manual_axis_type is not None and hasattr(aval, "manual_axis_type"):
        return aval.update(manual_axis_type=manual_axis_type(varying=frozenset(axes)))
    return aval.update(vma=frozenset(axes))


@contextlib.contextmanager
def unchecked_manual_axes() -> Iterator[None]:
    """Traces as inside shard_map(check_vma=False): no value is typed by the axes it varies
    over, and collectives act on whatever they are given."""
    with config._check_vma(False):
        yield


def jit_keyed_flag(name: str, help: str) -> Any:
    """A boolean jax configuration option that jax.jit caches on, usable as a context manager
    (`with flag(True):`); its default comes from the environment variable `name.upper()`."""
    return config.bool_state(name=name, default=False, help=help, include_in_jit_key=True,
                             include_in_trace_context=True)


def jit_keyed_object(name: str, help: str) -> Any:
    """A jax configuration option holding any hashable object (None by default, or the string
    in the environment variable `name.upper()`), that jax.jit and jax's other trace caches key
    on; a context manager (`with option(value):`)."""
    return config.string_or_object_state(name=name, default=None, help=help,
                                         include_in_jit_key=True, include_in_trace_context=True)


def apply_primitive(primitive: Any, *args: Any, **params: Any) -> Any:
    """Runs `primitive` outside any trace by compiling it alone (jax's impl rule for that)."""
    from jax._src import dispatch  # noqa: PLC0415

    return dispatch.apply_primitive(primitive, *args, **params)


@contextlib.contextmanager
def parsed_module(text: str) -> Iterator[Any]:
    """A StableHLO module's text as MLIR operations, to read inside the block (jax's MLIR
    context stays open there)."""
    with mlir.make_ir_context():
        yield ir.Module.parse(text)


def dense_int(attribute: Any) -> int:
    """The first integer of a dense elements attribute (an MLIR constant's value)."""
    return int(ir.DenseIntElementsAttr(attribute)[0])


_dynamic_shapes_option: Any = None
_dynamic_shapes_lock = threading.Lock()


@contextlib.contextmanager
def pallas_dynamic_shapes_export() -> Iterator[None]:
    """Pallas's dynamic-shape export mode (`pallas_export_experimental(dynamic_shapes=True)`),
    together with a jax option that jax.jit's caches key on. Pallas keeps the mode in a
    thread-local that jit does not see, so a function traced inside it would be reused outside
    (and the other way round) without the checks that depend on it."""
    from jax.experimental import pallas as pl  # noqa: PLC0415

    global _dynamic_shapes_option
    with _dynamic_shapes_lock:
        if _dynamic_shapes_option is None:  # made on first use: no option exists at import
            _dynamic_shapes_option = jit_keyed_flag(
                "kernelhub_pallas_dynamic_shapes",
                "kernelhub: traced inside Pallas's dynamic-shape export mode")
    with pl.pallas_export_experimental(dynamic_shapes=True), _dynamic_shapes_option(True):
        yield


def pallas_symbolic_shapes() -> bool:
    """Whether Pallas lowers symbolic dimensions (shape-polymorphic export) as placeholders
    that Mosaic fills in when the program is compiled: inside
    `jax.experimental.pallas.pallas_export_experimental(dynamic_shapes=True)`, which sets a
    flag jax offers no public reader of."""
    from jax._src.pallas import core as pallas_core

    return bool(pallas_core.dynamic_shapes_export_enabled())


def register_pallas_triton_rule(primitive: Any, rule: Callable[..., Any]) -> None:
    """Makes Pallas's Triton backend lower `primitive` inside kernels with `rule(ctx, *values,
    **params)`, the values being Triton MLIR values and the result one value (the form of the
    rules in jax/_src/pallas/triton/lowering.py). RuntimeError when that table has moved."""
    try:
        from jax._src.pallas.triton import lowering  # noqa: PLC0415
    except ImportError as error:
        raise RuntimeError(f"jax's Pallas Triton lowering has moved: {error}") from None
    rules = getattr(lowering, "triton_lowering_rules", None)
    if not isinstance(rules, dict):
        raise RuntimeError("jax's Pallas Triton lowering has no triton_lowering_rules table")
    rules[primitive] = rule


def triton_dialect() -> Any:
    """jaxlib's Python bindings of Triton's MLIR dialect (tt.dot, tt.trans, ...), which Pallas's
    Triton lowering builds kernels with. RuntimeError when they have moved or lack what
    kernelhub uses (a dot taking maxNumImpreciseAcc)."""
    try:
        from jax._src.lib import triton  # noqa: PLC0415
        dialect = triton.dialect
    except (ImportError, AttributeError) as error:
        raise RuntimeError(f"jaxlib's Triton dialect has moved: {error}") from None
    if "max_num_imprecise_acc" not in inspect.signature(dialect.dot).parameters:
        raise RuntimeError("jaxlib's Triton dialect builds tt.dot without maxNumImpreciseAcc")
    return dialect


def concrete_array_type() -> type:
    """The class of jax's concrete arrays (no tracer is one): telling them apart by `type(x) is`
    costs a fraction of `isinstance(x, jax.Array)`, which asks every registered virtual class."""
    from jax._src.array import ArrayImpl

    return ArrayImpl


# Set while Pallas's Triton lowering builds a kernel whose offsets must be counted in elements.
_OFFSETS_BY_ELEMENTS = contextvars.ContextVar("kernelhub_offsets_by_elements", default=False)
# Arrays with this many elements or more need 64-bit element offsets: a signed 32-bit offset
# holds 2**31 - 1, and masked lanes of a last tile point a little past the end.
WIDE_OFFSET_ELEMENTS = 2**31


def pallas_triton_offsets_by_elements(kernel_prefix: str) -> None:
    """Makes Pallas's Triton backend compute pointer offsets in 64 bits for every array of
    WIDE_OFFSET_ELEMENTS elements or more, in kernels whose pallas_call name starts with
    `kernel_prefix` (other kernels keep Pallas's rule). Idempotent; RuntimeError when the
    lowering has moved.

    Pallas widens offsets only when an array's bytes exceed 2**32, but offsets count elements:
    a 1-byte (int8, fp8) or sub-byte array of 2**31 to 2**32 elements gets 32-bit offsets that
    wrap negative. Pallas reads the array's dtype there only for that size, so the wrapper hands
    it the same shape with an 8-byte dtype."""
    try:
        from jax._src.pallas.triton import lowering  # noqa: PLC0415
        lower_module = lowering.lower_jaxpr_to_triton_module
        offsets = lowering._compute_offsets_from_indices
    except (ImportError, AttributeError) as error:
        raise RuntimeError(f"jax's Pallas Triton lowering has moved: {error}") from None
    if getattr(lower_module, "_kernelhub_prefix", None) != kernel_prefix:
        lowering.lower_jaxpr_to_triton_module = _named_kernels(lower_module, kernel_prefix)
    if not getattr(offsets, "_kernelhub_wide", False):
        lowering._compute_offsets_from_indices = _element_offsets(offsets)


def _named_kernels(lower_module: Callable[..., Any], kernel_prefix: str) -> Callable[..., Any]:
    @functools.wraps(lower_module)
    def lower(jaxpr, *args, **kwargs):
        name = getattr(getattr(jaxpr, "debug_info", None), "func_name", "") or ""
        token = _OFFSETS_BY_ELEMENTS.set(name.startswith(kernel_prefix))
        try:
            return lower_module(jaxpr, *args, **kwargs)
        finally:
            _OFFSETS_BY_ELEMENTS.reset(token)

    lower._kernelhub_prefix = kernel_prefix
    return lower


def _element_offsets(offsets: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(offsets)
    def by_elements(block_info, indexer):
        array = block_info.full_shape_dtype
        if _OFFSETS_BY_ELEMENTS.get() and math.prod(array.shape) >= WIDE_OFFSET_ELEMENTS:
            block_info = dataclasses.replace(
                block_info, full_shape_dtype=array.update(dtype=np.dtype(np.int64)))
        return offsets(block_info, indexer)

    by_elements._kernelhub_wide = True
    return by_elements


def output_names(closed: core.ClosedJaxpr, positions: Sequence[int]) -> tuple[str | None, ...]:
    """For each output of `closed` at `positions`: the name `jax.ad_checkpoint.checkpoint_name`
    gave it, found through the jitted calls that produced it, or None."""
    return tuple(_name_of(closed.jaxpr, closed.jaxpr.outvars[i]) for i in positions)


def _name_of(jaxpr: core.Jaxpr, var: Any) -> str | None:
    if not isinstance(var, core.Var):
        return None
    for eqn in reversed(jaxpr.eqns):
        if not any(out is var for out in eqn.outvars):
            continue
        if eqn.primitive.name == "name":
            return eqn.params["name"]
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's own jaxpr
        if isinstance(inner, core.Jaxpr) and len(inner.outvars) == len(eqn.outvars):
            position = next(i for i, out in enumerate(eqn.outvars) if out is var)
            return _name_of(inner, inner.outvars[position])
        return None
    return None


def forwarded_inputs(closed: core.ClosedJaxpr) -> tuple[int | None, ...]:
    """For each output of `closed`: the position of the input it is (unchanged), or None."""
    position = {id(var): i for i, var in enumerate(closed.jaxpr.invars)}
    return tuple(position.get(id(var)) if isinstance(var, core.Var) else None
                 for var in closed.jaxpr.outvars)


def mosaic_gpu_interpret_params() -> Any:
    """The `interpret=` value that runs a Pallas Mosaic GPU kernel on the CPU, simulating global
    and shared memory, warpgroups, barriers and TMA copies. jax 0.10.2 has no public name for
    it; a public one, where a later jax adds it to `jax.experimental.pallas.mosaic_gpu`, comes
    first."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    params = getattr(plgpu, "InterpretGPUParams", None)
    if params is None:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams as params
    return params()


def pure_callback_like(callback: Callable[..., Any], shape: tuple[int, ...], dtype: Any,
                       operands: Sequence[Any]) -> Any:
    """`jax.pure_callback(callback, ShapeDtypeStruct(shape, dtype), *operands)` whose result
    is typed as a value computed from `operands` is: on their mesh, varying over every manual
    mesh axis one of them varies over. jax.pure_callback (0.10.2 and 0.11) types its result on
    no mesh and varying over nothing, which inside shard_map makes a per-device result look
    the same on every device: shard_map's transpose then sums its cotangent over the
    devices, and a mesh-less value cannot be marked varying afterwards. No public API takes
    the result's type whole."""
    import jax
    from jax._src import callback as jax_callback

    like = jax.typeof(operands[0])
    axes = frozenset().union(*(varying_axes(jax.typeof(x)) for x in operands))
    mesh = getattr(getattr(like, "sharding", None), "mesh", None)
    if mesh is None or not mesh.axis_names:
        result = core.ShapedArray(shape, dtype)
    else:
        unsharded = jax.sharding.PartitionSpec(*([None] * len(shape)))
        result = core.ShapedArray(shape, dtype,
                                  sharding=jax.sharding.NamedSharding(mesh, unsharded))
        result = varying(result, axes)
    flat, tree = jax.tree.flatten((tuple(operands), {}))
    (out,) = jax_callback.pure_callback_p.bind(
        *flat, callback=jax_callback._FlatCallback(callback, tree), result_avals=(result,),
        sharding=None, vmap_method="sequential")
    return out


# Set while kernelhub lowers a call for a GPU target: a Pallas Triton kernel lowered then on a
# host whose devices name no GPU is compiled for the GPU jax 0.10.2 assumed (compute capability
# 9.0), not refused.
_LOWERING_FOR_GPU = contextvars.ContextVar("kernelhub_lowering_for_gpu", default=False)


@contextlib.contextmanager
def lowering_for(target: str) -> Iterator[None]:
    """Lowers the kernels of a kernelhub call for `target` ("cpu", "cuda", "rocm", "tpu").

    jax 0.11's Pallas Triton lowering asks the abstract mesh's device, else the default device,
    which GPU it compiles for, and raises where neither is a GPU, so `jax.export` for cuda from
    a CPU or TPU host failed; jax 0.10.2 assumed an H100 there. For cuda and rocm the question
    gets that answer again, inside kernelhub's calls only (another Pallas Triton kernel keeps
    jax's rule); a GPU that the host or an abstract mesh names still answers for itself. A
    no-op where jax does not ask (0.10.2)."""
    if target not in ("cuda", "rocm"):
        yield
        return
    _answer_gpu_info_when_lowering_for_gpu()
    token = _LOWERING_FOR_GPU.set(True)
    try:
        yield
    finally:
        _LOWERING_FOR_GPU.reset(token)


def _answer_gpu_info_when_lowering_for_gpu() -> None:
    try:
        from jax._src.pallas.triton import gpu_info  # noqa: PLC0415
    except ImportError:  # jax 0.10.2: its lowering does not ask
        return
    asked = gpu_info.get_gpu_info
    if getattr(asked, "_kernelhub_answers", False):
        return

    @functools.wraps(asked)
    def get_gpu_info():
        try:
            return asked()
        except ValueError:  # what Pallas turns into its RuntimeError
            # A GPU that is named but unknown to jax stays refused.
            if not _LOWERING_FOR_GPU.get() or gpu_info.get_device_platform() == "gpu":
                raise
            return gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H100)

    get_gpu_info._kernelhub_answers = True
    gpu_info.get_gpu_info = get_gpu_info


def xla_cpu_client_threads() -> int:
    """How many threads XLA's CPU client runs computations on: the `NPROC` environment variable
    where set (read once, when jax makes the client), else this process's cores. No jax API
    reports it; jax 0.10.2 and 0.11 size the pool this way."""
    import os

    value = os.environ.get("NPROC", "").strip()
    if value.isdigit():
        return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
