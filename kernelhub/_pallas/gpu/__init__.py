"""Triton kernels (through Pallas) for NVIDIA GPUs, and the same kernels in interpret mode on CPU.

Registered as (triton, gpu), the default on a GPU, and (triton, cpu), run only when forced
(`platform="triton"` or KERNELHUB_PLATFORM=triton) to test the kernels without a GPU. Pallas
itself is imported when a kernel is first traced, not here. Design: docs/gpu.md.
"""

from __future__ import annotations

import jax

from kernelhub._pallas.gpu import tuning_space
from kernelhub._registry import needs_device, register
from kernelhub.ops import GROUPED_MATMUL, TRANSPOSED_GROUPED_MATMUL
from kernelhub.ops._autodiff import differentiable
from kernelhub.ops._checks import QUANTIZED, QUANTIZED_BLOCKS
from kernelhub.ops._scale_folding import folded

_GMM_STATIC = ("preferred_element_type", "tiling", "transpose_rhs")
_TGMM_STATIC = ("preferred_element_type", "tiling", "num_actual_groups")


def _raw_gmm(interpret: bool):
    def raw(*args, **kwargs):
        from kernelhub._pallas.gpu.grouped_matmul import raw_grouped_matmul

        return raw_grouped_matmul(*args, **kwargs, interpret=interpret)

    return raw


def _raw_tgmm(interpret: bool):
    def raw(*args, **kwargs):
        from kernelhub._pallas.gpu.transposed_grouped_matmul import raw_transposed_grouped_matmul

        return raw_transposed_grouped_matmul(*args, **kwargs, interpret=interpret)

    return raw


def _register(backend: str, interpret: bool, **how) -> tuple:
    # Quantized operands: the kernels multiply the int8/fp8 values and apply scale blocks along
    # the contraction; one scale per row or column is applied around them
    # (kernelhub/ops/_scale_folding.py).
    raw = folded(_raw_gmm(interpret), _raw_tgmm(interpret))
    ops = differentiable(raw.grouped_matmul, raw.transposed_grouped_matmul,
                         tuning_space.space("triton-interpret" if interpret else "triton"))
    features = (QUANTIZED, QUANTIZED_BLOCKS)
    gmm = register(GROUPED_MATMUL, "triton", backend, features=features, **how)(
        jax.jit(ops.grouped_matmul, static_argnames=_GMM_STATIC))
    tgmm = register(TRANSPOSED_GROUPED_MATMUL, "triton", backend, features=features, **how)(
        jax.jit(ops.transposed_grouped_matmul, static_argnames=_TGMM_STATIC))
    return gmm, tgmm


grouped_matmul, transposed_grouped_matmul = _register(
    "gpu", interpret=False, priority=10, requirement=needs_device("gpu"))
interpret_grouped_matmul, interpret_transposed_grouped_matmul = _register(
    "cpu", interpret=True, priority=0, interpret_only=True)
