"""qwix.QArray operands: native layouts become QuantizedArrays, the rest exact float32.

Results are checked against the float64 product of qwix's own dequantization (with its scale
widened to float32, as kernelhub computes), each implementation with quantized operands taking
some of the layouts.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import reference
from conftest import assert_close, quantized_implementations
from kernelhub import QuantizedArray, _qwix
from kernelhub.ops import _checks
from slices import each_value_once
from strategies import normal

qwix = pytest.importorskip("qwix")

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"


def as_float64(value) -> np.ndarray:
    if _qwix.is_qarray(value):
        value = qwix.dequantize(value.replace(scale=value.scale.astype(jnp.float32)))
    return np.asarray(value, np.float64)


RNG = np.random.default_rng(20)
X = jnp.asarray(normal(RNG, (48, 256), jnp.float32))  # [m, k]
W = jnp.asarray(normal(RNG, (3, 256, 32), jnp.float32))  # [G, k, n]

# name: (lhs, rhs, whether each runs natively as a QuantizedArray)
LAYOUTS = {
    "int8 per row and column": (
        lambda: qwix.quantize(X, jnp.int8, channelwise_axes=[0]),
        lambda: qwix.quantize(W, jnp.int8, channelwise_axes=[0, 2]), (True, True)),
    "fp8 128-blocks along k, 16-wide tiles along n": (
        lambda: qwix.quantize(X, jnp.float8_e4m3fn, channelwise_axes=[0], tiled_axes={1: 128}),
        lambda: qwix.quantize(W, jnp.float8_e4m3fn, channelwise_axes=[0],
                              tiled_axes={1: 128, 2: 16}), (True, True)),
    "int4 weights, bf16 scales": (
        lambda: X.astype(jnp.bfloat16),
        lambda: qwix.quantize(W, jnp.int4, channelwise_axes=[0, 2], scale_dtype=jnp.bfloat16),
        (False, True)),
    "asymmetric weights": (
        lambda: X,
        lambda: qwix.quantize(W, jnp.int8, channelwise_axes=[0, 2], calibration_method="minmax"),
        (False, False)),
    "lhs with a scale per k column, tiled along m": (
        lambda: qwix.quantize(X, jnp.int8, channelwise_axes=[1], tiled_axes={0: 16}),
        lambda: W, (False, False)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_qarray_runs_natively_where_its_layout_allows(layout):
    make_lhs, make_rhs, native = LAYOUTS[layout]
    for make, axis, expected in ((make_lhs, 1, native[0]), (make_rhs, 1, native[1])):
        value = make()
        if not _qwix.is_qarray(value):
            continue
        converted = _qwix.converted(value, axis)
        assert isinstance(converted, QuantizedArray) == expected, converted
        if isinstance(converted, QuantizedArray):
            # qwix's own value dtype, not a wider copy (int4 stays int4, packed).
            assert converted.axis == axis and converted.dtype == jnp.dtype(value.qtype)
        np.testing.assert_allclose(as_float64(converted.dequantize() if expected else converted),
                                   as_float64(value), rtol=1e-6, atol=1e-6)


# Each layout on one implementation, each implementation at least once, not every pair: a
# QArray becomes a QuantizedArray or an exact float32 array before any implementation is
# chosen (kernelhub/_qwix.py), and what each implementation makes of a QuantizedArray of each
# layout is tests/test_quantization.py's and tests/test_formats.py's.
@pytest.mark.parametrize("spec, layout", each_value_once(quantized_implementations(GMM),
                                                        list(LAYOUTS)))
def test_gmm_of_qarrays_is_the_product_of_their_dequantized_values(spec, layout):
    make_lhs, make_rhs, _ = LAYOUTS[layout]
    lhs, rhs = make_lhs(), make_rhs()
    as_given = {name: _qwix.converted(value, 1) if _qwix.is_qarray(value) else value
                for name, value in (("lhs", lhs), ("rhs", rhs))}
    needed = _checks.features(as_given)
    if not needed <= spec.features:
        pytest.skip(f"{spec.platform.value} lacks {sorted(needed - spec.features)}")
    sizes = np.array([10, 0, 30], np.int32)
    out = kernelhub.get(GMM, platform=spec.platform)(lhs, rhs, jnp.asarray(sizes))
    want = reference.gmm(as_float64(lhs), as_float64(rhs), sizes)
    assert_close(out, want, jnp.float32, contraction=256)


# One implementation, as above: the QArrays are converted before one is chosen. The last,
# which the pairing above gives the fewest layouts.
@pytest.mark.parametrize("spec", quantized_implementations(TGMM)[-1:])
def test_tgmm_of_qarrays_along_m(spec):
    rng = np.random.default_rng(21)
    lhs = qwix.quantize(jnp.asarray(normal(rng, (16, 256), jnp.float32)), jnp.int8,
                        channelwise_axes=[0], tiled_axes={1: 64})
    rhs = qwix.quantize(jnp.asarray(normal(rng, (256, 8), jnp.float32)), jnp.float8_e5m2,
                        channelwise_axes=[1], tiled_axes={0: 64})
    sizes = np.array([100, 0, 120], np.int32)
    needed = _checks.features({"lhs": _qwix.converted(lhs, 1), "rhs": _qwix.converted(rhs, 0)})
    if not needed <= spec.features:
        pytest.skip(f"{spec.platform.value} lacks {sorted(needed - spec.features)}")
    out = kernelhub.get(TGMM, platform=spec.platform)(lhs, rhs, jnp.asarray(sizes))
    want = reference.tgmm(as_float64(lhs), as_float64(rhs), sizes)
    assert_close(out, want, jnp.float32, contraction=256)


def test_qarray_of_a_wrong_rank_names_the_argument():
    lhs = qwix.quantize(X[None], jnp.int8, channelwise_axes=[1])
    with pytest.raises(ValueError, match="lhs must have rank 2 .*qwix QArray of shape"):
        kernelhub.grouped_matmul(lhs, W, jnp.asarray([10, 0, 30], jnp.int32))
