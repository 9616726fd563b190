"""Pallas Mosaic kernels for TPU, registered twice:

- (pallas, tpu), priority 10: the compiled kernels, the default on a TPU. Their requirement is a
  TPU device, which a forced backend="tpu" waives, so they also lower ahead of time elsewhere
  (`kernelhub verify --tpu`, kernelhub/_pallas/tpu/ahead_of_time.py);
- (pallas, cpu), interpret only: the same kernels emulated by Pallas interpret mode, run when
  pallas is forced on a CPU host. This is how they are tested without a TPU.

Gradients come from kernelhub.ops._autodiff: the backward pass runs these same kernels.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from kernelhub._pallas.tpu.grouped_matmul import grouped_matmul as _raw_grouped_matmul
from kernelhub._pallas.tpu.transposed_grouped_matmul import (
    transposed_grouped_matmul as _raw_transposed_grouped_matmul)
from kernelhub._pallas.tpu import tuning_space
from kernelhub._registry import needs_device, register
from kernelhub.ops import GROUPED_MATMUL, TRANSPOSED_GROUPED_MATMUL
from kernelhub.ops._autodiff import Differentiable, differentiable
from kernelhub.ops._checks import QUANTIZED, QUANTIZED_BLOCKS
from kernelhub.ops._scale_folding import folded


@functools.lru_cache(maxsize=None)
def interpreted(params: Any = True) -> Differentiable:
    """Both kernels, differentiable and jitted, in Pallas interpret mode with `params` (True, or a
    `pltpu.InterpretParams`, e.g. to detect races and reads of uninitialised memory).

    They take the arguments as the dispatcher hands them to implementations (validated and
    normalised: see kernelhub/ops/*.py), so call them with well-formed ones.
    """
    return _jitted(params)


def _jitted(interpret: Any) -> Differentiable:
    # Quantized operands: the kernels multiply the int8/fp8 values (int8 on the MXU where it has
    # int8, else widened to bf16 per tile) and apply scale blocks along the contraction; one
    # scale per row or column is applied around them.
    raw = folded(functools.partial(_raw_grouped_matmul, interpret=interpret),
                 functools.partial(_raw_transposed_grouped_matmul, interpret=interpret))
    ops = differentiable(raw.grouped_matmul, raw.transposed_grouped_matmul,
                         tuning_space.CHIP if interpret is False else tuning_space.INTERPRET)
    return Differentiable(
        jax.jit(ops.grouped_matmul,
                static_argnames=("preferred_element_type", "tiling", "transpose_rhs")),
        jax.jit(ops.transposed_grouped_matmul,
                static_argnames=("preferred_element_type", "tiling", "num_actual_groups")),
    )


_FEATURES = (QUANTIZED, QUANTIZED_BLOCKS)
_compiled = _jitted(interpret=False)
_emulated = interpreted(True)

grouped_matmul = register(GROUPED_MATMUL, "pallas", "tpu", 10, requirement=needs_device("tpu"),
                          features=_FEATURES)(_compiled.grouped_matmul)
transposed_grouped_matmul = register(
    TRANSPOSED_GROUPED_MATMUL, "pallas", "tpu", 10, requirement=needs_device("tpu"),
    features=_FEATURES)(_compiled.transposed_grouped_matmul)

interpreted_grouped_matmul = register(GROUPED_MATMUL, "pallas", "cpu", 0, interpret_only=True,
                                      features=_FEATURES)(_emulated.grouped_matmul)
interpreted_transposed_grouped_matmul = register(
    TRANSPOSED_GROUPED_MATMUL, "pallas", "cpu", 0, interpret_only=True,
    features=_FEATURES)(_emulated.transposed_grouped_matmul)
