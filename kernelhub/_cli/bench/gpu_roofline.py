"""The roofline every pass of the GPU scoreboard is judged by: the chips' spec-sheet peaks, the
FLOPs and the compulsory bytes of one pass, and the figures of one timed row.

Roofline time = max(FLOPs / peak FLOP/s, compulsory bytes / peak HBM bandwidth). The bytes are
the fewest any kernel must move through HBM (docs/gpu.md, "The scoreboard"):

- the computed rows of each input, read once (rows outside the local experts are not read);
- the local experts' weights, read once (a gradient of the weights is written once instead);
- every output element, written once: all m rows of a row-major [m, ·] output, since rows
  outside the local groups are written too (zeros), and all local experts of a weight gradient;
- with quantized operands, their float32 scales (one per row or column), read once.

At 32-256 rows per expert the weights dominate and a pass is bound by bandwidth, not FLOPs.
Nothing here runs a kernel: the arithmetic is tested by hand on the CPU (tests/test_bench.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The chips' peaks live in the kit, where the Mosaic GPU kernels' upcast choice reads them too.
from kernelhub._grouped_matmul.gpu_peaks import PEAKS, Peak, peak_for  # noqa: F401

PASSES = ("forward", "lhs_gradient", "rhs_gradient")
# What each pass is as one kernel call (the custom VJP's own calls, autodiff.py).
PASS_CALLS = {"forward": "gmm", "lhs_gradient": "gmm, weights transposed",
              "rhs_gradient": "tgmm"}
# Operand formats: bytes per stored value, and per scale (one float32 per row or column).
DTYPES = {"bf16": (2, 0), "fp8": (1, 4)}
OUT_DTYPE = "bf16"
OUT_BYTES = 2


@dataclasses.dataclass(frozen=True)
class PassProblem:
    """One pass at one shape, group sizes and format: what the roofline needs of it.

    gmm's lhs is [m, k] and its weights [experts, k, n]; `rows` are the rows of the local
    experts (the computed rows), `local` the experts computed here (group_offset shards)."""

    pass_name: str
    m: int
    k: int
    n: int
    rows: int
    local: int
    dtype: str  # a key of DTYPES

    def __post_init__(self):
        if self.pass_name not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}, got {self.pass_name!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")

    @property
    def flops(self) -> float:
        """Every pass multiplies the computed rows by one expert's [k, n] each: 2 R k n."""
        return 2.0 * self.rows * self.k * self.n

    @property
    def compulsory_bytes(self) -> float:
        value, scale = DTYPES[self.dtype]
        r, k, n, m, g = self.rows, self.k, self.n, self.m, self.local
        weights = g * k * n
        if self.pass_name == "forward":  # x[R, k] @ w[g] -> out[m, n]
            read = value * (r * k + weights) + scale * (r + g * n)
            written = m * n
        elif self.pass_name == "lhs_gradient":  # dy[R, n] @ w[g]^T -> d x[m, k]
            read = value * (r * n + weights) + scale * (r + g * k)
            written = m * k
        else:  # x^T[k, R] @ dy[R, n] per expert -> d w[g, k, n]
            read = value * (r * k + r * n) + scale * (k + n)
            written = weights
        return float(read + OUT_BYTES * written)

    def roofline_seconds(self, peak: Peak) -> float:
        return max(self.flops / (peak.tflops[self.dtype] * 1e12),
                   self.compulsory_bytes / (peak.tbps * 1e12))

    def bound(self, peak: Peak) -> str:
        """Which ceiling sets the roofline: "memory" or "compute"."""
        memory = self.compulsory_bytes / (peak.tbps * 1e12)
        return "memory" if memory >= self.flops / (peak.tflops[self.dtype] * 1e12) else "compute"


def figures(problem: PassProblem, peak: Peak, seconds: float | None) -> dict[str, float | None]:
    """seconds, TFLOP/s, TB/s (compulsory bytes over the time) and the fraction of the
    roofline a row reached; all None for a row that was not timed."""
    if not seconds:
        return {"seconds": None, "tflops": None, "tbps": None, "roofline_fraction": None}
    return {"seconds": seconds, "tflops": problem.flops / seconds / 1e12,
            "tbps": problem.compulsory_bytes / seconds / 1e12,
            "roofline_fraction": problem.roofline_seconds(peak) / seconds}


# A result row, field for field as issue 33 lists them, plus `note` (why a row has no time, or
# what its check found) and, for kernelhub's rows, `tilings`: each kernel call's kernel and the
# tiling it ran (the table in force or the heuristic's), so that a table made from the row
# files its time under the tiling it measured (gpu_scoreboard_table.py). `seconds` is the
# device's time per call (calls back to back, gpu_scoreboard.BACK_TO_BACK); `seconds_one_call`
# one call's median round trip from the host, as the scoreboard's first four runs (to
# 2026-11-27) timed `seconds`.
ROW_FIELDS = ("shape", "groups", "pass", "dtype", "out_dtype", "implementation", "default",
              "seconds", "tflops", "tbps", "roofline_fraction", "note", "tilings",
              "seconds_one_call")


def row(shape: str, groups: str, problem: PassProblem, implementation: str, default: bool,
        peak: Peak, seconds: float | None, note: str | None = None,
        tilings: list[dict[str, Any]] | None = None,
        seconds_one_call: float | None = None) -> dict[str, Any]:
    record = {"shape": shape, "groups": groups, "pass": problem.pass_name,
              "dtype": problem.dtype, "out_dtype": OUT_DTYPE, "implementation": implementation,
              "default": default, **figures(problem, peak, seconds), "note": note,
              "tilings": tilings, "seconds_one_call": seconds_one_call}
    assert tuple(record) == ROW_FIELDS
    return record
