"""Pallas Mosaic GPU kernels for Hopper (sm_90), and the same kernels in interpret mode on CPU.

Registered as (mosaic, gpu), usable on a Hopper GPU (wgmma is Hopper's; other GPUs keep the
Triton kernels) at a priority below the Triton kernels': a call takes it where the device
kind's shipped table measured it faster for that call (docs/dispatch.md, "Per call"), and as
(mosaic, cpu), run only when forced (`platform="mosaic"` or
KERNELHUB_PLATFORM=mosaic) to test the kernels without a GPU. Quantized operands with one
scale per row and column run here (fp8 on fp8 wgmma, int8 on int8 wgmma), and so do scale
blocks (scale_blocks.py) and 4-bit values (int4, float4_e2m1fn: read as stored, converted per
tile to 16 bits in shared memory; operand_types.py). Every feature the registry knows is
taken here but symbolic shapes (config.check_static).
Pallas itself is imported when a kernel is first traced, not here. Design: docs/gpu.md.
"""

from __future__ import annotations

import functools

import jax

from kernelhub import ops  # noqa: F401  (declares the ops registered here)
from kernelhub._core.registry import needs_device
from kernelhub._grouped_matmul.names import (ACTIVATION, BIAS, GLU, QUANTIZED,
                                            QUANTIZED_4BIT, QUANTIZED_BLOCKS)
from kernelhub._grouped_matmul.registration import register_grouped_matmuls
from kernelhub._pallas.mosaic_gpu import tuning_space

# Below the Triton kernels' 10: the default on Hopper stays Triton until measured.
PRIORITY = 5
HOPPER = "9.0"


def _raw_gmm(*args, **kwargs):
    from kernelhub._pallas.mosaic_gpu.grouped_matmul import raw_grouped_matmul

    return raw_grouped_matmul(*args, **kwargs)


def _raw_tgmm(*args, **kwargs):
    from kernelhub._pallas.mosaic_gpu.transposed_grouped_matmul import (
        raw_transposed_grouped_matmul)

    return raw_transposed_grouped_matmul(*args, **kwargs)


def needs_hopper() -> str | None:
    """None on a host whose GPUs are Hopper (compute capability 9.0), else why not. Without a
    GPU the reason is needs_device's, which a forced backend="gpu" passes (lowering ahead of
    time needs no device)."""
    reason = needs_device("gpu")()
    if reason is not None:
        return reason
    found = sorted({str(getattr(d, "compute_capability", "?")) for d in jax.devices()})
    if HOPPER not in found:
        return (f"needs a Hopper GPU (compute capability {HOPPER}, for wgmma); this host's GPUs "
                f"have {', '.join(found)}")
    return None


def _register(backend: str, interpret: bool, **how):
    # Quantized operands: int8, fp8 and 4-bit values reach the kernels with their one scale per
    # row or column folded around them (fold_scales): fp8 x fp8 and int8 x int8 multiply as
    # stored, other pairs converted per tile or widened exactly (config.py); scale blocks come
    # as `scales=`/`output_blocks=` (scale_blocks.py). Epilogues run on the float32 sums.
    return register_grouped_matmuls(
        "mosaic", backend, functools.partial(_raw_gmm, interpret=interpret),
        functools.partial(_raw_tgmm, interpret=interpret),
        tuning_space.space("mosaic-interpret" if interpret else "mosaic"),
        features=(QUANTIZED, QUANTIZED_4BIT, QUANTIZED_BLOCKS, BIAS, ACTIVATION, GLU),
        fold_scales=True, **how)


compiled = _register("gpu", interpret=False, priority=PRIORITY, requirement=needs_hopper)
interpreted = _register("cpu", interpret=True, interpret_only=True)
