"""The 4-bit and microscaling formats (#27, first stage): int4 and float4_e2m1fn values, e8m0
(OCP MX) and NVFP4's two-level e4m3 scales, the named formats, and the grouped matmuls on each
of them on every implementation, against float64 references of the dequantized operands.

The quantization rules are checked against numpy written here from the formats' definitions
(OCP MX v1.0: shared exponent floor(log2(amax)) - emax of the element type; NVFP4: a float32
tensor scale amax / (448 * 6) over e4m3 block scales of 16 elements).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import reference
from conftest import (assert_close, dequantized, implementation_params, jitted_vjp,
                      quantized_operand)
from kernelhub import QuantizedArray, quantize
from kernelhub._pallas import four_bit_bits
from strategies import normal

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"
FORMATS = ["mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4", "int4", "int4-blocks"]
# The implementations that take 4-bit values, which each test's formats include (every one
# registered now; a backend without the feature would refuse such calls by it).
FOUR_BIT = frozenset({"quantized_4bit"})
E2M1_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
MANTISSA_BITS = {"float8_e4m3fn": 3, "float8_e5m2": 2, "float4_e2m1fn": 1}


def _stored(form: str) -> tuple:
    """quantize's (dtype, block_size) for a format's name here ("int4": one scale per column,
    "int4-blocks": blocks of 32; the others are quantize's named formats)."""
    return {"int4": (jnp.int4, None), "int4-blocks": (jnp.int4, 32)}.get(form, (form, None))


def quantized(x, form: str, axis: int) -> QuantizedArray:
    dtype, block_size = _stored(form)
    return quantize(x, dtype, axis=axis, block_size=block_size)


def operand(x, form: str, axis: int) -> QuantizedArray:
    """quantized(x, form, axis) as one compiled program (conftest.quantized_operand), for the
    ops' operands and references; the tests of the formats themselves quantize eagerly."""
    dtype, block_size = _stored(form)
    return quantized_operand(x, dtype, axis=axis, block_size=block_size)


def test_named_formats_have_their_parts_and_say_so():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 64)), jnp.float32)
    expect = {"mxfp8": ("float8_e4m3fn", 32, "float8_e8m0fnu", False),
              "mxfp8_e5m2": ("float8_e5m2", 32, "float8_e8m0fnu", False),
              "mxfp4": ("float4_e2m1fn", 32, "float8_e8m0fnu", False),
              "nvfp4": ("float4_e2m1fn", 16, "float8_e4m3fn", True)}
    for name, (values, block, scale, two_levels) in expect.items():
        q = quantize(x, name, axis=1)
        assert (q.values.dtype.name, q.block_size, q.scale.dtype.name) == (values, block, scale)
        assert (q.tensor_scale is not None) == two_levels
        assert q.format == name and repr(q).startswith(f"QuantizedArray({name}:")
    assert quantize(x, jnp.int4, axis=1).format == "int4"


@pytest.mark.parametrize("form", ["mxfp8", "mxfp8_e5m2", "mxfp4"])
def test_mx_scales_are_the_ocp_powers_of_two(form):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 96)).astype(np.float32) * np.logspace(-3, 3, 96, dtype=np.float32)
    x[2, 32:64] = 0.0  # a block of zeros
    q = quantize(jnp.asarray(x), form, axis=1)
    scale = np.asarray(jnp.asarray(q.scale, jnp.float32), np.float64)
    exponents = np.log2(scale)
    np.testing.assert_array_equal(exponents, np.round(exponents))  # exact powers of two
    amax = np.abs(x).reshape(6, 3, 32).max(axis=2)
    emax = jnp.finfo(q.values.dtype).maxexp - 1
    want = np.where(amax == 0, 1.0, 2.0 ** (np.floor(np.log2(np.where(amax == 0, 1, amax))) - emax))
    np.testing.assert_array_equal(scale, want)


def test_e2m1_values_cover_the_formats_eight_magnitudes():
    x = jnp.asarray(np.linspace(-6.2, 6.2, 401, dtype=np.float32))[None, :]
    q = quantize(x, jnp.float4_e2m1fn, axis=1)
    magnitudes = np.unique(np.abs(np.asarray(jnp.asarray(q.values, jnp.float32))))
    np.testing.assert_array_equal(magnitudes, E2M1_MAGNITUDES)


@pytest.mark.parametrize("form", FORMATS)
def test_quantize_then_dequantize_is_within_the_formats_rounding_bound(form):
    """Each element rounds to its nearest representable value (half a unit in the last place
    of its block's scaled grid), but for OCP MX's saturation at the element type's largest
    value, which its shared-exponent rule allows, and e4m3's rounding of NVFP4 block scales."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((8, 80)) * np.exp(rng.uniform(-3, 3, (8, 1)))).astype(np.float32)
    q = quantized(jnp.asarray(x), form, axis=1)
    got = np.asarray(q.dequantize(), np.float64)
    np.testing.assert_allclose(got, dequantized(q), rtol=1e-7)
    values_dtype = q.values.dtype
    # Each element's whole scale (block scale times tensor scale), from the stored parts.
    full_scale = dequantized(QuantizedArray._unchecked(
        jnp.ones(q.shape, jnp.float32), q.scale, q.axis, q.block_size, None, q.tensor_scale))
    largest = float(jnp.finfo(values_dtype).max) if jnp.issubdtype(values_dtype, jnp.floating) \
        else float(jnp.iinfo(values_dtype).max)
    if jnp.issubdtype(values_dtype, jnp.integer):
        bound = full_scale / 2  # round to the nearest integer multiple of the scale
    else:
        mantissa = MANTISSA_BITS[values_dtype.name]
        smallest = float(jnp.finfo(values_dtype).smallest_subnormal)
        bound = np.maximum(np.abs(x) * 2.0 ** -(mantissa + 1), full_scale * smallest / 2)
    # What saturation at the largest value cuts off (OCP MX lets |x| / scale pass it).
    bound = bound + np.maximum(np.abs(x) - largest * full_scale, 0.0)
    assert np.all(np.abs(got - x) <= bound * (1 + 1e-6) + 1e-30)
    # The error is a fraction of the data, not of the format's range.
    assert np.abs(got - x).max() <= 0.25 * np.abs(x).max()


def test_nvfp4_two_scale_levels_follow_the_reference_formula():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 48)) * np.array([[0.01], [1.0], [30.0], [0.0]])).astype(np.float32)
    q = quantize(jnp.asarray(x), "nvfp4", axis=1)
    tensor_scale = np.abs(x).max() / (448.0 * 6.0)
    np.testing.assert_allclose(float(q.tensor_scale), tensor_scale, rtol=1e-7)
    amax = np.abs(x).reshape(4, 3, 16).max(axis=2)
    block = np.where(amax == 0, 1.0, amax / 6.0 / np.float32(tensor_scale))
    want = np.asarray(jnp.asarray(jnp.asarray(block, jnp.float32).astype(jnp.float8_e4m3fn),
                                  jnp.float32))
    np.testing.assert_array_equal(np.asarray(jnp.asarray(q.scale, jnp.float32)), want)
    values = x / (np.repeat(want, 16, axis=1) * np.float32(tensor_scale))
    want_values = np.asarray(jnp.asarray(jnp.asarray(np.clip(values, -6, 6), jnp.float32)
                                         .astype(jnp.float4_e2m1fn), jnp.float32))
    np.testing.assert_array_equal(np.asarray(jnp.asarray(q.values, jnp.float32)), want_values)
    np.testing.assert_array_equal(np.asarray(q.dequantize())[3], 0.0)


@pytest.mark.parametrize("call, error, message", [
    (lambda x: quantize(x, jnp.float8_e4m3fn, axis=1, block_size=64,
                        scale_dtype=jnp.float8_e8m0fnu), ValueError, "block_size must be 16 or 32"),
    (lambda x: quantize(x, jnp.int8, axis=1, block_size=32, scale_dtype=jnp.float8_e8m0fnu),
     ValueError, "needs float values"),
    (lambda x: quantize(x, jnp.float8_e4m3fn, axis=1, block_size=16,
                        scale_dtype=jnp.float8_e4m3fn), ValueError, "NVFP4"),
    (lambda x: quantize(x, "mxfp4", axis=1, block_size=16), ValueError, "mxfp4 has blocks of 32"),
    (lambda x: quantize(x, "mxfp6", axis=1), TypeError, "a format: 'mxfp8'"),
    (lambda x: quantize(x, jnp.int4, axis=1, scale_dtype=jnp.bfloat16), TypeError,
     "scale_dtype must"),
])
def test_bad_format_arguments_name_the_argument_and_the_rule(call, error, message):
    with pytest.raises(error, match=message):
        call(jnp.ones((2, 64), jnp.float32))


def test_an_int4_operand_on_another_axis_than_the_contraction_names_the_axis():
    lhs = quantize(jnp.ones((8, 64), jnp.float32), jnp.int4, axis=0)
    with pytest.raises(ValueError, match="lhs is quantized along axis 0"):
        kernelhub.grouped_matmul(lhs, jnp.ones((2, 64, 4)), jnp.array([4, 4], jnp.int32))


def _gmm_case(spec):
    m, k, n = (40, 80, 16) if spec.interpret_only else (70, 80, 24)  # k: 2.5 blocks of 32
    return m, k, n


def _forms(spec):
    # The interpret kernels emulate every grid step: both 4-bit kinds there. MXFP8 operands meet
    # each kernel in every pass of tests/test_quantized_training.py.
    return ["nvfp4", "int4-blocks"] if spec.interpret_only else FORMATS


# Both operands in mxfp8 are tests/test_quantized_training.py's forward, on each implementation;
# in mxfp4 and in int4, the next test's (rhs [G, n, k]; the one-sided call here reads [G, k, n]).
_BOTH_ELSEWHERE = ("mxfp8", "mxfp4", "int4")


def _format_calls(spec, form: str, turn: int, lhs, rhs, ql, qr) -> list:
    one_side = (ql, rhs) if turn % 2 else (lhs, qr)
    if form in _BOTH_ELSEWHERE:
        return [one_side]
    if spec.platform != "xla" or ql.block_size is None:
        return [one_side, (ql, qr)]
    # The XLA loops widen an operand in scale blocks on its own, a part at a time, whatever the
    # other operand: the call with both reads the format on each side. (Values with one scale
    # along k multiply in a dtype their pair chooses: those keep the call beside a float.)
    return [(ql, qr)]


@pytest.mark.parametrize("spec", implementation_params(GMM, features=FOUR_BIT))
def test_gmm_on_every_format_as_lhs_rhs_and_both(spec):
    """Each format quantizes one operand beside a float one, rhs and lhs in turn, and both
    operands (_format_calls says where another call stands for one of these), so that over
    FORMATS each kind of values (8-bit float, 4-bit float, int4) is each side's once."""
    rng = np.random.default_rng(4)
    gmm = kernelhub.get(GMM, platform=spec.platform)
    m, k, n = _gmm_case(spec)
    sizes = np.array([9, 0, 14, 11], np.int32)  # 34 < m rows: the rest belong to no group
    lhs = jnp.asarray(normal(rng, (m, k), jnp.float32))
    rhs = jnp.asarray(normal(rng, (4, k, n), jnp.float32))
    for turn, form in enumerate(_forms(spec)):
        ql, qr = operand(lhs, form, 1), operand(rhs, form, 1)
        for a, b in _format_calls(spec, form, turn, lhs, rhs, ql, qr):
            out = gmm(a, b, jnp.asarray(sizes))
            want = reference.gmm(dequantized(a) if a is ql else a,
                                 dequantized(b) if b is qr else b, sizes)
            assert_close(out, want, jnp.float32, contraction=k)
            np.testing.assert_array_equal(np.asarray(out)[34:], 0.0)


@pytest.mark.parametrize("spec", implementation_params(GMM, features=FOUR_BIT))
def test_gmm_formats_with_offset_existing_out_transposed_rhs_and_gradients(spec):
    rng = np.random.default_rng(5)
    gmm = kernelhub.get(GMM, platform=spec.platform)
    m, k, n = _gmm_case(spec)
    sizes = np.array([9, 0, 14, 11, 3], np.int32)
    lhs = jnp.asarray(normal(rng, (m, k), jnp.float32))
    rhs_t = jnp.asarray(normal(rng, (3, n, k), jnp.float32))  # groups 1..3, [n, k] layout
    existing = jnp.asarray(normal(rng, (m, n), jnp.float32))
    d_out = jnp.asarray(normal(rng, (m, n), jnp.float32))
    for form in ("mxfp4", "int4") if not spec.interpret_only else ("mxfp4",):

        def f(x, w):
            return gmm(quantized(x, form, 1), quantized(w, form, 2), jnp.asarray(sizes),
                       group_offset=1, existing_out=existing, transpose_rhs=True)

        out, (d_lhs, d_rhs) = jitted_vjp(f, (lhs, rhs_t), d_out)
        ql, qr = dequantized(operand(lhs, form, 1)), dequantized(operand(rhs_t, form, 2))
        assert_close(out, reference.gmm(ql, qr, sizes, group_offset=1, existing_out=existing,
                                        transpose_rhs=True), jnp.float32, contraction=k)
        want_lhs, want_rhs, _ = reference.gmm_vjp(ql, qr, sizes, d_out, group_offset=1,
                                                  transpose_rhs=True, has_existing=True)
        # Straight-through: the gradients of the product of the dequantized operands.
        assert_close(d_lhs, want_lhs, jnp.float32, contraction=n)
        assert_close(d_rhs, want_rhs, jnp.float32, contraction=m)
        np.testing.assert_array_equal(np.asarray(d_rhs)[0], 0.0)  # group 1: empty


@pytest.mark.parametrize("spec", implementation_params(TGMM, features=FOUR_BIT))
def test_tgmm_on_formats_along_m(spec):
    rng = np.random.default_rng(6)
    k, m, n = (16, 96, 8) if spec.interpret_only else (24, 160, 16)
    sizes = np.array([40, 0, 33, 17], np.int32)  # a partial last block of 32 along m
    # MXFP8 along m: the weight gradient of tests/test_quantized_training.py, on each
    # implementation.
    for form in ("nvfp4",) if spec.interpret_only else [f for f in FORMATS if f != "mxfp8"]:
        lhs = operand(jnp.asarray(normal(rng, (k, m), jnp.float32)), form, 1)
        rhs = operand(jnp.asarray(normal(rng, (m, n), jnp.float32)), form, 0)
        out = kernelhub.get(TGMM, platform=spec.platform)(lhs, rhs, jnp.asarray(sizes))
        want = reference.tgmm(dequantized(lhs), dequantized(rhs), sizes)
        assert_close(out, want, jnp.float32, contraction=m)
        np.testing.assert_array_equal(np.asarray(out)[1], 0.0)


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.float4_e2m1fn])
def test_four_bit_bits_computed_on_the_cpu_are_the_bitcasts(dtype):
    """four_bit_bits computes on the CPU what a bitcast gives on an accelerator: code i is the
    value whose bits are i (both zeros, every sign), and a pair's byte holds the first value
    in its low half; e4m3_of_codes and float16_of_codes undo e2m1's codes exactly (the sign of
    zero included)."""
    codes = np.arange(16, dtype=np.uint8)
    values = jax.lax.bitcast_convert_type(jnp.asarray(codes).astype(jnp.uint4), dtype)
    pairs = jnp.stack([jnp.repeat(values, 16), jnp.tile(values, 16)], axis=-1)
    want = (np.repeat(codes, 16) | np.tile(codes, 16) << 4).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(jax.jit(four_bit_bits.as_bytes)(pairs)), want)
    if dtype == jnp.float4_e2m1fn:
        got = jax.jit(four_bit_bits.as_uint4)(values).astype(jnp.uint8)
        np.testing.assert_array_equal(np.asarray(got), codes)
        # And back, as the Triton kernels unpack: each code as the e4m3 value jax converts to.
        unpacked = jax.jit(four_bit_bits.e4m3_of_codes)(jnp.asarray(codes))
        np.testing.assert_array_equal(
            np.asarray(jax.lax.bitcast_convert_type(unpacked, jnp.uint8)),
            np.asarray(jax.lax.bitcast_convert_type(values.astype(jnp.float8_e4m3fn), jnp.uint8)))
        # As the Mosaic GPU kernels convert the uint4 codes: the float16 bits jax's conversion
        # gives.
        halves = jax.jit(four_bit_bits.float16_of_codes)(jnp.asarray(codes).astype(jnp.uint4))
        np.testing.assert_array_equal(
            np.asarray(jax.lax.bitcast_convert_type(halves, jnp.uint16)),
            np.asarray(jax.lax.bitcast_convert_type(values.astype(jnp.float16), jnp.uint16)))


@pytest.mark.parametrize("platform", ["triton", "pallas"])
@pytest.mark.parametrize("form", ["int4", "mxfp4"])
def test_four_bit_weights_reach_the_kernels_unwidened(platform, form):
    """Forward and both gradients with 4-bit weights, as lowered for the accelerator and
    interpreted (the kernel bodies included): no op converts the whole 4-bit weight to a wider
    type. The kernels take it packed and widen one tile at a time (Triton:
    kernelhub/_pallas/gpu/_four_bit.py; Pallas: kernelhub/_pallas/tpu/kernel_parts.py)."""
    rng = np.random.default_rng(13)
    lhs = jnp.asarray(rng.standard_normal((64, 128)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((4, 128, 64)), jnp.bfloat16)
    sizes = jnp.array([16, 16, 16, 16], jnp.int32)
    gmm = kernelhub.get(GMM, platform=platform)
    weights = operand(rhs, "int4-blocks" if form == "int4" else form, 1)

    def step(x, d_out):
        out, pullback = jax.vjp(lambda x: gmm(x, weights, sizes), x)
        return out, pullback(d_out)

    traced = jax.jit(step).trace(lhs, jnp.ones((64, 64), jnp.float32))
    accelerator = "cuda" if platform == "triton" else "tpu"
    whole = r"tensor<4x128x64x(?:i4|ui4|f4E2M1FN)>"

    def widened(text):
        assert re.search(whole, text)  # the weights do reach the program as 4-bit values
        return re.findall(r"stablehlo\.convert [^\n]*\(" + whole + r"\)[^\n]*", text)

    # As the accelerator gets it (the kernel a custom call): no conversion at all.
    assert not widened(traced.lower(lowering_platforms=(accelerator,)).as_text())
    # Interpreted on the CPU, the kernel bodies included: only e2m1's codes are computed
    # through e4m3, in one fusion with them (kernelhub/_pallas/four_bit_bits.py).
    interpreted = widened(traced.lower().as_text())
    assert not [c for c in interpreted if not c.endswith("tensor<4x128x64xf8E4M3FN>")], interpreted
