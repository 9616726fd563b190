"""The float64 numpy reference for both ops and their VJPs: the tests' single source of truth.

Written from the contract (kernelhub/ops/*.py) with plain loops over groups; it shares no code
with any implementation.
"""

from __future__ import annotations

import math

import numpy as np


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64) if x is not None else None


# --- epilogues: (value, derivative) of each activation in float64 -----------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # = 1 / (1 + exp(-z)), without overflow


def _relu(z):
    return np.maximum(z, 0.0), (z > 0).astype(np.float64)


def _silu(z):
    s = _sigmoid(z)
    return z * s, s + z * s * (1.0 - s)


def _gelu(z):
    cdf = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return z * cdf, cdf + z * pdf


def _gelu_tanh(z):
    t = np.tanh(_SQRT_2_OVER_PI * (z + _GELU_TANH_CUBIC * z ** 3))
    d_inner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_CUBIC * z * z)
    return 0.5 * z * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * d_inner


def _tanh(z):
    t = np.tanh(z)
    return t, 1.0 - t * t


def _sigmoid_pair(z):
    s = _sigmoid(z)
    return s, s * (1.0 - s)


def _identity(z):
    return z, np.ones_like(z)


ACTIVATIONS = {"relu": _relu, "silu": _silu, "gelu": _gelu, "gelu_tanh": _gelu_tanh,
               "tanh": _tanh, "sigmoid": _sigmoid_pair, "identity": _identity}
GLUS = ("silu", "gelu", "gelu_tanh", "swiglu_oai")
SWIGLU_OAI_LIMIT, SWIGLU_OAI_ALPHA = 7.0, 1.702


def _activation(activation, z):
    """(act(z), act'(z)) for a name of ACTIVATIONS, a numpy callable (its derivative by central
    differences: it is elementwise), or None."""
    if activation is None:
        return _identity(z)
    if isinstance(activation, str):
        return ACTIVATIONS[activation](z)
    step = 1e-5 * np.maximum(1.0, np.abs(z))
    derivative = (activation(z + step) - activation(z - step)) / (2.0 * step)
    return np.asarray(activation(z), np.float64), derivative


def _halves(z, glu_layout):
    if glu_layout == "interleaved":
        return z[:, 0::2], z[:, 1::2]
    half = z.shape[1] // 2
    return z[:, :half], z[:, half:]


def _joined(d_gate, d_up, glu_layout):
    d_z = np.empty((d_gate.shape[0], 2 * d_gate.shape[1]))
    gate, up = _halves(d_z, glu_layout)  # views into d_z
    gate[...], up[...] = d_gate, d_up
    return d_z


def _gated(glu, gate, up):
    """(out, d out / d gate, d out / d up) of the gated unit, elementwise."""
    if glu == "swiglu_oai":
        open_gate = gate < SWIGLU_OAI_LIMIT
        open_up = np.abs(up) < SWIGLU_OAI_LIMIT
        gate = np.minimum(gate, SWIGLU_OAI_LIMIT)
        up = np.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
        s = _sigmoid(SWIGLU_OAI_ALPHA * gate)
        glu_value = gate * s
        d_glu = s + SWIGLU_OAI_ALPHA * gate * s * (1.0 - s)
        return (up + 1.0) * glu_value, (up + 1.0) * d_glu * open_gate, glu_value * open_up
    value, derivative = ACTIVATIONS[glu](gate)
    return value * up, derivative * up, value


def epilogue(z, activation=None, glu=None, glu_layout="concatenated"):
    """The output of float64 pre-activations z [rows, n_rhs] (bias added)."""
    if glu is None:
        return _activation(activation, z)[0]
    return _gated(glu, *_halves(z, glu_layout))[0]


def epilogue_vjp(z, d_out, activation=None, glu=None, glu_layout="concatenated"):
    """d z [rows, n_rhs] for the output cotangent d_out."""
    if glu is None:
        return _activation(activation, z)[1] * d_out
    _, d_gate, d_up = _gated(glu, *_halves(z, glu_layout))
    return _joined(d_gate * d_out, d_up * d_out, glu_layout)


def group_rows(group_sizes, rows: int) -> list[tuple[int, int]]:
    """[(start, end)] per group, sizes taken as given (the contract: >= 0, sum <= rows)."""
    bounds, start = [], 0
    for size in np.asarray(group_sizes).tolist():
        end = min(start + size, rows)
        bounds.append((start, end))
        start = end
    return bounds


def gmm(lhs, rhs, group_sizes, group_offset=0, existing_out=None, transpose_rhs=False,
        bias=None, activation=None, glu=None, glu_layout="concatenated"):
    """The output [m, n]: each local group's rows lhs[rows] @ rhs[j] (+ bias[j]) through the
    epilogue (an activation: a name of ACTIVATIONS or a numpy callable; or a gated unit: a name
    of GLUS with its halves laid out by glu_layout); every other row 0 or existing_out's."""
    lhs, rhs, bias = _f64(lhs), _f64(rhs), _f64(bias)
    weights = np.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    m, n_rhs = lhs.shape[0], weights.shape[2]
    n = n_rhs // 2 if glu is not None else n_rhs
    out = np.zeros((m, n)) if existing_out is None else _f64(existing_out).copy()
    for g, (start, end) in enumerate(group_rows(group_sizes, m)):
        j = g - group_offset
        if 0 <= j < rhs.shape[0]:
            z = lhs[start:end] @ weights[j]
            if bias is not None:
                z = z + bias[j]
            out[start:end] = epilogue(z, activation, glu, glu_layout)
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


def gmm_vjp(lhs, rhs, group_sizes, d_out, group_offset=0, transpose_rhs=False, has_existing=False,
            **epilogue_arguments):
    """(d_lhs, d_rhs, d_existing_out) of gmm for the output cotangent d_out (epilogue_arguments:
    gmm's bias, activation, glu, glu_layout)."""
    grads = gmm_epilogue_vjp(lhs, rhs, group_sizes, d_out, group_offset, transpose_rhs,
                             has_existing, **epilogue_arguments)
    return grads["lhs"], grads["rhs"], grads["existing_out"]


def gmm_epilogue_vjp(lhs, rhs, group_sizes, d_out, group_offset=0, transpose_rhs=False,
                     has_existing=False, bias=None, activation=None, glu=None,
                     glu_layout="concatenated") -> dict:
    """{"lhs", "rhs", "existing_out", "bias"} cotangents of gmm for d_out (None for an argument
    not given). The epilogue's derivative is analytic for the named ones, central differences
    in float64 for a callable; a group without rows gets a bias cotangent of exactly 0."""
    lhs, rhs, d_out, bias = _f64(lhs), _f64(rhs), _f64(d_out), _f64(bias)
    weights = np.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    d_lhs, d_weights = np.zeros_like(lhs), np.zeros_like(weights)
    d_bias = None if bias is None else np.zeros_like(bias)
    d_existing = d_out.copy()
    for g, (start, end) in enumerate(group_rows(group_sizes, lhs.shape[0])):
        j = g - group_offset
        if 0 <= j < rhs.shape[0]:
            z = lhs[start:end] @ weights[j]
            if bias is not None:
                z = z + bias[j]
            d_z = epilogue_vjp(z, d_out[start:end], activation, glu, glu_layout)
            d_lhs[start:end] = d_z @ weights[j].T
            d_weights[j] = lhs[start:end].T @ d_z
            if bias is not None:
                d_bias[j] = d_z.sum(axis=0)
            d_existing[start:end] = 0
    d_rhs = np.swapaxes(d_weights, 1, 2) if transpose_rhs else d_weights
    return {"lhs": d_lhs, "rhs": d_rhs, "existing_out": d_existing if has_existing else None,
            "bias": d_bias}


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
