"""The GPUs' spec-sheet peaks, one table: the GPU scoreboard's roofline
(kernelhub/_cli/bench/gpu_roofline.py) and the Mosaic GPU kernels' fp8 upcast choice
(kernelhub/_pallas/mosaic_gpu/roofline.py) both read it."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Peak:
    """A chip's dense tensor-core rate per operand format and its HBM bandwidth, from the
    vendor's spec sheet (not measured: a measured ceiling is lower, so fractions read high
    against the spec would be impossible, and low ones are honest)."""

    name: str  # as the report names it
    tflops: dict[str, float]  # dense, by operand format of DTYPES
    tbps: float
    kinds: tuple[str, ...]  # jax device_kind contains one of these
    not_kinds: tuple[str, ...] = ()  # ... and none of these (another part of the same name)

    def matches(self, device_kind: str) -> bool:
        kind = device_kind.upper()
        return (any(part in kind for part in self.kinds)
                and not any(part in kind for part in self.not_kinds))

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "tflops": dict(self.tflops), "tbps": self.tbps}


# One table, the spec sheets' dense (no sparsity) figures. H100 PCIe and NVL parts have lower
# clocks and other memory: they are not the SXM part and get no peak rather than a wrong one.
PEAKS = (
    Peak("H100 SXM", {"bf16": 989.0, "fp8": 1979.0}, 3.35, ("H100",), ("PCIE", "NVL")),
    Peak("H200", {"bf16": 989.0, "fp8": 1979.0}, 4.8, ("H200",)),
)


def peak_for(device_kind: str) -> Peak | None:
    return next((peak for peak in PEAKS if peak.matches(device_kind)), None)
