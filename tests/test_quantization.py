"""Quantized operands: kernelhub.quantize and the grouped matmuls on QuantizedArrays.

The reference dequantizes in numpy float64 from the stored values and scales (its own
repetition of scales over blocks, not kernelhub's) and runs the float64 reference products.

The products of implementation, dtype, block size and quantized operand are sliced so that
every pair of values meets (tests/slices.py; KERNELHUB_TEST_WHOLE_PRODUCTS=1 runs them whole).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import reference
from conftest import assert_close, dequantized, quantized_implementations, quantized_operand
from kernelhub import QuantizedArray, quantize
from kernelhub._grouped_matmul import names
from kernelhub.ops import _checks
from slices import all_pairs
from strategies import normal

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"
QUANTIZED = [jnp.int8, jnp.float8_e4m3fn, jnp.float8_e5m2]
LARGEST = {jnp.dtype(jnp.int8): 127.0, jnp.dtype(jnp.float8_e4m3fn): 448.0,
           jnp.dtype(jnp.float8_e5m2): 57344.0}


_TURNS = itertools.count()


def turning(op: str, values: list) -> list:
    """(spec, value) cases: the XLA loops with every value, the interpret-mode kernels taking
    the values in turn, so that each kernel still meets one of them and every value an
    interpreter (CI's 2 cores cannot afford every pair on the interpreters). Each test starts
    the turn one further, so that an interpreter meets each value across the file."""
    cases, turn = [], next(_TURNS)
    for param in quantized_implementations(op):
        spec = param.values[0]
        chosen = [values[turn % len(values)]] if spec.interpret_only else values
        turn += spec.interpret_only
        cases += [pytest.param(spec, value, id=f"{param.id}-{value}") for value in chosen]
    return cases


def skip_unless_supported(spec, lhs, rhs) -> None:
    """Several scale blocks along the contraction are a feature of their own."""
    needed = _checks.features({"lhs": lhs, "rhs": rhs})
    if not needed <= spec.features:
        pytest.skip(f"{spec.platform.value}/{spec.backend.value} lacks {sorted(needed - spec.features)}")


# quantize


@pytest.mark.parametrize("dtype", QUANTIZED)
@pytest.mark.parametrize("axis, block_size", [(1, None), (1, 16), (0, 8), (-1, 7)])
def test_quantize_scales_each_block_by_its_absolute_maximum(dtype, axis, block_size):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((20, 40)).astype(np.float32) * np.linspace(0.1, 10, 40, dtype=np.float32)
    q = quantize(jnp.asarray(x), dtype, axis=axis, block_size=block_size)
    axis = axis % 2
    size = x.shape[axis]
    block = size if block_size is None else block_size
    blocks = math.ceil(size / block)
    assert q.values.dtype == jnp.dtype(dtype) and q.scale.dtype == jnp.float32
    assert q.scale.shape[axis] == blocks and q.scale.shape[1 - axis] == x.shape[1 - axis]
    largest = LARGEST[jnp.dtype(dtype)]
    for b in range(blocks):
        part = np.take(x, np.arange(b * block, min((b + 1) * block, size)), axis=axis)
        amax = np.max(np.abs(part), axis=axis)
        np.testing.assert_allclose(np.take(np.asarray(q.scale), b, axis=axis), amax / largest,
                                   rtol=1e-6)
    error = np.abs(dequantized(q) - x)
    scale = np.abs(dequantized(QuantizedArray(jnp.ones_like(q.values), q.scale, axis=q.axis,
                                              block_size=q.block_size)))
    if dtype == jnp.int8:
        assert np.all(error <= scale * 0.5 + 1e-6 * np.abs(x))  # rounding to the nearest step
    else:
        # Rounding to nearest: half a unit in the last place, or half the subnormal step.
        mantissa, subnormal = (3, 2.0 ** -9) if dtype == jnp.float8_e4m3fn else (2, 2.0 ** -16)
        bound = np.abs(x) * 2.0 ** -(mantissa + 1) + scale * subnormal / 2
        assert np.all(error <= bound * 1.0001 + 1e-7)
    np.testing.assert_allclose(np.asarray(q.dequantize()), dequantized(q), rtol=1e-6)


def test_quantize_a_block_of_zeros_gives_scale_one_and_zeros():
    x = jnp.zeros((4, 10)).at[0, :].set(3.0)
    q = quantize(x, jnp.int8, axis=1, block_size=4)
    assert np.all(np.isfinite(np.asarray(q.scale)))
    np.testing.assert_array_equal(np.asarray(q.scale)[1:], 1.0)
    np.testing.assert_array_equal(np.asarray(q.dequantize()), np.asarray(x))


def test_quantize_puts_nan_in_its_block_only():
    x = jnp.ones((2, 8)).at[0, 1].set(jnp.nan)
    q = quantize(x, jnp.float8_e4m3fn, axis=1, block_size=4)
    dq = np.asarray(q.dequantize())
    assert np.isnan(dq[0, :4]).any() and np.isfinite(dq[0, 4:]).all() and np.isfinite(dq[1]).all()


def test_quantized_array_is_a_pytree_for_jit_and_vmap():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((3, 6, 10)), jnp.float32)
    q = quantize(x, jnp.int8, axis=2, block_size=4)
    assert q.source is None  # made eagerly: no float copy kept
    leaves, treedef = jax.tree.flatten(q)
    assert len(leaves) == 2 and jax.tree.unflatten(treedef, leaves).axis == 2
    doubled = jax.jit(lambda q: QuantizedArray(q.values, q.scale * 2, axis=q.axis,
                                               block_size=q.block_size))(q)
    np.testing.assert_array_equal(np.asarray(doubled.dequantize()), 2 * np.asarray(q.dequantize()))
    per_slice = jax.vmap(lambda x: quantize(x, jnp.int8, axis=1, block_size=4).dequantize())(x)
    np.testing.assert_array_equal(np.asarray(per_slice), np.asarray(q.dequantize()))


def test_quantize_is_straight_through_under_grad():
    x = jnp.linspace(-2.0, 3.0, 24).reshape(4, 6)
    weights = jnp.arange(24.0).reshape(4, 6)
    grad = jax.grad(lambda x: jnp.sum(quantize(x, jnp.int8, axis=1).dequantize() * weights))(x)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(weights))


@pytest.mark.parametrize("call, error, message", [
    (lambda: quantize(jnp.ones((2, 3)), jnp.float16, axis=1), TypeError, "dtype must be int8"),
    (lambda: quantize(jnp.ones((2, 3)), "mxfp6", axis=1), TypeError, "dtype must be"),
    (lambda: quantize(jnp.ones((2, 3), jnp.int32), jnp.int8, axis=1), TypeError, "x must have"),
    (lambda: quantize(jnp.ones((2, 3)), jnp.int8, axis=2), ValueError, "axis=2 is out of range"),
    (lambda: quantize(jnp.ones((2, 3)), jnp.int8, axis=1, block_size=0), ValueError, "block_size"),
    (lambda: quantize(jnp.ones((2, 3)), jnp.int8, axis=1, block_size=2.5), TypeError, "block_size"),
    (lambda: QuantizedArray(jnp.ones((2, 3), jnp.int8), jnp.ones((2, 2)), axis=1), ValueError,
     "scale must have shape (2, 1)"),
    (lambda: QuantizedArray(jnp.ones((2, 3), jnp.int8), jnp.ones((2, 1), jnp.bfloat16), axis=1),
     TypeError, "scale must have dtype float32"),
    (lambda: QuantizedArray(jnp.ones((2, 3)), jnp.ones((2, 1)), axis=1), TypeError,
     "values must have dtype"),
])
def test_bad_quantization_input_names_the_argument(call, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


# the ops


def gmm_arrays(rng, m, k, n, groups, transpose_rhs=False):
    lhs = normal(rng, (m, k), jnp.float32)
    rhs = normal(rng, (groups, n, k) if transpose_rhs else (groups, k, n), jnp.float32)
    return jnp.asarray(lhs), jnp.asarray(rhs)


@pytest.mark.parametrize("spec, dtype, block_size, quantized", all_pairs(
    quantized_implementations(GMM), QUANTIZED, [None, 16], ["both", "rhs", "lhs"]))
def test_gmm_of_quantized_operands_is_the_product_of_their_dequantized_values(
        spec, dtype, block_size, quantized):
    rng = np.random.default_rng(3)
    m, k, n = 70, 40, 24  # k = 2 blocks of 16 and a partial one of 8
    sizes = np.array([9, 0, 30, 20], np.int32)  # sums to 59 < m: 11 rows in no group
    lhs, rhs = gmm_arrays(rng, m, k, n, 4)
    if quantized != "rhs":
        lhs = quantized_operand(lhs, dtype, axis=1, block_size=block_size)
    if quantized != "lhs":
        rhs = quantized_operand(rhs, dtype, axis=1, block_size=block_size)
    else:
        rhs = rhs.astype(jnp.bfloat16)  # weight-only serving's mirror: bf16 weights
    skip_unless_supported(spec, lhs, rhs)
    out = kernelhub.get(GMM, platform=spec.platform)(lhs, rhs, jnp.asarray(sizes))
    want = reference.gmm(dequantized(lhs) if quantized != "rhs" else lhs,
                         dequantized(rhs) if quantized != "lhs" else rhs, sizes)
    assert out.dtype == jnp.float32
    assert_close(out, want, jnp.float32, contraction=k)
    np.testing.assert_array_equal(np.asarray(out)[59:], 0.0)


@pytest.mark.parametrize("spec, block_size", turning(GMM, [None, 32]))
def test_gmm_quantized_with_offset_existing_out_and_transposed_rhs(spec, block_size):
    rng = np.random.default_rng(4)
    m, k, n = 50, 36, 20
    sizes = np.array([5, 17, 0, 21], np.int32)
    lhs, rhs = gmm_arrays(rng, m, k, n, 2, transpose_rhs=True)
    q_lhs = quantized_operand(lhs.astype(jnp.bfloat16), jnp.float8_e4m3fn, axis=1,
                              block_size=block_size)
    q_rhs = quantized_operand(rhs, jnp.int8, axis=2, block_size=block_size)
    existing = jnp.asarray(normal(rng, (m, n), jnp.bfloat16))
    skip_unless_supported(spec, q_lhs, q_rhs)
    out = kernelhub.get(GMM, platform=spec.platform)(
        q_lhs, q_rhs, jnp.asarray(sizes), preferred_element_type=jnp.bfloat16, group_offset=1,
        existing_out=existing, transpose_rhs=True)
    want = reference.gmm(dequantized(q_lhs), dequantized(q_rhs), sizes, group_offset=1,
                         existing_out=existing, transpose_rhs=True)
    assert out.dtype == jnp.bfloat16
    assert_close(out, want, jnp.bfloat16, contraction=k)
    # Rows of groups 0 and 3 and past the sum are existing_out's, bit for bit.
    kept = np.r_[0:5, 22:50]
    np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])


# Contraction tiles inside scale blocks, and a tile fitting neither, cut to fit: to one holding
# whole blocks in the TPU kernels (384 to 256), to one block in the Triton ones (512 to 128).
# lhs blocks of 256 and rhs blocks of 128 over a contraction of 416 (both last blocks partial).
# Each kernel's tiling form.
_SCALE_BLOCK_TILINGS = {
    "gmm": {"pallas": [(64, 128, 128), (64, 384, 128)],
            "triton": [(32, 64, 32), (32, 512, 32)]},
    "tgmm": {"pallas": [(128, 32, 128), (384, 32, 128)],
             "triton": [(64, 16, 16), (512, 16, 16)]},
}


def _tiled_implementations(op: str) -> list:
    """The kernels, which tile. The XLA loops widen each operand in scale blocks on its own, a
    part at a time, whatever the other operand's blocks or a tiling: their blocks along k (a
    partial last one, group_offset) and along an output axis are this file's other tests' and
    tests/test_formats.py's."""
    return [param for param in quantized_implementations(op) if param.values[0].platform != "xla"]


# The tiling forms are the kernels' k steps; the rhs layout changes only where a step's rhs tile
# and scales are read. So each interpreter takes the two forms over both layouts between them:
# the inside one with [G, k, n] weights, the cut one with [G, n, k].
@pytest.mark.parametrize("spec", _tiled_implementations(GMM))
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_scale_blocks_across_contraction_tiles(spec, transpose_rhs):
    rng = np.random.default_rng(14)
    m, k, n = 150, 416, 48
    sizes = np.array([30, 50, 0, 45], np.int32)  # local groups 1..3: rows 30..125
    lhs, rhs = gmm_arrays(rng, m, k, n, 3, transpose_rhs=transpose_rhs)
    q_lhs = quantized_operand(lhs, jnp.float8_e4m3fn, axis=1, block_size=256)
    q_rhs = quantized_operand(rhs, jnp.float8_e4m3fn, axis=2 if transpose_rhs else 1,
                              block_size=128)
    want = reference.gmm(dequantized(q_lhs), dequantized(q_rhs), sizes, group_offset=1,
                         transpose_rhs=transpose_rhs)
    tiling = _SCALE_BLOCK_TILINGS["gmm"].get(spec.platform.value, [None, None])[transpose_rhs]
    out = kernelhub.get(GMM, platform=spec.platform)(
        q_lhs, q_rhs, jnp.asarray(sizes), group_offset=1, transpose_rhs=transpose_rhs,
        tiling=tiling)
    assert_close(out, want, jnp.float32, contraction=k)
    np.testing.assert_array_equal(np.asarray(out)[np.r_[0:30, 125:m]], 0.0)


@pytest.mark.parametrize("spec", _tiled_implementations(TGMM))
def test_tgmm_scale_blocks_across_contraction_tiles(spec):
    rng = np.random.default_rng(15)
    k, m, n = 24, 416, 16
    sizes = np.array([100, 0, 250, 40], np.int32)  # groups end mid-block and mid-tile
    q_lhs = quantized_operand(jnp.asarray(normal(rng, (k, m), jnp.float32)), jnp.int8, axis=1,
                              block_size=256)
    q_rhs = quantized_operand(jnp.asarray(normal(rng, (m, n), jnp.float32)), jnp.int8, axis=0,
                              block_size=128)
    want = reference.tgmm(dequantized(q_lhs), dequantized(q_rhs), sizes)
    for tiling in _SCALE_BLOCK_TILINGS["tgmm"].get(spec.platform.value, [None]):
        out = kernelhub.get(TGMM, platform=spec.platform)(q_lhs, q_rhs, jnp.asarray(sizes),
                                                           tiling=tiling)
        assert_close(out, want, jnp.float32, contraction=m)
        np.testing.assert_array_equal(np.asarray(out)[1], 0.0)


@pytest.mark.parametrize("spec, block_size", turning(GMM, [None, 16]))
def test_gmm_quantized_nan_stays_in_its_rows(spec, block_size):
    """A NaN in one row of lhs makes that row's scale (of its block) NaN: it reaches that row's
    outputs only, where scales are applied around the kernel and inside it."""
    rng = np.random.default_rng(13)
    lhs, rhs = gmm_arrays(rng, 24, 32, 8, 2)
    lhs = lhs.at[3, 5].set(jnp.nan)
    out = np.asarray(kernelhub.get(GMM, platform=spec.platform)(
        quantized_operand(lhs, jnp.int8, axis=1, block_size=block_size),
        quantized_operand(rhs, jnp.float8_e4m3fn, axis=1, block_size=block_size),
        jnp.asarray([10, 8], jnp.int32)))
    assert np.isnan(out[3]).all()
    assert np.isfinite(np.delete(out, 3, axis=0)).all()
    np.testing.assert_array_equal(out[18:], 0.0)


@pytest.mark.parametrize("spec", quantized_implementations(GMM))
def test_gmm_int8_sums_are_exact_over_a_long_contraction(spec):
    """int8 x int8 with one scale per row and column: the sums of integer products are exact
    (int32), so the result is the exact product rounded once to float32, scales included."""
    rng = np.random.default_rng(11)
    m, k, n = 8, 4096, 8
    values_l = rng.integers(-127, 128, (m, k)).astype(np.int8)
    values_r = rng.integers(-127, 128, (1, k, n)).astype(np.int8)
    scale_l = np.full((m, 1), 0.5, np.float32)
    scale_r = np.full((1, 1, n), 0.25, np.float32)
    lhs = QuantizedArray(jnp.asarray(values_l), jnp.asarray(scale_l), axis=1)
    rhs = QuantizedArray(jnp.asarray(values_r), jnp.asarray(scale_r), axis=1)
    out = kernelhub.get(GMM, platform=spec.platform)(lhs, rhs, jnp.asarray([m], jnp.int32))
    exact = values_l.astype(np.int64) @ values_r[0].astype(np.int64) * 0.125
    np.testing.assert_array_equal(np.asarray(out, np.float64), exact.astype(np.float32))


@pytest.mark.parametrize("op, spec", [
    pytest.param(op, p.values[0], id=f"{op}-{p.id}")
    # Mosaic GPU's interpreter left out (14 s a pass for 131200 terms): its kernels take
    # the bound of the XLA loops (operand_types.kernel_dtype; tests/test_mosaic_gpu.py checks
    # its choice at quantization.MAX_EXACT_INT32_TERMS and one past it).
    for op in (GMM, TGMM) for p in quantized_implementations(op, slow_interpreters=False)])
def test_int8_sums_longer_than_int32_holds_stay_exact(op, spec):
    """131200 products of -128 * -128 sum to 2**21 * 1025, past int32 (which would wrap to a
    negative number) but exact in float32: no implementation sums that long a contraction in
    int32; runs of it are summed exactly and added in float32."""
    k = 131200
    lhs = QuantizedArray(jnp.full((8, k), -128, jnp.int8), jnp.ones((8, 1)), axis=1)
    if op == GMM:
        rhs = QuantizedArray(jnp.full((1, k, 8), -128, jnp.int8), jnp.ones((1, 1, 8)), axis=1)
        sizes = jnp.asarray([8], jnp.int32)
    else:
        rhs = QuantizedArray(jnp.full((k, 8), -128, jnp.int8), jnp.ones((1, 8)), axis=0)
        sizes = jnp.asarray([k], jnp.int32)
    out = kernelhub.get(op, platform=spec.platform)(lhs, rhs, sizes)
    np.testing.assert_array_equal(np.asarray(out, np.float64), float(2**21 * 1025))


# Every implementation takes fp8 of either kind alike (the Triton kernels multiply both as
# stored, the TPU ones and the XLA loops widen both to bf16 or float32): one kind on each. e5m2
# in blocks along m on the XLA loops: mxfp8_e5m2 in tests/test_formats.py.
_TGMM_FP8 = {"xla": jnp.float8_e4m3fn, "pallas": jnp.float8_e4m3fn, "triton": jnp.float8_e5m2}


def _tgmm_takes(spec, dtype) -> bool:
    return dtype == jnp.int8 or _TGMM_FP8.get(spec.platform.value, dtype) == dtype


@pytest.mark.parametrize("spec, dtype, block_size", [
    case for case in all_pairs(quantized_implementations(TGMM), QUANTIZED, [None, 16])
    if _tgmm_takes(*case.values[:2])])
def test_tgmm_of_quantized_operands(spec, dtype, block_size):
    rng = np.random.default_rng(5)
    k, m, n = 24, 300, 16  # many small groups (the batched head) and a large one past it
    sizes = np.array([6] * 10 + [0, 200, 3], np.int32)
    lhs = quantized_operand(jnp.asarray(normal(rng, (k, m), jnp.float32)), dtype, axis=1,
                            block_size=block_size)
    rhs = quantized_operand(jnp.asarray(normal(rng, (m, n), jnp.float32)), dtype, axis=0,
                            block_size=block_size)
    existing = jnp.asarray(normal(rng, (10, k, n), jnp.float32))
    skip_unless_supported(spec, lhs, rhs)
    out = kernelhub.get(TGMM, platform=spec.platform)(lhs, rhs, jnp.asarray(sizes),
                                                       group_offset=2, num_actual_groups=10,
                                                       existing_out=existing)
    want = reference.tgmm(dequantized(lhs), dequantized(rhs), sizes, group_offset=2,
                          num_actual_groups=10, existing_out=existing)
    assert_close(out, want, jnp.float32, contraction=m)
    np.testing.assert_array_equal(np.asarray(out)[8], np.asarray(existing)[8])  # group 10: empty


# The interpreters' gradients with scale blocks (along an output axis of both backward products,
# int8 or fp8 activations beside fp8 weights) are test_gmm_gradients_with_scale_blocks_along_
# output_axes's ([G, k, n] weights) and test_block_scaled_weights_are_never_dequantized_whole_in_
# the_backward's ([G, n, k]); here they take one scale per row and column.
@pytest.mark.parametrize("spec, transpose_rhs, block_size", [
    case for case in all_pairs(quantized_implementations(GMM), [False, True], [None, 16])
    if not (case.values[0].interpret_only and case.values[2] is not None)])
def test_gmm_gradients_pass_straight_through_quantize(spec, transpose_rhs, block_size):
    """jax.grad through quantize and gmm: the gradients of the product of the dequantized
    operands, reaching the float inputs unchanged."""
    rng = np.random.default_rng(6)
    m, k, n = 40, 40, 12
    sizes = np.array([12, 0, 20], np.int32)
    lhs, rhs = gmm_arrays(rng, m, k, n, 3, transpose_rhs)
    d_out = jnp.asarray(normal(rng, (m, n), jnp.float32))
    gmm = kernelhub.get(GMM, platform=spec.platform)
    rhs_axis = 2 if transpose_rhs else 1
    if block_size is not None and names.QUANTIZED_BLOCKS not in spec.features:
        pytest.skip("no scale blocks on this implementation")

    def loss(lhs, rhs):
        q_lhs = quantize(lhs, jnp.int8, axis=1, block_size=block_size)
        q_rhs = quantize(rhs, jnp.float8_e4m3fn, axis=rhs_axis, block_size=block_size)
        return jnp.sum(gmm(q_lhs, q_rhs, jnp.asarray(sizes), transpose_rhs=transpose_rhs) * d_out)

    d_lhs, d_rhs = jax.jit(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)
    q_lhs = dequantized(quantized_operand(lhs, jnp.int8, axis=1, block_size=block_size))
    q_rhs = dequantized(quantized_operand(rhs, jnp.float8_e4m3fn, axis=rhs_axis,
                                          block_size=block_size))
    want_lhs, want_rhs, _ = reference.gmm_vjp(q_lhs, q_rhs, sizes, d_out,
                                              transpose_rhs=transpose_rhs)
    assert_close(d_lhs, want_lhs, jnp.float32, contraction=n)
    assert_close(d_rhs, want_rhs, jnp.float32, contraction=m)


# Backward products meet the blocks along an output axis: tiles inside one block, holding
# several, and fitting neither (cut to fit), for the lhs gradient (gmm) and the rhs gradient
# (tgmm) of gmm, and both gradients (gmm) of tgmm. (Pallas' rows of 96 in gmm's rhs gradient
# are cut to 64, inside a block of 128: one call for the cut and the inside form; its lhs
# gradient's 128-lane tiles always hold several blocks of 64.)
_OUTPUT_BLOCK_TILINGS = {
    "gmm": {"pallas": [{"lhs_gradient": (64, 128, 128), "rhs_gradient": (128, 96, 128)},
                       {"lhs_gradient": (64, 128, 384), "rhs_gradient": (128, 256, 128)}],
            "triton": [{"lhs_gradient": (32, 16, 32), "rhs_gradient": (32, 64, 16)},
                       {"lhs_gradient": (32, 16, 128), "rhs_gradient": (32, 256, 16)}],
            # The heuristic's lhs gradient takes 32 columns (dividing k = 416), too few rows of
            # the fp8 weight tiles for Mosaic GPU to convert in shared memory
            # (block_rules.conversion_problem), so it widens the weights first there; 64
            # columns convert them.
            "mosaic": [{"lhs_gradient": (64, 16, 64, 4, 1, 1, 1)}]},
    "tgmm": {"pallas": [{"lhs_gradient": (32, 128, 128), "rhs_gradient": (64, 128, 128)},
                        {"lhs_gradient": (256, 128, 128), "rhs_gradient": (96, 128, 128)}],
             "triton": [{"lhs_gradient": (32, 16, 16), "rhs_gradient": (64, 16, 16)},
                        {"lhs_gradient": (256, 16, 16), "rhs_gradient": (128, 16, 16)}]},
}


def assert_weights_never_widened_whole(lowered, weights) -> None:
    """Interpret-mode kernels widen tiles; a whole-array convert is the fp8 weights dequantized."""
    shape = "x".join(map(str, weights.shape))
    assert f"tensor<{shape}xf8E4M3FN>) -> tensor<{shape}xf32>" not in lowered.as_text()


@pytest.mark.parametrize("spec", _tiled_implementations(GMM))
def test_gmm_gradients_with_scale_blocks_along_output_axes(spec):
    """Weights [G, k, n] (the [G, n, k] layout: test_block_scaled_weights_are_never_dequantized_
    whole_in_the_backward): the lhs gradient meets their blocks of 64 along its output columns,
    the rhs gradient the int8 activations' blocks of 128 along its output rows, and no equation
    outside the kernels widens the fp8 weights."""
    rng = np.random.default_rng(17)
    m, k, n = 150, 416, 48
    sizes = np.array([30, 50, 0, 45], np.int32)
    lhs, rhs = gmm_arrays(rng, m, k, n, 3)
    d_out = jnp.asarray(normal(rng, (m, n), jnp.float32))
    gmm = kernelhub.get(GMM, platform=spec.platform)

    def quantized(lhs, rhs):
        return (quantize(lhs, jnp.int8, axis=1, block_size=128),
                quantize(rhs, jnp.float8_e4m3fn, axis=1, block_size=64))

    q_lhs, q_rhs = (dequantized(q) for q in jax.jit(quantized)(lhs, rhs))
    want_lhs, want_rhs, _ = reference.gmm_vjp(q_lhs, q_rhs, sizes, d_out, group_offset=1)
    for tiling in _OUTPUT_BLOCK_TILINGS["gmm"].get(spec.platform.value, [None]):
        lowered = jax.jit(jax.grad(lambda a, b: jnp.sum(
            gmm(*quantized(a, b), jnp.asarray(sizes), group_offset=1, tiling=tiling) * d_out),
            argnums=(0, 1))).lower(lhs, rhs)
        assert_weights_never_widened_whole(lowered, rhs)  # the program run, read
        d_lhs, d_rhs = lowered.compile()(lhs, rhs)
        assert_close(d_lhs, want_lhs, jnp.float32, contraction=n)
        assert_close(d_rhs, want_rhs, jnp.float32, contraction=m)


@pytest.mark.parametrize("spec", _tiled_implementations(TGMM))
def test_tgmm_gradients_with_scale_blocks_along_output_axes(spec):
    rng = np.random.default_rng(18)
    k, m, n = 24, 416, 16
    sizes = np.array([100, 0, 250, 40], np.int32)
    lhs = jnp.asarray(normal(rng, (k, m), jnp.float32))
    rhs = jnp.asarray(normal(rng, (m, n), jnp.float32))
    d_out = jnp.asarray(normal(rng, (4, k, n), jnp.float32))
    tgmm = kernelhub.get(TGMM, platform=spec.platform)

    def quantized(lhs, rhs):
        return (quantize(lhs, jnp.int8, axis=1, block_size=128),
                quantize(rhs, jnp.int8, axis=0, block_size=64))

    q_lhs, q_rhs = (dequantized(q) for q in jax.jit(quantized)(lhs, rhs))
    want_lhs, want_rhs, _ = reference.tgmm_vjp(q_lhs, q_rhs, sizes, d_out)
    for tiling in _OUTPUT_BLOCK_TILINGS["tgmm"].get(spec.platform.value, [None]):
        d_lhs, d_rhs = jax.jit(jax.grad(lambda a, b: jnp.sum(
            tgmm(*quantized(a, b), jnp.asarray(sizes), tiling=tiling) * d_out),
            argnums=(0, 1)))(lhs, rhs)
        assert_close(d_lhs, want_lhs, jnp.float32, contraction=n * 4)
        assert_close(d_rhs, want_rhs, jnp.float32, contraction=k * 4)


@pytest.mark.parametrize("platform", ["triton", "pallas"])
def test_block_scaled_weights_are_never_dequantized_whole_in_the_backward(platform):
    """Weights [G, n, k] in 128-blocks along k: the lhs gradient multiplies the cotangent by
    them, their blocks now along an output axis, and the kernel dequantizes them tile by tile.
    No equation outside the kernels widens the fp8 weights. The rhs gradient (tgmm of the
    cotangent and the activations) meets the activations' blocks along its output columns.
    ([G, k, n] weights: test_gmm_gradients_with_scale_blocks_along_output_axes.)"""
    rng = np.random.default_rng(16)
    m, k, n = 64, 256, 32
    lhs, rhs = gmm_arrays(rng, m, k, n, 2, transpose_rhs=True)
    sizes = jnp.asarray([30, 34], jnp.int32)
    gmm = kernelhub.get(GMM, platform=platform)

    def loss(lhs, rhs):
        q_rhs = quantize(rhs, jnp.float8_e4m3fn, axis=2, block_size=128)
        q_lhs = quantize(lhs, jnp.float8_e4m3fn, axis=1, block_size=128)
        return jnp.sum(gmm(q_lhs, q_rhs, sizes, transpose_rhs=True) ** 2)

    lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(lhs, rhs)
    assert_weights_never_widened_whole(lowered, rhs)  # the program run, read
    assert "QuantizedArray" in str(jax.make_jaxpr(loss)(lhs, rhs))  # a jaxpr holding one prints
    d_lhs, d_rhs = lowered.compile()(lhs, rhs)
    q_lhs = dequantized(quantized_operand(lhs, jnp.float8_e4m3fn, axis=1, block_size=128))
    q_rhs = dequantized(quantized_operand(rhs, jnp.float8_e4m3fn, axis=2, block_size=128))
    out = reference.gmm(q_lhs, q_rhs, np.asarray(sizes), transpose_rhs=True)
    want_lhs, want_rhs, _ = reference.gmm_vjp(q_lhs, q_rhs, np.asarray(sizes), 2 * out,
                                              transpose_rhs=True)
    assert_close(d_lhs, want_lhs, jnp.float32, contraction=n)
    assert_close(d_rhs, want_rhs, jnp.float32, contraction=m)


# Both gradient products (gmm) meet the quantized operands along their output rows, which the
# XLA loops widen a part at a time with one scale or in blocks alike (one scale along an output
# axis there: test_gmm_gradients_pass_straight_through_quantize): blocks on the XLA loops.
@pytest.mark.parametrize("spec, block_size", [
    case for case in turning(TGMM, [None, 32])
    if case.values[0].platform != "xla" or case.values[1] is not None])
def test_tgmm_gradients_pass_straight_through_quantize(spec, block_size):
    rng = np.random.default_rng(7)
    k, m, n = 8, 60, 10
    sizes = np.array([25, 0, 30], np.int32)
    lhs = jnp.asarray(normal(rng, (k, m), jnp.float32))
    rhs = jnp.asarray(normal(rng, (m, n), jnp.float32))
    d_out = jnp.asarray(normal(rng, (3, k, n), jnp.float32))
    tgmm = kernelhub.get(TGMM, platform=spec.platform)
    if block_size is not None and names.QUANTIZED_BLOCKS not in spec.features:
        pytest.skip("no scale blocks on this implementation")

    def loss(lhs, rhs):
        q_lhs = quantize(lhs, jnp.float8_e5m2, axis=1, block_size=block_size)
        q_rhs = quantize(rhs, jnp.int8, axis=0, block_size=block_size)
        return jnp.sum(tgmm(q_lhs, q_rhs, jnp.asarray(sizes)) * d_out)

    d_lhs, d_rhs = jax.jit(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)
    q_lhs = dequantized(quantized_operand(lhs, jnp.float8_e5m2, axis=1, block_size=block_size))
    q_rhs = dequantized(quantized_operand(rhs, jnp.int8, axis=0, block_size=block_size))
    want_lhs, want_rhs, _ = reference.tgmm_vjp(q_lhs, q_rhs, sizes, d_out)
    assert_close(d_lhs, want_lhs, jnp.float32, contraction=n * 3)
    assert_close(d_rhs, want_rhs, jnp.float32, contraction=k * 3)


def test_pre_quantized_weights_take_no_gradient_and_activations_do():
    """Serving-style weights quantized once, eagerly: the gradient goes to the float lhs only."""
    rng = np.random.default_rng(8)
    lhs, rhs = gmm_arrays(rng, 16, 8, 4, 2)
    q_rhs = quantize(rhs, jnp.int8, axis=1)
    sizes = jnp.asarray([10, 6], jnp.int32)
    d_lhs = jax.grad(lambda x: jnp.sum(kernelhub.grouped_matmul(x, q_rhs, sizes)))(lhs)
    want, _, _ = reference.gmm_vjp(lhs, dequantized(q_rhs), np.asarray(sizes), np.ones((16, 4)))
    assert_close(d_lhs, want, jnp.float32, contraction=4)


@pytest.mark.parametrize("call, error, message", [
    (lambda l, r, s: kernelhub.grouped_matmul(quantize(l, jnp.int8, axis=0), r, s), ValueError,
     r"lhs is quantized along axis 0 \(m\) but must be quantized along its contraction axis 1"),
    (lambda l, r, s: kernelhub.grouped_matmul(l, quantize(r, jnp.int8, axis=2), s), ValueError,
     r"rhs is quantized along axis 2 \(n\)"),
    (lambda l, r, s: kernelhub.transposed_grouped_matmul(quantize(l.T, jnp.int8, axis=0), l, s),
     ValueError, r"lhs is quantized along axis 0 \(k\)"),
    (lambda l, r, s: kernelhub.grouped_matmul(quantize(l[None], jnp.int8, axis=2), r, s),
     ValueError, "lhs must have rank 2"),
])
def test_quantized_operand_on_a_wrong_axis_names_the_argument(call, error, message):
    rng = np.random.default_rng(9)
    lhs, rhs = gmm_arrays(rng, 16, 8, 4, 2)
    with pytest.raises(error, match=message):
        call(lhs, rhs, jnp.asarray([10, 6], jnp.int32))


@pytest.mark.parametrize("platform", ["pallas", "triton"])
def test_forcing_a_kernel_on_scale_blocks_it_cannot_step_through_is_an_error(platform):
    """Blocks of 4 elements (not a multiple of 16): only the XLA loops take them, and a forced
    kernel says so rather than falling back."""
    rng = np.random.default_rng(10)
    lhs, rhs = gmm_arrays(rng, 16, 8, 4, 2)
    gmm = kernelhub.get(GMM, platform=platform)
    q_lhs = quantize(lhs, jnp.int8, axis=1, block_size=4)
    with pytest.raises(kernelhub.NoImplementationError,
                       match="does not support quantized_odd_blocks"):
        gmm(q_lhs, rhs, jnp.asarray([10, 6], jnp.int32))
    # Unforced, the call goes to an implementation that has the feature.
    assert "quantized_odd_blocks" in kernelhub.resolve(
        GMM, features=["quantized", "quantized_odd_blocks"]).features
    sizes = np.array([10, 6], np.int32)
    assert_close(kernelhub.grouped_matmul(q_lhs, rhs, jnp.asarray(sizes)),
                 reference.gmm(dequantized(q_lhs), np.asarray(rhs), sizes), jnp.float32,
                 contraction=8)


@pytest.mark.parametrize("block_size, expected", [
    (16, True), (32, True), (128, True), (384, True), (1024, True),
    (4, False), (12, False), (48, False), (100, False), (200, False)])
def test_which_scale_block_sizes_the_kernels_step_through(block_size, expected):
    from kernelhub._grouped_matmul.contraction_scales import fits_kernels
    assert fits_kernels(block_size) is expected


@pytest.mark.parametrize("block_size, kernels", [
    (16, {"cpu": {}, "tpu": {"mosaic": 3}, "cuda": {"triton": 3}}),
    (12, {"cpu": {}, "tpu": {}, "cuda": {}})])
def test_exported_quantized_gmm_holds_each_platforms_kernel_and_runs(block_size, kernels):
    """lhs with one scale per row beside rhs in scale blocks along k (the two kinds the kernels
    apply, in one call): the TPU branch holds the Mosaic kernels and the CUDA branch the Triton
    kernels (forward and VJP). Blocks of 12 elements, which no kernel steps through: the XLA
    loops on every platform. The artifact round-trips and runs here."""
    import kernelhub.export

    rng = np.random.default_rng(12)
    lhs, rhs = gmm_arrays(rng, 40, 32, 16, 2)
    sizes = np.array([15, 20], np.int32)

    def forward_and_grad(lhs, rhs, sizes):
        def loss(lhs, rhs):
            q_lhs = quantize(lhs, jnp.float8_e4m3fn, axis=1)
            q_rhs = quantize(rhs, jnp.int8, axis=1, block_size=block_size)
            return jnp.sum(kernelhub.grouped_matmul(q_lhs, q_rhs, sizes))
        return jax.value_and_grad(loss, argnums=(0, 1))(lhs, rhs)

    exported = kernelhub.export.export(forward_and_grad, lhs, rhs, jnp.asarray(sizes))
    assert kernelhub.export.kernels_by_platform(exported) == kernels
    value, (d_lhs, d_rhs) = jax.export.deserialize(exported.serialize()).call(
        lhs, rhs, jnp.asarray(sizes))
    q_lhs = dequantized(quantized_operand(lhs, jnp.float8_e4m3fn, axis=1))
    q_rhs = dequantized(quantized_operand(rhs, jnp.int8, axis=1, block_size=block_size))
    assert_close(value, reference.gmm(q_lhs, q_rhs, sizes).sum(), jnp.float32, contraction=40 * 32)
    want_lhs, want_rhs, _ = reference.gmm_vjp(q_lhs, q_rhs, sizes, np.ones((40, 16)))
    assert_close(d_lhs, want_lhs, jnp.float32, contraction=16)
    assert_close(d_rhs, want_rhs, jnp.float32, contraction=40)


def test_a_stack_of_quantized_weights_maps_over_its_layers():
    """Weights of L layers [L, G, k, n] quantized along k (axis 2), then jax.vmap or lax.scan
    over the layers: each layer's [G, k, n] is still quantized along k (its axis 1), as the
    QuantizedArray keeps its axis counted from the end; the results are each layer's own."""
    rng = np.random.default_rng(7)
    layers, groups, k, n, m = 3, 4, 32, 16, 40
    lhs = jnp.asarray(rng.normal(size=(m, k)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(layers, groups, k, n)), jnp.float32)
    sizes = jnp.array([10, 0, 25, 5], jnp.int32)
    stacked = kernelhub.quantize(weights, jnp.int8, axis=2)
    expected = []
    for layer in range(layers):
        dequantized = np.asarray(kernelhub.quantize(weights[layer], jnp.int8, axis=1).dequantize(),
                                 np.float64)
        expected.append(reference.gmm(np.asarray(lhs, np.float64), dequantized, np.asarray(sizes)))
    mapped = jax.vmap(lambda w: kernelhub.grouped_matmul(lhs, w, sizes))(stacked)
    _, scanned = jax.lax.scan(lambda carry, w: (carry, kernelhub.grouped_matmul(lhs, w, sizes)),
                              0, stacked)
    for out in (mapped, scanned):
        np.testing.assert_allclose(np.asarray(out), np.stack(expected), rtol=1e-5, atol=1e-4)
    # and quantized inside a vmap, the stacked result is quantized along the same logical axis
    inside = jax.vmap(lambda w: kernelhub.quantize(w, jnp.int8, axis=1))(weights)
    assert inside.axis == 2 and inside.shape == weights.shape


# (lhs axis, rhs axis) of gmm's one-block operands (None: a plain bf16 array), transpose_rhs.
_FOLDING_GMM = [((1, 1), False), ((0, None), False), ((None, 2), False), ((None, 1), True),
                ((0, 2), True), ((0, 1), False), ((0, 2), False), ((1, None), False)]
# tgmm's: lhs [k, m] along 1 (a scale per k) or 0 (per m), rhs [m, n] along 0 (per n) or 1.
_FOLDING_TGMM = [(1, 0), (0, None), (None, 1), (0, 1), (None, 0), (0, 0), (1, 1)]


def _spied_kernels():
    """Raw kernels that record what `folded` hands them (dtypes, result dtype, existing_out)."""
    from kernelhub._grouped_matmul.scale_folding import folded

    seen = []

    def gmm(lhs, rhs, sizes, out_dtype, tiling, offset, existing, transpose_rhs, **_):
        seen.append((lhs.dtype.name, rhs.dtype.name, jnp.dtype(out_dtype).name,
                     existing is not None))
        n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
        return jnp.zeros((lhs.shape[0], n), out_dtype)

    def tgmm(lhs, rhs, sizes, out_dtype, tiling, offset, actual_groups, existing, **_):
        seen.append((lhs.dtype.name, rhs.dtype.name, jnp.dtype(out_dtype).name,
                     existing is not None))
        return jnp.zeros((actual_groups, lhs.shape[0], rhs.shape[1]), out_dtype)

    return folded(gmm, tgmm), seen


def _operand(shape, axis):
    values = jnp.ones(shape, jnp.bfloat16)
    return values if axis is None else quantize(values.astype(jnp.float32), jnp.int8, axis=axis)


@pytest.mark.parametrize("axes, transpose_rhs", _FOLDING_GMM)
def test_folded_problem_names_the_types_the_folded_gmm_kernel_gets(axes, transpose_rhs):
    """A tiling is judged by the problem the kernel multiplies (passes.KernelCall.
    kernel_problem): scale_folding.folded_problem says it from the call's operands, checked
    here against what the folding hands a kernel."""
    from kernelhub._grouped_matmul.problem import gmm_problem
    from kernelhub._grouped_matmul.scale_folding import folded_problem

    (kernels, seen), sizes = _spied_kernels(), jnp.asarray([3, 5], jnp.int32)
    lhs = _operand((8, 16), axes[0])
    rhs = _operand((2, 4, 16) if transpose_rhs else (2, 16, 4), axes[1])
    existing = jnp.zeros((8, 4), jnp.bfloat16)
    jax.eval_shape(lambda: kernels.grouped_matmul(lhs, rhs, sizes, jnp.bfloat16, None,
                                                  jnp.int32(0), existing, transpose_rhs))
    problem = folded_problem(gmm_problem(lhs, rhs, sizes, jnp.bfloat16, True, transpose_rhs),
                             lhs, rhs)
    assert seen == [(problem.lhs_dtype, problem.rhs_dtype, problem.out_dtype,
                     problem.has_existing)]


@pytest.mark.parametrize("axes", _FOLDING_TGMM)
def test_folded_problem_names_the_types_the_folded_tgmm_kernel_gets(axes):
    from kernelhub._grouped_matmul.problem import tgmm_problem
    from kernelhub._grouped_matmul.scale_folding import folded_problem

    (kernels, seen), sizes = _spied_kernels(), jnp.asarray([3, 5], jnp.int32)
    lhs, rhs = _operand((16, 8), axes[0]), _operand((8, 4), axes[1])
    existing = jnp.zeros((2, 16, 4), jnp.bfloat16)
    jax.eval_shape(lambda: kernels.transposed_grouped_matmul(
        lhs, rhs, sizes, jnp.bfloat16, None, jnp.int32(0), 2, existing))
    problem = folded_problem(tgmm_problem(lhs, rhs, sizes, jnp.bfloat16, True, 2), lhs, rhs)
    assert seen == [(problem.lhs_dtype, problem.rhs_dtype, problem.out_dtype,
                     problem.has_existing)]
