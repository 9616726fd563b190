"""What the roofline decides for the Mosaic GPU kernels' tiles: whether a call is bound by
its FLOPs (the heuristic warp-specializes those), and whether converting 8-bit tiles in shared
memory beats copying them first (`upcast`)."""

from __future__ import annotations

import numpy as np

from kernelhub._grouped_matmul import gpu_peaks
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas.mosaic_gpu import operand_types

# The roofline of `upcast_pays` and `compute_bound`: an H100 SXM's spec sheet (an H200's
# differs only in HBM); only the ratios of its rates matter.
_ROOFLINE_PEAK = gpu_peaks.peak_for("H100 SXM")


def upcast_pays(problem: Problem, compute_warpgroups: int = 1) -> bool:
    """Whether converting the 8-bit tiles in shared memory (16-bit wgmma, every operand read as
    stored) beats copying first, where one compute warpgroup runs. Warp-specialized (gmm only), the
    compute warpgroups would spend on conversions time they multiply in, in the compute-bound calls
    the heuristic warp-specializes: unmeasured, so the heuristic copies first there and the tuner
    times both. A pair no 8-bit wgmma takes is multiplied at the 16-bit rate (float32's beside
    float32) either way, and converting moves fewer bytes: always. Two 8-bit operands of one kind
    with weights [G, k, n], by the roofline: max(FLOPs / 16-bit peak, bytes / HBM) against max(FLOPs
    / 8-bit peak, bytes / HBM) + 2 * weight bytes / HBM (the K-major copy). Memory-bound calls
    (fine-grained MoE: 64 rows per expert) convert, compute-bound ones (Mixtral) copy. The tuner
    times both."""
    if not operand_types.upcast_applies(problem):
        return False
    if compute_warpgroups != 1 or not problem.static:
        return False
    if operand_types.operand_bytes(problem) != 1:
        return True
    m, k, n = problem.m, problem.k, problem.n
    flops = 2.0 * m * k * n
    weights = float(problem.local_groups) * k * n
    moved = m * k + weights + m * n * np.dtype(problem.out_dtype).itemsize
    hbm = _ROOFLINE_PEAK.tbps * 1e12
    memory = moved / hbm
    upcast = max(flops / (_ROOFLINE_PEAK.tflops["bf16"] * 1e12), memory)
    copied = max(flops / (_ROOFLINE_PEAK.tflops["fp8"] * 1e12), memory) + 2 * weights / hbm
    return upcast < copied


def compute_bound(problem: Problem) -> bool:
    """Whether the roofline's FLOPs take longer than its bytes, at the local groups' share of
    the rows: each operand's computed rows read once, the weights (gmm) or the output (tgmm)
    of the local groups moved once, gmm's whole output written once. Mixtral's passes are
    (1024 rows an expert), fine-grained MoE's (64) are not. False for symbolic shapes."""
    if not problem.static:
        return False
    m, k, n = problem.m, problem.k, problem.n
    # The local groups' expected rows (DeepSeek-V3's shard computes 32 of 256 experts' rows).
    rows = m * problem.local_groups / max(problem.num_groups, 1)
    width = operand_types.operand_bytes(problem)
    out = np.dtype(problem.out_dtype).itemsize
    per_group = float(problem.local_groups) * k * n
    if problem.kernel is Kernel.TGMM:
        moved = (rows * k + rows * n) * width + per_group * out
    else:
        moved = (rows * k + per_group) * width + m * n * out
    rate = _ROOFLINE_PEAK.tflops["fp8" if width == 1 else "bf16"] * 1e12
    return 2.0 * rows * k * n / rate > moved / (_ROOFLINE_PEAK.tbps * 1e12)
