"""Exporting functions that call kernelhub ops: one artifact, each platform's own kernel.

    import kernelhub.export

    exported = kernelhub.export.export(jax.grad(loss), params, batch)   # cpu, tpu, cuda
    kernelhub.export.kernels_by_platform(exported)
    # {'cpu': {}, 'tpu': {'mosaic': 3}, 'cuda': {'triton': 3}}
    blob = exported.serialize()            # later, anywhere: jax.export.deserialize(blob).call(...)

Each call of an op is lowered once per platform with the implementation chosen for that
platform (kernelhub/_core/lowering.py): the Pallas Mosaic kernels in the TPU branch, the Triton
kernels in the CUDA branch, the XLA loops in the CPU branch. Forcing a platform (argument or
KERNELHUB_PLATFORM) pins one implementation in every branch instead.

Shape-polymorphic export: `args` may have a symbolic m, the rows of lhs (tokens; the
contraction of transposed_grouped_matmul), as `jax.export.symbolic_shape("m")` makes. The CPU
branch runs the XLA loops at any m; the TPU branch's Mosaic kernels get m as a placeholder that
is filled in when the artifact is compiled for its shapes (Pallas does that only inside
`pallas_export_experimental(dynamic_shapes=True)`, which `export` enters for such arguments).
The CUDA branch cannot: jax's Pallas Triton lowering takes static shapes only, so a symbolic m
there is an error unless the XLA implementation is pinned. Group counts must be static
(docs/export.md).
"""

from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from kernelhub import _loader
from kernelhub._core import jax_internals as _jax_internals
from kernelhub._core import runtime_checks
from kernelhub._core.shapes import symbolic_shapes
from kernelhub._verify.cuda_lowering import triton_call_targets

DEFAULT_PLATFORMS = ("cpu", "tpu", "cuda")
MOSAIC_TARGET = "tpu_custom_call"
# Pallas Mosaic GPU kernels (platform "mosaic", Hopper), counted as "mosaic_gpu".
MOSAIC_GPU_TARGET = "mosaic_gpu_v2"


# jax lowers the ragged all-to-all of token_exchange (TPU, GPU) to this custom call.
RAGGED_ALL_TO_ALL_TARGET = "ragged_all_to_all"


def disabled_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The jax.export safety checks kernelhub's ops need lifted: the Triton kernels' custom
    calls and the ragged all-to-all are not on jax's list of targets with a stable binary
    interface (Mosaic's are), so an artifact holding them is for the jaxlib that made it."""
    targets = (*triton_call_targets(), RAGGED_ALL_TO_ALL_TARGET)
    return [jax.export.DisabledSafetyCheck.custom_call(name) for name in targets]


def export(fn: Callable[..., Any], *args: Any, platforms: Sequence[str] = DEFAULT_PLATFORMS,
           **kwargs: Any) -> jax.export.Exported:
    """`jax.export.export(jax.jit(fn), platforms=...)(*args, **kwargs)` with the checks that
    kernelhub's ops need lifted. `args` may be arrays or jax.ShapeDtypeStruct."""
    _loader.load()
    jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
    exporting = jax.export.export(jitted, platforms=tuple(platforms),
                                  disabled_checks=disabled_checks())
    with contextlib.ExitStack() as context:
        if symbolic_shapes((args, kwargs)):
            # Mosaic kernels take symbolic dimensions as placeholders filled in when the
            # artifact is compiled for its shapes; Pallas lowers them so only in this mode.
            context.enter_context(_jax_internals.pallas_dynamic_shapes_export())
        if runtime_checks.enabled():
            warnings.warn(
                "kernelhub.export: runtime checks are left out of the exported function (their "
                "host callbacks cannot be serialized); check group sizes on the host before "
                "calling it", stacklevel=2)
            context.enter_context(runtime_checks.runtime_checks(False))
        return exporting(*args, **kwargs)


def kernels_by_platform(exported: jax.export.Exported) -> dict[str, dict[str, int]]:
    """For each platform of `exported`, how many Mosaic (TPU), Mosaic GPU and Triton kernel
    calls its lowering holds."""
    kinds = {}
    for platform, calls in custom_calls_by_platform(exported).items():
        counted = collections.Counter()
        for target, count in calls.items():
            kind = _kernel_kind(target)
            if kind:
                counted[kind] += count
        kinds[platform] = dict(counted)
    return kinds


def custom_calls_by_platform(exported: jax.export.Exported) -> dict[str, dict[str, int]]:
    """For each platform of `exported`, the custom calls (by target) its lowering holds.

    Reads the StableHLO: a multi-platform module switches on the platform index with
    `stablehlo.case`, and each branch (with the functions it calls) belongs to some platforms.
    """
    platforms = tuple(exported.platforms)
    with _jax_internals.parsed_module(exported.mlir_module()) as module:
        functions = {_symbol(op.attributes["sym_name"]): op for op in module.body.operations
                     if op.operation.name == "func.func"}
        counts = {platform: collections.Counter() for platform in platforms}
        for index, platform in enumerate(platforms):
            _count(functions["main"], index, len(platforms), functions, counts[platform], set())
    return {platform: dict(counter) for platform, counter in counts.items()}


def _symbol(attribute: Any) -> str:
    return str(attribute).strip('"').lstrip("@")


def _kernel_kind(target: str) -> str | None:
    if target == MOSAIC_TARGET:
        return "mosaic"
    if target == MOSAIC_GPU_TARGET:
        return "mosaic_gpu"
    if target in triton_call_targets():
        return "triton"
    return None


def _count(op: Any, platform_index: int, num_platforms: int, functions: dict[str, Any],
           counter: collections.Counter, visiting: set[str]) -> None:
    """Adds the custom calls `op` makes when run on the platform at `platform_index`."""
    operation = op.operation
    name = operation.name
    if name == "stablehlo.custom_call":
        counter[_symbol(operation.attributes["call_target_name"])] += 1
        return
    if name == "func.call":
        callee = _symbol(operation.attributes["callee"])
        if callee in functions and callee not in visiting:
            _count(functions[callee], platform_index, num_platforms, functions, counter,
                   visiting | {callee})
        return
    regions = list(operation.regions)
    if name == "stablehlo.case":
        branch = _branch_for_platform(operation, platform_index, num_platforms)
        if branch is not None:
            regions = [regions[branch]]
    for region in regions:
        for block in region.blocks:
            for inner in block.operations:
                _count(inner, platform_index, num_platforms, functions, counter, visiting)


def _branch_for_platform(case: Any, platform_index: int, num_platforms: int) -> int | None:
    """The branch of a case on the platform that runs there, when the case's index is jax's
    platform selector (a case over the platforms that returns a constant rule index); None for
    any other case, all of whose branches may run."""
    selector = case.operands[0].owner
    if not hasattr(selector, "name") or selector.name != "stablehlo.case":
        return None
    if len(selector.regions) != num_platforms:
        return None
    returned = list(selector.regions[platform_index].blocks[0].operations)[-1].operands[0]
    constant = returned.owner
    if not hasattr(constant, "name") or constant.name != "stablehlo.constant":
        return None
    return _jax_internals.dense_int(constant.attributes["value"])
