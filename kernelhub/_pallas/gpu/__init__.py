"""Triton kernels (through Pallas) for NVIDIA GPUs, and the same kernels in interpret mode on CPU.

Registered as (triton, gpu), the default on a GPU, and (triton, cpu), run only when forced
(`platform="triton"` or KERNELHUB_PLATFORM=triton) to test the kernels without a GPU. Pallas
itself is imported when a kernel is first traced, not here. Design: docs/gpu.md.
"""

from __future__ import annotations

import functools

from kernelhub import ops  # noqa: F401  (declares the ops registered here)
from kernelhub._core.registry import needs_device
from kernelhub._grouped_matmul.names import (
    ACTIVATION, BIAS, GLU, QUANTIZED, QUANTIZED_4BIT, QUANTIZED_BLOCKS)
from kernelhub._grouped_matmul.registration import register_grouped_matmuls
from kernelhub._pallas.gpu import tuning_space


def _raw_gmm(*args, **kwargs):
    from kernelhub._pallas.gpu.grouped_matmul import raw_grouped_matmul

    return raw_grouped_matmul(*args, **kwargs)


def _raw_tgmm(*args, **kwargs):
    from kernelhub._pallas.gpu.transposed_grouped_matmul import raw_transposed_grouped_matmul

    return raw_transposed_grouped_matmul(*args, **kwargs)


def _register(backend: str, interpret: bool, **how):
    # Quantized operands: the kernels multiply the int8/fp8 values (int4/e2m1 ones read packed
    # and widened per tile, _four_bit.py) and apply scale blocks along the contraction; one
    # scale per row or column is applied around them (fold_scales).
    # Epilogues (bias, activation, glu) run on the forward kernel's float32 tile.
    return register_grouped_matmuls(
        "triton", backend, functools.partial(_raw_gmm, interpret=interpret),
        functools.partial(_raw_tgmm, interpret=interpret),
        tuning_space.space("triton-interpret" if interpret else "triton"),
        features=(QUANTIZED, QUANTIZED_4BIT, QUANTIZED_BLOCKS, BIAS, ACTIVATION, GLU),
        fold_scales=True, **how)


compiled = _register("gpu", interpret=False, priority=10, requirement=needs_device("gpu"))
interpreted = _register("cpu", interpret=True, interpret_only=True)
