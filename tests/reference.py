"""The float64 numpy reference for both ops and their VJPs: the tests' single source of truth.

Written from the contract (kernelhub/ops/*.py) with plain loops over groups; it shares no code
with any implementation.
"""

from __future__ import annotations

import numpy as np


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64) if x is not None else None


def group_rows(group_sizes, rows: int) -> list[tuple[int, int]]:
    """[(start, end)] per group, sizes taken as given (the contract: >= 0, sum <= rows)."""
    bounds, start = [], 0
    for size in np.asarray(group_sizes).tolist():
        end = min(start + size, rows)
        bounds.append((start, end))
        start = end
    return bounds


def gmm(lhs, rhs, group_sizes, group_offset=0, existing_out=None, transpose_rhs=False):
    lhs, rhs = _f64(lhs), _f64(rhs)
    weights = np.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    m, n = lhs.shape[0], weights.shape[2]
    out = np.zeros((m, n)) if existing_out is None else _f64(existing_out).copy()
    for g, (start, end) in enumerate(group_rows(group_sizes, m)):
        j = g - group_offset
        if 0 <= j < rhs.shape[0]:
            out[start:end] = lhs[start:end] @ weights[j]
    return out


def tgmm(lhs, rhs, group_sizes, group_offset=0, num_actual_groups=None, existing_out=None):
    lhs, rhs = _f64(lhs), _f64(rhs)
    k, m = lhs.shape
    bounds = group_rows(group_sizes, m)
    actual = len(bounds) - group_offset if num_actual_groups is None else num_actual_groups
    out = np.zeros((actual, k, rhs.shape[1])) if existing_out is None else _f64(existing_out).copy()
    for j in range(actual):
        start, end = bounds[group_offset + j]
        out[j] += lhs[:, start:end] @ rhs[start:end]
    return out


def gmm_vjp(lhs, rhs, group_sizes, d_out, group_offset=0, transpose_rhs=False, has_existing=False):
    """(d_lhs, d_rhs, d_existing_out) of gmm for the output cotangent d_out."""
    lhs, rhs, d_out = _f64(lhs), _f64(rhs), _f64(d_out)
    weights = np.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    d_lhs, d_weights = np.zeros_like(lhs), np.zeros_like(weights)
    d_existing = d_out.copy()
    for g, (start, end) in enumerate(group_rows(group_sizes, lhs.shape[0])):
        j = g - group_offset
        if 0 <= j < rhs.shape[0]:
            d_lhs[start:end] = d_out[start:end] @ weights[j].T
            d_weights[j] = lhs[start:end].T @ d_out[start:end]
            d_existing[start:end] = 0
    d_rhs = np.swapaxes(d_weights, 1, 2) if transpose_rhs else d_weights
    return d_lhs, d_rhs, (d_existing if has_existing else None)


def tgmm_vjp(lhs, rhs, group_sizes, d_out, group_offset=0, has_existing=False):
    """(d_lhs, d_rhs, d_existing_out) of tgmm for the output cotangent d_out [A, k, n]."""
    lhs, rhs, d_out = _f64(lhs), _f64(rhs), _f64(d_out)
    d_lhs, d_rhs = np.zeros_like(lhs), np.zeros_like(rhs)
    bounds = group_rows(group_sizes, lhs.shape[1])
    for j in range(d_out.shape[0]):
        start, end = bounds[group_offset + j]
        d_lhs[:, start:end] = d_out[j] @ rhs[start:end].T
        d_rhs[start:end] = lhs[:, start:end].T @ d_out[j]
    return d_lhs, d_rhs, (d_out.copy() if has_existing else None)
