"""Compiling the Pallas TPU kernels for TPU generations that are not here.

libtpu (the `tpu` extra) compiles for a topology description without a TPU: Mosaic and XLA:TPU
run for real, so a tiling that overflows VMEM or a block Mosaic cannot lay out fails here as
it would on the chip. Shared by tests/test_pallas_tpu.py and `kernelhub verify --tpu`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import time
import traceback
from typing import Any

import jax
import jax.numpy as jnp

# A 2x2 slice of each generation: compiling for one chip of it is what a kernel sees. Keys are
# the generations as pltpu.ChipVersion spells them ("7x": TPU v7x, Ironwood, whose chip's two
# TensorCores are two jax devices; libtpu names its topologies "tpu7x").
TOPOLOGIES = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2",
              "7x": "tpu7x:2x2x1"}

MOSAIC_CALL = "tpu_custom_call"


@dataclasses.dataclass(frozen=True)
class MoeShape:
    """One expert layer: m routed tokens x k -> n, `experts` groups of which `local` here."""

    name: str
    m: int
    k: int
    n: int
    experts: int
    local: int | None = None  # None: all experts are local (no group_offset)
    note: str = ""

    @property
    def local_experts(self) -> int:
        return self.experts if self.local is None else self.local


SHAPES = {
    s.name: s
    for s in (
        MoeShape("mixtral", 8192, 4096, 14336, 8, note="Mixtral 8x7B up projection"),
        MoeShape("mixtral-down", 8192, 14336, 4096, 8, note="Mixtral 8x7B down projection"),
        MoeShape("deepseek-v3", 16384, 7168, 2048, 256, local=32,
                 note="DeepSeek-V3-like, 32 of 256 experts local (group_offset)"),
        MoeShape("qwen3-moe", 8192, 2048, 768, 128, note="Qwen3-MoE"),
        MoeShape("odd", 1000, 520, 200, 7, note="no axis a tile multiple"),
    )
}


# A gated expert layer: n is the output's columns, rhs holds 2n (gate and up, interleaved).
GATED_SHAPES = {
    s.name: s
    for s in (
        MoeShape("gpt-oss-120b", 8192, 2880, 2880, 128,
                 note="GPT-OSS-120B gate/up projection: interleaved swiglu_oai with bias"),
    )
}

# What compile_for's `epilogue` names: grouped_matmul's epilogue arguments, a bias by default.
GPT_OSS_EPILOGUE = {"glu": "swiglu_oai", "glu_layout": "interleaved", "bias": True}


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


@dataclasses.dataclass
class CompileResult:
    generation: str
    shape: MoeShape
    dtype: str
    backward: bool
    compiled: bool
    seconds: float
    # kernel ("gmm", "gmm_t" for the lhs gradient, "tgmm") -> the tiles it was compiled with
    tilings: dict[str, tuple[int, int, int]] = dataclasses.field(default_factory=dict)
    mosaic_calls: int = 0  # Mosaic custom calls in the compiled program
    error: str = ""
    details: str = ""  # the full traceback of a failure

    @property
    def ok(self) -> bool:
        """Compiled, and into Mosaic kernels (an XLA fallback would not count)."""
        return self.compiled and self.mosaic_calls >= (3 if self.backward else 1)


def step_problems(shape: MoeShape, dtype: Any, backward: bool) -> dict[str, Any]:
    """The kernels of the compiled step, by tag, as `Problem`s: the forward gmm, and for the VJP
    (kernelhub/_grouped_matmul/autodiff.py) gmm_t [m, n] x [G, k, n]^T -> d lhs and tgmm ->
    d rhs, both accumulated into float32."""
    from kernelhub._grouped_matmul.problem import Kernel, Problem

    def problem(kernel, k, n, out):
        return Problem(kernel, shape.m, k, n, shape.experts, shape.local_experts, dtype, dtype,
                       out, False)

    problems = {"gmm": problem(Kernel.GMM, shape.k, shape.n, dtype)}
    if backward:
        problems["gmm_t"] = problem(Kernel.GMM_TRANSPOSED_RHS, shape.n, shape.k, jnp.float32)
        problems["tgmm"] = problem(Kernel.TGMM, shape.k, shape.n, jnp.float32)
    return problems


def vmem_estimates(result: "CompileResult") -> dict[str, int]:
    """Estimated VMEM bytes of each compiled kernel's tiles (tiling.vmem_bytes)."""
    from kernelhub._pallas.tpu import tiling

    problems = step_problems(result.shape, jnp.dtype(result.dtype), result.backward)
    return {kernel: tiling.vmem_bytes(tiling.Tiles(*tiles), problems[kernel])
            for kernel, tiles in result.tilings.items() if kernel in problems}


def step_function(shape: MoeShape, dtype: Any, backward: bool, quantized: Any = None,
                  block_size: int | None = None, epilogue: dict[str, Any] | None = None,
                  quantized_lhs: bool = True):
    """The jitted function compiled: the forward gmm, or it and its VJP (all three kernels,
    with a nonlinear epilogue too: the forward kernel's pre-activation reaches the backward)."""
    from kernelhub import _loader
    from kernelhub._core.dispatch import get
    from kernelhub.quantization import quantize

    _loader.load()
    gmm = get("grouped_matmul", platform="pallas", backend="tpu")

    options = dict(epilogue or {})
    with_bias = options.pop("bias", False)

    def forward(lhs, rhs, group_sizes, group_offset, bias=None):
        if quantized is not None:  # scales per row of lhs and column of each expert, per block
            if quantized_lhs:
                lhs = quantize(lhs, quantized, axis=1, block_size=block_size)
            rhs = quantize(rhs, quantized, axis=1, block_size=block_size)
        return gmm(lhs, rhs, group_sizes, preferred_element_type=dtype, group_offset=group_offset,
                   bias=bias, **options)

    def forward_and_backward(lhs, rhs, group_sizes, group_offset, d_out, bias=None):
        if not with_bias:
            out, vjp = jax.vjp(lambda a, b: forward(a, b, group_sizes, group_offset), lhs, rhs)
            return out, *vjp(d_out)
        out, vjp = jax.vjp(lambda a, b, c: forward(a, b, group_sizes, group_offset, c), lhs,
                           rhs, bias)
        return out, *vjp(d_out)

    return jax.jit(forward_and_backward if backward else forward)


def argument_specs(shape: MoeShape, dtype: Any, backward: bool, device: Any,
                   epilogue: dict[str, Any] | None = None) -> list:
    sharding = jax.sharding.SingleDeviceSharding(device)
    epilogue = epilogue or {}
    rhs_columns = 2 * shape.n if epilogue.get("glu") else shape.n

    def spec(dims, dt):
        return jax.ShapeDtypeStruct(dims, dt, sharding=sharding)

    specs = [spec((shape.m, shape.k), dtype),
             spec((shape.local_experts, shape.k, rhs_columns), dtype),
             spec((shape.experts,), jnp.int32),
             spec((), jnp.int32) if shape.local is not None else None]
    if backward:
        specs.append(spec((shape.m, shape.n), dtype))
    if epilogue.get("bias"):
        specs.append(spec((shape.local_experts, rhs_columns), jnp.float32))
    return specs


def compile_for(generation: str, shape: MoeShape, dtype: Any = jnp.bfloat16,
                backward: bool = True, quantized: Any = None,
                block_size: int | None = None,
                epilogue: dict[str, Any] | None = None,
                quantized_lhs: bool = True) -> CompileResult:
    """Compiles the step for one chip of `generation` with the default tiling; with
    `quantized` (a value dtype or a named format: kernelhub.quantize's), on both operands
    (only rhs without `quantized_lhs`) quantized to it per row and column, with `block_size`
    scale blocks along k; with `epilogue`, grouped_matmul's epilogue arguments
    (bias=True for a float32 bias; with a glu, shape.n is the output's columns and rhs has
    twice as many)."""
    dtype = jnp.dtype(dtype)
    started = time.perf_counter()
    result = CompileResult(generation, shape, dtype.name, backward, False, 0.0)
    try:
        lowered = _lowered(generation, shape, dtype, backward, quantized, block_size, epilogue,
                           quantized_lhs)
        compiled = lowered.compile()
        result.compiled = True
        text = compiled.as_text()
        result.mosaic_calls = text.count(f'custom_call_target="{MOSAIC_CALL}"')
        result.tilings = kernel_tiles(text)
        if not result.ok:
            result.error = (f"expected Mosaic kernels ({MOSAIC_CALL}), found "
                            f"{result.mosaic_calls}: the kernels did not lower to Mosaic")
    except Exception as error:  # noqa: BLE001  (any compiler failure is a result to report)
        result.error = _first_line(error)
        result.details = traceback.format_exc()
    result.seconds = time.perf_counter() - started
    return result


def _lowered(generation: str, shape: MoeShape, dtype: Any, backward: bool, quantized: Any,
             block_size: int | None, epilogue: dict[str, Any] | None,
             quantized_lhs: bool) -> Any:
    """The step lowered for one chip of `generation` (compile_for's arguments)."""
    from jax.experimental import topologies

    # libtpu takes a machine-wide lock unless told otherwise, so a second process (a parallel
    # test worker, a job using the local TPU) would make this fail. Compiling for a topology
    # touches no chip, so sharing is safe. Read once, when this process first loads libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topology = topologies.get_topology_desc(topology_name=TOPOLOGIES[generation], platform="tpu")
    device = topology.devices[0]
    # The kernels read the target chip from the default device while tracing (hardware.py).
    with jax.default_device(device):
        return step_function(shape, dtype, backward, quantized, block_size, epilogue,
                             quantized_lhs).lower(
            *argument_specs(shape, dtype, backward, device, epilogue))


def lowered_tiles(generation: str, shape: MoeShape,
                  dtype: Any = jnp.bfloat16) -> dict[str, tuple[int, int, int]]:
    """The tiles of each kernel in the bf16 step (forward and VJP) for `generation`, from its
    lowering alone: what compile_for reports, without the compilation's seconds."""
    lowered = _lowered(generation, shape, jnp.dtype(dtype), True, None, None, None, True)
    return kernel_tiles(lowered.as_text())


def kernel_tiles(hlo_text: str) -> dict[str, tuple[int, int, int]]:
    """The tiles of each kernelhub kernel in a program, read from the kernels' names."""
    from kernelhub._pallas.tpu.kernel_parts import KERNEL_NAME_PATTERN

    found = {}
    for kernel, tm, tk, tn in re.findall(KERNEL_NAME_PATTERN, hlo_text):
        found[kernel] = (int(tm), int(tk), int(tn))
    return found


def _first_line(error: Exception) -> str:
    text = f"{type(error).__name__}: {error}"
    lines = [line for line in text.splitlines() if line.strip()]
    return " / ".join(lines[:3])[:400]
