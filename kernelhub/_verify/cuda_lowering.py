"""Lowering the Triton kernels for CUDA on a host without a GPU (for CI and `kernelhub verify`).

`jax.export` for platforms=["cuda"] runs the whole Pallas Triton lowering (kernel body to Triton
IR, grid, aliases) and stops before PTX: only a GPU run proves the PTX compiles and runs.
Which custom call carries the kernel depends on jaxlib: up to 0.10.2 XLA compiles the Triton IR
(`__gpu$xla.gpu.triton`); later versions may compile it at lowering and call a prebuilt kernel.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax

# Custom-call targets that carry a Pallas Triton kernel, across jaxlib versions.
_KNOWN_TRITON_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi", "triton_kernel_call")


def triton_call_targets() -> tuple[str, ...]:
    """The custom-call names a lowered Triton kernel may use with this jax."""
    names = list(_KNOWN_TRITON_TARGETS)
    try:
        from jax.experimental.pallas import triton as plgpu

        named = getattr(plgpu, "CUSTOM_CALL_TARGET_NAME", None)
        if named and named not in names:
            names.insert(0, named)
    except ImportError:  # pragma: no cover - pallas missing entirely
        pass
    return tuple(names)


def export_for_cuda(fn: Callable[..., Any], args: Sequence[Any]) -> jax.export.Exported:
    """Lowers `jax.jit(fn)(*args)` for CUDA; `args` may be jax.ShapeDtypeStruct specs.

    The Triton custom calls are not on jax.export's list of targets with a stable ABI, hence the
    disabled checks: the exported artefact is for inspection here, not for long-term storage.
    """
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in triton_call_targets()]
    return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args)


def count_triton_calls(module_text: str) -> int:
    """How many Triton kernel launches a lowered StableHLO module holds."""
    return sum(module_text.count(f"custom_call @{name}(") for name in triton_call_targets())


@dataclasses.dataclass(frozen=True)
class TritonLaunch:
    """One Triton kernel launch found in a lowered module (XLA-compiled form only)."""

    name: str
    grid: int
    num_warps: int
    num_stages: int


_SETTING = r"{} = (\d+) : i32"


def triton_launches(module_text: str) -> list[TritonLaunch]:
    """The launches of a module lowered with jaxlib <= 0.10.2, read from their backend configs.

    Later jaxlibs serialise the kernel opaquely; there this returns [] (count_triton_calls
    still counts them).
    """
    launches = []
    for line in module_text.splitlines():
        if "custom_call @__gpu$xla.gpu.triton(" not in line:
            continue
        line = re.sub(r'ir = "[^"]*"', "", line)  # the serialised Triton IR, not needed here
        settings = [re.search(_SETTING.format(key), line) for key in ("grid_x", "num_warps", "num_stages")]
        name = re.search(r'name = "([^"]*)"', line)
        if name and all(settings):
            grid, warps, stages = (int(found.group(1)) for found in settings)
            launches.append(TritonLaunch(name.group(1), grid, warps, stages))
    return launches


@dataclasses.dataclass(frozen=True)
class TritonModule:
    """One kernel's Triton IR (text) as the Pallas lowering produced it, with its launch settings."""

    name: str
    ir: str
    num_warps: int
    num_stages: int


def triton_modules(fn: Callable[..., Any], args: Sequence[Any]) -> list[TritonModule]:
    """The Triton IR of every kernel in `jax.jit(fn)(*args)` lowered for CUDA, in launch order.

    Reaches into jax's Pallas Triton lowering (private API, checked with jax 0.10.2): raises
    RuntimeError when that has moved, so callers can skip rather than fail.
    """
    try:
        from jax._src.pallas.triton import pallas_call_registration as registration
        lower_module = registration.lowering.lower_jaxpr_to_triton_module
    except (ImportError, AttributeError) as error:
        raise RuntimeError(f"jax's Pallas Triton lowering has moved: {error}") from None
    texts: list[str] = []

    def capture(*a: Any, **k: Any) -> Any:
        result = lower_module(*a, **k)
        texts.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    jax.clear_caches()  # a cached lowering would skip the capture
    registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        text = export_for_cuda(fn, args).mlir_module()
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = lower_module
    launches = triton_launches(text)
    if len(launches) != len(texts):
        raise RuntimeError(f"found {len(texts)} Triton modules but {len(launches)} launches")
    # The module's launches follow the lowering order, which is the order of the captures.
    return [TritonModule(launch.name, ir, launch.num_warps, launch.num_stages)
            for launch, ir in zip(launches, texts)]
