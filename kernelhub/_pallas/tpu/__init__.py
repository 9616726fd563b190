"""Pallas Mosaic kernels for TPU, registered twice:

- (pallas, tpu), priority 10: the compiled kernels, the default on a TPU. Their requirement is a
  TPU device, which a forced backend="tpu" waives, so they also lower ahead of time elsewhere
  (`kernelhub verify --tpu`, kernelhub/_verify/tpu_ahead_of_time.py);
- (pallas, cpu), interpret only: the same kernels emulated by Pallas interpret mode, run when
  pallas is forced on a CPU host. This is how they are tested without a TPU.
"""

from __future__ import annotations

import functools
from typing import Any

from kernelhub import ops  # noqa: F401  (declares the ops registered here)
from kernelhub._core.registry import needs_device
from kernelhub._grouped_matmul.autodiff import Differentiable
from kernelhub._grouped_matmul.names import (
    ACTIVATION, BIAS, GLU, QUANTIZED, QUANTIZED_4BIT, QUANTIZED_BLOCKS, SYMBOLIC_SHAPES)
from kernelhub._grouped_matmul.registration import implementations, register_grouped_matmuls
from kernelhub._pallas.tpu import grouped_matmul as _gmm_kernel
from kernelhub._pallas.tpu import transposed_grouped_matmul as _tgmm_kernel
from kernelhub._pallas.tpu import tuning_space

# Mosaic takes a symbolic m (kernelhub.export's dynamic-shape mode, docs/export.md).
_FEATURES = (QUANTIZED, QUANTIZED_4BIT, QUANTIZED_BLOCKS, SYMBOLIC_SHAPES, BIAS, ACTIVATION, GLU)


def _raw(interpret: Any) -> tuple:
    # Quantized operands: the kernels multiply the int8/fp8/int4/e2m1 values (int8 and int4 on
    # the MXU where it has them, else widened per tile in VMEM: mxu.compute_dtype) and
    # apply scale blocks along the contraction; one scale per row or column is applied around
    # them (fold_scales).
    return (functools.partial(_raw_gmm, interpret=interpret),
            functools.partial(_raw_tgmm, interpret=interpret))


# The kernels are looked up in their modules at each call, as the GPU backends' are, so that a
# test can wrap them where every registration finds them (tests/lowered_twins.py).
def _raw_gmm(*args, **kwargs):
    return _gmm_kernel.grouped_matmul(*args, **kwargs)


def _raw_tgmm(*args, **kwargs):
    return _tgmm_kernel.transposed_grouped_matmul(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def interpreted(params: Any = True) -> Differentiable:
    """Both kernels, differentiable and jitted, in Pallas interpret mode with `params` (True, or a
    `pltpu.InterpretParams`, e.g. to detect races and reads of uninitialised memory).

    They take the arguments as the dispatcher hands them to implementations (validated and
    normalised: see kernelhub/ops/*.py), so call them with well-formed ones.
    """
    return implementations(*_raw(params), tuning_space.INTERPRET, fold_scales=True)


compiled = register_grouped_matmuls(
    "pallas", "tpu", *_raw(False), tuning_space.CHIP, features=_FEATURES, fold_scales=True,
    priority=10, requirement=needs_device("tpu"))
emulated = register_grouped_matmuls(
    "pallas", "cpu", *_raw(True), tuning_space.INTERPRET, features=_FEATURES, fold_scales=True,
    interpret_only=True)
