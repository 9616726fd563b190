"""What the GPU benchmark's tables are made of: the MoE shapes it runs at, and one measurement
(kernelhub beside its peers at one shape) with the ways it is shown: a progress line, a
markdown row, a JSON record."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    m: int
    k: int
    n: int
    experts: int
    local: int  # experts computed here (< experts: an expert-parallel shard, with group_offset)
    # The gated unit's output columns (its weights hold twice as many: gate and up), where n
    # is not the expert's hidden size: GPT-OSS's n is its fused gate-up projection.
    gated_columns: int | None = None

    @property
    def hidden(self) -> int:
        """The expert's hidden size: a gated unit's output columns."""
        return self.gated_columns or self.n

    @property
    def offset(self) -> int:
        # The second shard, so that group_offset is exercised and the rows before it are skipped.
        return self.local if self.local < self.experts else 0


SHAPES = (
    Shape("mixtral", 8192, 4096, 14336, 8, 8),
    Shape("deepseek-v3", 16384, 7168, 2048, 256, 32),
    Shape("qwen3-moe", 8192, 2048, 768, 128, 128),
    # GPT-OSS-120B's gate-up projection: 2 x 2880 columns, gate and up interleaved
    Shape("gpt-oss", 8192, 2880, 5760, 128, 128, gated_columns=2880),
    Shape("odd", 1000, 520, 200, 7, 7),
)
SMOKE_SHAPES = (Shape("smoke", 96, 32, 48, 4, 4), Shape("smoke-shard", 96, 32, 48, 8, 2))


@dataclasses.dataclass
class Measurement:
    """One pass at one shape and group-size pattern: the seconds of kernelhub and of each peer
    (None: it failed), and how far kernelhub's result is from the reference's."""

    # kernelhub's peers in the main table, each with the decimals its speed ratio is shown with;
    # a table of other peers overrides it.
    PEERS: ClassVar[dict[str, int]] = {"dense": 2, "ragged_dot": 1}

    shape: Shape
    pattern: str
    pass_name: str
    flops: float
    seconds: dict[str, float | None]
    max_relative_error: float | None = None

    @classmethod
    def implementations(cls) -> tuple[str, ...]:
        return ("kernelhub", *cls.PEERS)

    def tflops(self, implementation: str) -> float | None:
        seconds = self.seconds.get(implementation)
        return None if not seconds else self.flops / seconds / 1e12

    def ratio(self, implementation: str) -> float | None:
        """kernelhub's speed over `implementation`'s (>1: kernelhub is faster)."""
        ours, theirs = self.seconds.get("kernelhub"), self.seconds.get(implementation)
        return None if not ours or not theirs else theirs / ours

    def one_line(self, label: str) -> str:
        """The line printed when the measurement is done; `label` names it within its shape."""
        return (f"{self.shape.name:12s} {label} "
                + " ".join(f"{name}={format_number(self.tflops(name))}"
                           for name in self.implementations())
                + " TFLOP/s"
                + "".join(f"  vs {peer} {format_number(self.ratio(peer), digits)}x"
                          for peer, digits in self.PEERS.items()))

    def markdown_row(self, *labels: str) -> str:
        """Shape, `labels`, TFLOP/s of each implementation, kernelhub's ratios, error."""
        error = "-" if self.max_relative_error is None else f"{self.max_relative_error:.1e}"
        cells = [self.shape.name, *labels,
                 *(format_number(self.tflops(name)) for name in self.implementations()),
                 *(format_number(self.ratio(peer), digits) for peer, digits in self.PEERS.items()),
                 error]
        return "| " + " | ".join(cells) + " |"

    def record(self, label_key: str) -> dict[str, Any]:
        """The raw numbers for the JSON report, the pass under `label_key`."""
        return {"shape": dataclasses.asdict(self.shape), "pattern": self.pattern,
                label_key: self.pass_name, "flops": self.flops, "seconds": self.seconds,
                "tflops": {name: self.tflops(name) for name in self.implementations()},
                "max_relative_error": self.max_relative_error}


def relative_error(actual: Any, expected: Any) -> float:
    actual = np.asarray(jnp.asarray(actual, jnp.float32), np.float64)
    expected = np.asarray(jnp.asarray(expected, jnp.float32), np.float64)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-30)
    return float(np.max(np.abs(actual - expected), initial=0.0)) / scale


def format_number(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if 0 < abs(value) < 10.0 ** -digits:
        return f"{value:.2g}"  # smoke runs and slow peers: keep the digits that matter
    return f"{value:.{digits}f}"
