"""Integer, raw 8-bit and quantized operands of ragged_dot and ragged_dot_general (issue 24).

lax's own results are the reference for what it computes (exactly, for integer results), and
an independent float64 reference (tests/ragged_reference.py, tests/reference.py) for everything,
group_offset included. Every implementation that runs here is tested; the interpret-mode kernels
on the cases that reach their own code: the dtypes' rules and the modes' rearrangements are
the kit's, the same for every backend, and XLA takes them all.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import kernelhub
import ragged_reference
from conftest import as_float64, implementation_params, quantized_operand
from kernelhub.ops import _checks

GROUP_SIZES = np.array([3, 0, 5, 2], np.int32)  # a group of 0, and a sum (10) below m (12)
M, K, N = 12, 40, 24

DN = lax.RaggedDotDimensionNumbers
MODE_1 = DN((([1], [1]), ([], [])), [0], [0])
# [b, m, k] x [g, b, n, k]: batch dims and an rhs read transposed.
MODE_1_BATCHED = DN((([2], [3]), ([0], [1])), [1], [0])
MODE_2 = DN((([0], [0]), ([], [])), [0], [])
MODE_3 = DN((([2], [1]), ([0], [0])), [0], [])


def _values(rng, shape, dtype):
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return jnp.asarray(rng.integers(int(info.min), int(info.max) + 1, shape), dtype)
    return jnp.asarray(rng.normal(size=shape) * 2, jnp.float32).astype(dtype)


# The peer's dequantized inputs in one jitted program (eagerly, each jax.numpy operation of
# dequantize compiles on its own); the float64 reference takes conftest.as_float64's.
_dequantize = jax.jit(kernelhub.QuantizedArray.dequantize)


@functools.cache
def _reference_program(group_sizes: tuple, numbers, group_offset):
    return jax.jit(lambda lhs, rhs: ragged_reference.ragged_dot_general(
        lhs, rhs, np.array(group_sizes, np.int32), numbers, group_offset=group_offset))


def _reference(lhs, rhs, group_sizes, numbers, group_offset=None) -> np.ndarray:
    program = _reference_program(tuple(np.asarray(group_sizes).tolist()), numbers, group_offset)
    with jax.enable_x64(True):
        return np.asarray(program(as_float64(lhs), as_float64(rhs)))


def _is_interpret(spec) -> bool:
    return spec.interpret_only


def _check_float(actual, expected, dtype) -> None:
    rtol = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 1e-2,
            jnp.dtype(jnp.float16): 2e-3}.get(jnp.dtype(dtype), 0.13)  # fp8 results: 3 bits
    actual = np.asarray(jnp.asarray(actual).astype(jnp.float32), np.float64)
    scale = max(1.0, float(np.max(np.abs(expected), initial=0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


# (lhs dtype, rhs dtype, preferred_element_type): lax accepts each. The interpret-mode kernels
# run the first three (INTERPRETED_PAIRS).
PAIRS = [
    (jnp.int8, jnp.int8, jnp.int32),
    (jnp.float8_e4m3fn, jnp.float8_e4m3fn, jnp.float32),
    (jnp.int8, jnp.bfloat16, None),
    (jnp.int8, jnp.int8, None),
    (jnp.int8, jnp.int8, jnp.float32),
    (jnp.int8, jnp.int8, jnp.bfloat16),
    (jnp.int4, jnp.int8, jnp.int32),
    (jnp.float8_e4m3fn, jnp.float8_e5m2, None),
    (jnp.float8_e5m2, jnp.bfloat16, None),
    (jnp.bfloat16, jnp.float8_e4m3fn, jnp.float32),
    (jnp.int8, jnp.float8_e4m3fn, None),
    (jnp.float32, jnp.int8, jnp.int32),
    (jnp.float32, jnp.float32, jnp.int32),
    (jnp.float16, jnp.bfloat16, None),
]
# Pairs of an integer and a float operand whose XLA lowering of lax converts the integer (or
# float) operand to the other's type before the product (int8 values to fp8, losing bits;
# float32 values to int32, truncating them): kernelhub multiplies the values as given and
# rounds the exact sum once. Only the result dtype is lax's there; values are the reference's.
LAX_CONVERTS_OPERANDS = [PAIRS[10], PAIRS[11]]


# Raw 8-bit operands in the interpreters' kernels: fp8 and an int8 x bfloat16 mix. Their int8
# products summed in int32 are test_int8_in_every_mode_is_exact_with_group_offset's and
# test_int32_sums_past_float32s_integers_are_exact's (exact, against the reference or the
# value); the result dtypes lax's rules give are the kit's, XLA's run.
INTERPRETED_PAIRS = PAIRS[1:3]


def _pair_id(pair) -> str:
    return "-".join("none" if d is None else jnp.dtype(d).name for d in pair)


@pytest.mark.parametrize("spec, pair", [
    pytest.param(implementation.values[0], pair, id=f"{_pair_id(pair)}-{implementation.id}")
    for implementation in implementation_params("ragged_dot")
    for pair in (INTERPRETED_PAIRS if _is_interpret(implementation.values[0]) else PAIRS)])
def test_raw_operands_match_lax_and_the_reference(spec, pair):
    lhs_dtype, rhs_dtype, preferred = pair
    rng = np.random.default_rng(PAIRS.index(pair))
    lhs, rhs = _values(rng, (M, K), lhs_dtype), _values(rng, (4, K, N), rhs_dtype)
    sizes = jnp.asarray(GROUP_SIZES)
    out = kernelhub.get("ragged_dot", platform=spec.platform)(
        lhs, rhs, sizes, preferred_element_type=preferred)
    expected = lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=preferred)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert not np.any(np.asarray(out.astype(jnp.float32))[GROUP_SIZES.sum():])
    exact = _reference(lhs, rhs, GROUP_SIZES, MODE_1)
    if pair in LAX_CONVERTS_OPERANDS:
        rounded = jnp.asarray(exact, jnp.float32).astype(out.dtype)
        np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)),
                                      np.asarray(rounded.astype(jnp.float32)))
    elif jnp.issubdtype(out.dtype, jnp.integer):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
        if out.dtype == jnp.int32 and jnp.issubdtype(lhs.dtype, jnp.integer):
            np.testing.assert_array_equal(np.asarray(out, np.float64), exact)
    else:
        if out.dtype.itemsize > 1:  # an fp8 result is NaN past its range, as lax's
            _check_float(out, exact, out.dtype)
        _check_float(out, as_float64(expected), out.dtype)


@pytest.mark.parametrize("spec", implementation_params("ragged_dot_general"))
def test_int8_in_every_mode_is_exact_with_group_offset(spec):
    rng = np.random.default_rng(7)
    general = kernelhub.get("ragged_dot_general", platform=spec.platform)
    cases = [  # (numbers, lhs shape, rhs shape, compared with lax)
        (MODE_1_BATCHED, (2, M, K), (4, 2, N, K), True),
        (MODE_2, (M, 8), (M, N), True),
        (MODE_3, (4, 6, K), (4, K, N), False),  # lax computes the entries past the groups
    ]
    if _is_interpret(spec):
        cases = cases[:2]
    for numbers, lhs_shape, rhs_shape, with_lax in cases:
        lhs, rhs = _values(rng, lhs_shape, jnp.int8), _values(rng, rhs_shape, jnp.int8)
        sizes = GROUP_SIZES if numbers is not MODE_3 else np.array([1, 0, 2, 0], np.int32)
        # The interpreters take the group_offset calls only: without one, their kernels' exact
        # int8 sums are test_int32_sums_past_float32s_integers_are_exact's, and the reference's
        # agreement with lax is XLA's run.
        if not _is_interpret(spec):
            out = general(lhs, rhs, jnp.asarray(sizes), numbers,
                          preferred_element_type=jnp.int32)
            assert out.dtype == jnp.int32
            np.testing.assert_array_equal(np.asarray(out, np.float64),
                                          _reference(lhs, rhs, sizes, numbers))
            if with_lax:
                np.testing.assert_array_equal(out, lax.ragged_dot_general(
                    lhs, rhs, jnp.asarray(sizes), numbers, preferred_element_type=jnp.int32))
        offset = jnp.array([1], jnp.int32)
        local = rhs[1:3] if numbers.rhs_group_dimensions else rhs  # mode 1: local groups 1, 2
        out = general(lhs, local, jnp.asarray(sizes), numbers, preferred_element_type=jnp.int32,
                      group_offset=offset)
        assert out.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(out, np.float64),
                                      _reference(lhs, local, sizes, numbers, group_offset=1))


@pytest.mark.parametrize("op", ["grouped_matmul", "transposed_grouped_matmul"])
@pytest.mark.parametrize("spec", implementation_params("grouped_matmul"))
def test_int32_sums_past_float32s_integers_are_exact(spec, op):
    # 1100 products of -128 * -128 sum to 18022400 > 2**24: float32 sums would round it.
    k = 1100
    sizes = jnp.array([3, 0, 2], jnp.int32)
    fn = kernelhub.get(op, platform=spec.platform)
    if op == "grouped_matmul":
        out = fn(jnp.full((6, k), -128, jnp.int8), jnp.full((3, k, 8), -128, jnp.int8), sizes,
                 preferred_element_type=jnp.int32,
                 existing_out=jnp.full((6, 8), 7, jnp.int32))
        np.testing.assert_array_equal(out[:5], np.full((5, 8), k * 16384))
        np.testing.assert_array_equal(out[5:], np.full((1, 8), 7))  # rows past the sum
    else:
        out = fn(jnp.full((4, k), -128, jnp.int8), jnp.full((k, 8), -128, jnp.int8),
                 jnp.array([k - 100, 0, 100], jnp.int32), preferred_element_type=jnp.int32)
        np.testing.assert_array_equal(out[:, 0, 0], [(k - 100) * 16384, 0, 100 * 16384])
    assert out.dtype == jnp.int32


@pytest.mark.parametrize("spec", implementation_params("ragged_dot"))
def test_gradients_follow_lax(spec):
    rng = np.random.default_rng(3)
    sizes = jnp.asarray(GROUP_SIZES)
    ragged_dot = kernelhub.get("ragged_dot", platform=spec.platform)
    x = _values(rng, (M, K), jnp.bfloat16)
    w8 = _values(rng, (4, K, N), jnp.int8)

    def loss(fn, x, w):
        return jnp.sum(fn(x, w, sizes, preferred_element_type=jnp.float32))

    # An integer operand takes no gradient (float0, as lax's with allow_int); the other its own.
    # Jitted: eagerly, every jax.numpy operation of the composite compiles on its own.
    d_x, d_w = jax.jit(jax.grad(lambda x, w: loss(ragged_dot, x, w), argnums=(0, 1),
                                allow_int=True))(x, w8)
    e_x, e_w = jax.jit(jax.grad(lambda x, w: loss(lax.ragged_dot, x, w), argnums=(0, 1),
                                allow_int=True))(x, w8)
    assert d_w.dtype == e_w.dtype == jax.dtypes.float0
    assert d_x.dtype == e_x.dtype == jnp.bfloat16
    _check_float(d_x, as_float64(e_x), jnp.bfloat16)
    # A raw fp8 operand's gradient is fp8, as lax's: summed in float32, rounded once.
    x8, w = x.astype(jnp.float8_e4m3fn), _values(rng, (4, K, N), jnp.bfloat16)
    d_x, d_w = jax.jit(jax.grad(lambda x, w: loss(ragged_dot, x, w), argnums=(0, 1)))(x8, w)
    e_x, e_w = jax.jit(jax.grad(lambda x, w: loss(lax.ragged_dot, x, w), argnums=(0, 1)))(x8, w)
    assert (d_x.dtype, d_w.dtype) == (e_x.dtype, e_w.dtype) == (x8.dtype, w.dtype)
    _check_float(d_x, as_float64(e_x), jnp.float8_e4m3fn)
    _check_float(d_w, as_float64(e_w), jnp.bfloat16)


# (numbers, lhs shape, rhs shape, lhs quantized axis, rhs quantized axis, block size)
QUANTIZED_CASES = [
    (MODE_1, (M, K), (4, K, N), 1, 1, 16),
    (MODE_1_BATCHED, (2, M, K), (4, 2, N, K), 2, 3, None),
    (MODE_2, (M, 8), (M, N), 0, 0, None),
    (MODE_3, (4, 6, K), (4, K, N), 2, 1, 8),
    # two contracting dims merged: quantized along the later one, blocks dividing it
    (DN((([1, 2], [1, 2]), ([], [])), [0], [0]), (M, 4, 16), (4, 4, 16, N), 2, 2, 8),
]
# The interpret-mode kernels: modes 1 (scale blocks, group_offset) and 2, their two kernels.
INTERPRETED_QUANTIZED = (0, 2)


@pytest.mark.parametrize("spec, case", [
    pytest.param(implementation.values[0], case, id=f"{case}-{implementation.id}")
    for implementation in implementation_params("ragged_dot_general")
    for case in (INTERPRETED_QUANTIZED if _is_interpret(implementation.values[0])
                 else range(len(QUANTIZED_CASES)))])
def test_quantized_operands_in_every_mode(spec, case):
    numbers, lhs_shape, rhs_shape, lhs_axis, rhs_axis, block = QUANTIZED_CASES[case]
    rng = np.random.default_rng(case)
    lhs = quantized_operand(jnp.asarray(rng.normal(size=lhs_shape), jnp.float32), jnp.int8,
                            axis=lhs_axis, block_size=block)
    rhs = quantized_operand(jnp.asarray(rng.normal(size=rhs_shape), jnp.float32), jnp.float8_e4m3fn,
                            axis=rhs_axis, block_size=block)
    sizes = GROUP_SIZES if numbers is not MODE_3 else np.array([1, 0, 2, 0], np.int32)
    general = kernelhub.get("ragged_dot_general", platform=spec.platform)
    # The interpreters run mode 1 with group_offset only: the same scale blocks through the same
    # kernel, and the reference's agreement with lax is XLA's run.
    if not (_is_interpret(spec) and numbers is MODE_1):
        out = general(lhs, rhs, jnp.asarray(sizes), numbers)
        assert out.dtype == jnp.float32
        _check_float(out, _reference(lhs, rhs, sizes, numbers), jnp.float32)
        if numbers is not MODE_3:
            expected = lax.ragged_dot_general(_dequantize(lhs), _dequantize(rhs),
                                              jnp.asarray(sizes), numbers)
            _check_float(out, as_float64(expected), jnp.float32)
    if numbers is MODE_1:
        local = kernelhub.QuantizedArray(rhs.values[1:3], rhs.scale[1:3], axis=1,
                                         block_size=block)
        out = kernelhub.get("ragged_dot", platform=spec.platform)(
            lhs, local, jnp.asarray(sizes), group_offset=1)
        assert out.dtype == jnp.float32
        _check_float(out, _reference(lhs, local, sizes, numbers, group_offset=1), jnp.float32)


def test_quantized_ragged_dot_is_straight_through_under_grad():
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(M, K)), jnp.float32)

    def loss(x):
        q = kernelhub.quantize(x, jnp.int8, axis=1)
        return jnp.sum(kernelhub.ragged_dot(q, jnp.ones((4, K, N), jnp.float32),
                                            jnp.asarray(GROUP_SIZES)))

    # As if quantization were the identity: each computed row gets the row sums of its
    # group's ones, n; rows past the groups get none. Jitted: eagerly, every jax.numpy
    # operation of the composite compiles on its own.
    expected = np.zeros((M, K))
    expected[:GROUP_SIZES.sum()] = N
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(x)), expected)


def test_qwix_arrays_in_ragged_dot():
    qwix = pytest.importorskip("qwix")
    rng = np.random.default_rng(11)
    x = jnp.asarray(rng.normal(size=(M, K)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(4, K, N)), jnp.float32)
    xq = qwix.quantize(x, jnp.int8, channelwise_axes=[0])
    wq = qwix.quantize(w, jnp.int8, channelwise_axes=[0, 2])
    out = kernelhub.ragged_dot(xq, wq, jnp.asarray(GROUP_SIZES))

    def dequantized(q):
        return qwix.dequantize(q.replace(scale=q.scale.astype(jnp.float32)))

    expected = _reference(dequantized(xq), dequantized(wq), GROUP_SIZES, MODE_1)
    _check_float(out, expected, jnp.float32)
    # Quantized along n (channelwise in k): not the axis the product sums over.
    with pytest.raises(ValueError, match="rhs is quantized along axis 2"):
        kernelhub.ragged_dot(xq, kernelhub.quantize(w, jnp.int8, axis=2),
                             jnp.asarray(GROUP_SIZES))


@pytest.mark.parametrize("call, error, message", [
    (lambda x, w, s: kernelhub.ragged_dot(x.astype(jnp.int16), w, s), TypeError,
     "lhs must have dtype float32, bfloat16, float16, int8 .* got int16"),
    (lambda x, w, s: kernelhub.ragged_dot(x, w.astype(jnp.uint8), s), TypeError,
     "rhs must have dtype .* got uint8"),
    (lambda x, w, s: kernelhub.ragged_dot(x, w, s, preferred_element_type=jnp.int4), TypeError,
     "preferred_element_type int4 must not be narrower than the operands' int8"),
    (lambda x, w, s: kernelhub.ragged_dot(x, w, s, preferred_element_type=jnp.complex64),
     TypeError, "preferred_element_type must be an integer or float dtype"),
    (lambda x, w, s: kernelhub.grouped_matmul(x.astype(jnp.bfloat16), w, s,
                                              preferred_element_type=jnp.int32),
     TypeError, "preferred_element_type int32 needs two integer operands"),
    (lambda x, w, s: kernelhub.ragged_dot(kernelhub.quantize(x.astype(jnp.float32), jnp.int8,
                                                             axis=0), w, s),
     ValueError, r"lhs is quantized along axis 0, .* axis 1 here .*quantize it with axis=1"),
    (lambda x, w, s: kernelhub.ragged_dot_general(
        kernelhub.quantize(x.astype(jnp.float32), jnp.int8, axis=1), x, s, MODE_2),
     ValueError, r"lhs is quantized along axis 1, .* axis 0 here \(the last of its ragged "
                 r"contracting dim"),
    (lambda x, w, s: kernelhub.ragged_dot_general(
        kernelhub.quantize(jnp.ones((M, 4, 12)), jnp.int8, axis=2, block_size=8),
        jnp.ones((4, 4, 12, N)), s, DN((([1, 2], [1, 2]), ([], [])), [0], [0])),
     ValueError, "lhs's scale blocks of 8 must divide its axis 2 \\(12\\)"),
])
def test_what_is_refused_is_named(call, error, message):
    x = jnp.ones((M, K), jnp.int8)
    w = jnp.ones((4, K, N), jnp.int8)
    with pytest.raises(error, match=message):
        call(x, w, jnp.asarray(GROUP_SIZES))


def test_contract_dtype_sets():
    assert set(_checks.RAW_DTYPES) == {jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn),
                                       jnp.dtype(jnp.float8_e5m2)}
    # int4 operands are widened to int8, exactly.
    widened = _checks.operand_array("lhs", jnp.array([-8, 7], jnp.int4))
    assert widened.dtype == jnp.int8 and widened.tolist() == [-8, 7]
