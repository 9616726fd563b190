"""Hypothesis strategies for grouped-matmul problems, covering the contract's edges."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

PATTERNS = ("random", "with_zeros", "one_group_all", "sum_below_m", "all_empty", "unaligned")
DTYPE_PAIRS = (
    (jnp.float32, jnp.float32, jnp.float32),
    (jnp.bfloat16, jnp.bfloat16, jnp.float32),
    (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16),
    (jnp.bfloat16, jnp.float32, jnp.float32),  # mixed inputs
)


@dataclasses.dataclass
class Problem:
    m: int
    k: int
    n: int
    group_sizes: np.ndarray
    local_groups: int
    group_offset: int
    lhs_dtype: object
    rhs_dtype: object
    out_dtype: object
    with_existing: bool
    transpose_rhs: bool
    seed: int

    @property
    def num_groups(self) -> int:
        return len(self.group_sizes)


def sizes_for(pattern: str, m: int, groups: int, rng: np.random.Generator) -> np.ndarray:
    if pattern == "all_empty":
        return np.zeros(groups, np.int32)
    if pattern == "one_group_all":
        sizes = np.zeros(groups, np.int32)
        sizes[rng.integers(groups)] = m
        return sizes
    total = m if pattern != "sum_below_m" else int(rng.integers(0, m + 1) * 0.7)
    weights = rng.dirichlet(np.full(groups, 0.5))
    if pattern == "with_zeros" and groups > 1:
        weights[rng.choice(groups, size=max(1, groups // 2), replace=False)] = 0
        weights = weights / weights.sum() if weights.sum() else np.full(groups, 1 / groups)
    sizes = rng.multinomial(total, weights).astype(np.int32)
    if pattern == "unaligned":
        # odd, prime-ish sizes; what is left over stays past the last group
        sizes = np.minimum(sizes, np.array([7, 13, 1, 29, 3, 11, 17, 5, 19][:groups] * 9)[:groups]).astype(np.int32)
    return sizes


@st.composite
def problems(draw, max_rows: int = 72, max_dim: int = 40, max_groups: int = 9,
             transposable: bool = True, patterns: Iterator[str] | None = None) -> Problem:
    """A drawn problem; its size pattern the next of `patterns` when given (hypothesis's own
    draws of a few examples repeat some patterns and miss others)."""
    m = draw(st.integers(1, max_rows))
    k = draw(st.integers(1, max_dim))
    n = draw(st.integers(1, max_dim))
    groups = draw(st.integers(1, max_groups))
    pattern = draw(st.sampled_from(PATTERNS)) if patterns is None else next(patterns)
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    local_groups = draw(st.integers(1, groups))
    offset = draw(st.integers(0, groups - local_groups))
    lhs_dtype, rhs_dtype, out_dtype = draw(st.sampled_from(DTYPE_PAIRS))
    return Problem(m, k, n, sizes_for(pattern, m, groups, rng), local_groups, offset,
                   lhs_dtype, rhs_dtype, out_dtype, draw(st.booleans()),
                   transposable and draw(st.booleans()), seed)


def normal(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Standard normal values already rounded to `dtype`, returned as that dtype's numpy array."""
    return np.array(jnp.asarray(rng.standard_normal(shape), dtype))
