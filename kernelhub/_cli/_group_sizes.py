"""Group-size patterns the benchmarks time: balanced, and skewed like a real router."""

from __future__ import annotations

import numpy as np

PATTERNS = ("balanced", "skewed")


def group_sizes(m: int, groups: int, pattern: str, seed: int = 0) -> np.ndarray:
    """int32 [groups] summing to m: as even as possible, or Dirichlet(alpha=0.5) proportions."""
    if pattern == "balanced":
        sizes = np.full(groups, m // groups)
        sizes[: m - sizes.sum()] += 1
        return sizes.astype(np.int32)
    if pattern != "skewed":
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    rng = np.random.default_rng(seed)
    return rng.multinomial(m, rng.dirichlet(np.full(groups, 0.5))).astype(np.int32)
