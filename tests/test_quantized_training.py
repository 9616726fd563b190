"""kernelhub.quantized_training: each pass of a grouped matmul in its recipe's format.

The reference quantizes each pass's operands along that pass's contraction with
kernelhub.quantize (whose rounding tests/test_formats.py checks against the OCP rule), then
multiplies the dequantized values in float64: the forward along k, the lhs gradient along n,
the rhs gradient along m."""

from __future__ import annotations


import jax.numpy as jnp
import numpy as np
import pytest

import conftest
import reference
from conftest import assert_close, jitted_vjp, quantized_operand
from kernelhub import quantized_training as qt
from strategies import normal

M, K, N = 64, 64, 32
SIZES = np.array([20, 0, 37], np.int32)  # a group without rows, 7 rows past the groups


def dequantized(x, form, axis):
    """x quantized (in one compiled program) and dequantized in float64."""
    return conftest.dequantized(quantized_operand(x, form, axis=axis))


def operands(seed=0):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(normal(rng, (M, K), jnp.float32))
    rhs = jnp.asarray(normal(rng, (3, K, N), jnp.float32))
    d_out = jnp.asarray(normal(rng, (M, N), jnp.float32))
    return lhs, rhs, d_out


@pytest.mark.parametrize("platform", ["xla", "pallas", "triton"])
def test_every_pass_is_quantized_along_its_own_contraction(platform):
    """MXFP8 forward and backward, against float64 of each pass's own quantized operands, with
    group_offset: local groups 1 (empty) and 2; group 0's rows and those past the sizes' sum
    are no local group's."""
    lhs, rhs, d_out = operands()
    rhs = rhs[1:]
    sizes = jnp.asarray(SIZES)

    def f(x, w):
        return qt.grouped_matmul(x, w, sizes, recipe=qt.MXFP8, group_offset=jnp.int32(1),
                                 platform=platform)

    out, (d_lhs, d_rhs) = jitted_vjp(f, (lhs, rhs), d_out)
    want = reference.gmm(dequantized(lhs, "mxfp8", 1), dequantized(rhs, "mxfp8", 1), SIZES,
                         group_offset=1)
    assert_close(out, want, jnp.float32, contraction=K)
    # d x = Q(d out) along n @ Q(w) along n, transposed
    want_lhs = reference.gmm(dequantized(d_out, "mxfp8", 1),
                             np.swapaxes(dequantized(rhs, "mxfp8", 2), 1, 2), SIZES,
                             group_offset=1)
    assert_close(d_lhs, want_lhs, jnp.float32, contraction=N)
    # d w = Q(x^T) along m @ Q(d out) along m, per group
    want_rhs = reference.tgmm(dequantized(lhs.T, "mxfp8", 1), dequantized(d_out, "mxfp8", 0),
                              SIZES, group_offset=1, num_actual_groups=2)
    assert_close(d_rhs, want_rhs, jnp.float32, contraction=M)
    np.testing.assert_array_equal(np.asarray(d_rhs)[0], 0.0)  # the empty group
    # Rows no local group owns: 0 in the output and in d x.
    for rows in (slice(0, 20), slice(57, None)):
        np.testing.assert_array_equal(np.asarray(out)[rows], 0.0)
        np.testing.assert_array_equal(np.asarray(d_lhs)[rows], 0.0)


def test_an_unquantized_backward_is_the_float_gradient_of_the_quantized_forward():
    """MXFP8 forward, backward on the float operands (MXFP8_FORWARD), with a bias, a glu and
    group_offset: the backward takes the pre-activation the forward's format gave."""
    lhs, rhs, _ = operands(1)
    rng = np.random.default_rng(2)
    gate_up = jnp.asarray(normal(rng, (2, K, 2 * N), jnp.float32))
    bias = jnp.asarray(normal(rng, (2, 2 * N), jnp.float32))
    d_out = jnp.asarray(normal(rng, (M, N), jnp.float32))
    sizes, offset = jnp.asarray(SIZES), jnp.int32(1)

    def f(x, w, b):
        return qt.grouped_matmul(x, w, sizes, recipe=qt.MXFP8_FORWARD, group_offset=offset,
                                 bias=b, glu="silu")

    out, (d_lhs, d_w, d_bias) = jitted_vjp(f, (lhs, gate_up, bias), d_out)
    q_lhs, q_w = dequantized(lhs, "mxfp8", 1), dequantized(gate_up, "mxfp8", 1)
    want = reference.gmm(q_lhs, q_w, SIZES, group_offset=1, bias=bias, glu="silu")
    assert_close(out, want, jnp.float32, contraction=K)
    # z from the quantized operands; the products of the backward on the float ones.
    z = reference.gmm(q_lhs, q_w, SIZES, group_offset=1, bias=bias)
    d_z = reference.epilogue_vjp(z, np.asarray(d_out, np.float64), glu="silu")
    want_lhs = reference.gmm(d_z, np.swapaxes(np.asarray(gate_up, np.float64), 1, 2), SIZES,
                             group_offset=1)
    want_w = reference.tgmm(np.asarray(lhs, np.float64).T, d_z, SIZES, group_offset=1,
                            num_actual_groups=2)
    assert_close(d_lhs, want_lhs, jnp.float32, contraction=2 * N)
    assert_close(d_w, want_w, jnp.float32, contraction=M)
    assert_close(d_bias, [d_z[20:20 + 0].sum(0), d_z[20:57].sum(0)], jnp.float32, contraction=M)


def test_transposed_weights_and_per_channel_int8():
    """A value dtype as the format (one scale per row or column), weights [G, n, k]."""
    lhs, rhs, d_out = operands(3)
    rhs_t = jnp.swapaxes(rhs, 1, 2)
    sizes = jnp.asarray(SIZES)
    recipe = qt.Recipe(jnp.int8, jnp.int8)
    out, (d_lhs, d_rhs) = jitted_vjp(
        lambda x, w: qt.grouped_matmul(x, w, sizes, recipe=recipe, transpose_rhs=True),
        (lhs, rhs_t), d_out)
    want = reference.gmm(dequantized(lhs, jnp.int8, 1), dequantized(rhs_t, jnp.int8, 2), SIZES,
                         transpose_rhs=True)
    assert_close(out, want, jnp.float32, contraction=K)
    want_lhs = reference.gmm(dequantized(d_out, jnp.int8, 1), dequantized(rhs_t, jnp.int8, 1),
                             SIZES)
    want_rhs = reference.tgmm(dequantized(d_out.T, jnp.int8, 1), dequantized(lhs, jnp.int8, 0),
                              SIZES)
    assert_close(d_lhs, want_lhs, jnp.float32, contraction=N)
    assert_close(d_rhs, want_rhs, jnp.float32, contraction=M)


@pytest.mark.parametrize("call, error, message", [
    (lambda: qt.Recipe("mxfp9"), ValueError, "Recipe.forward must be a format name.*'mxfp9'"),
    (lambda: qt.Recipe("mxfp8", jnp.float16), ValueError, "Recipe.backward must be"),
    (lambda: qt.grouped_matmul(jnp.ones((4, 8)), jnp.ones((2, 8, 4)), jnp.array([2, 2]),
                               recipe="mxfp8"), TypeError, "recipe must be"),
    (lambda: qt.grouped_matmul(jnp.ones((4, 8), jnp.int8), jnp.ones((2, 8, 4)),
                               jnp.array([2, 2])), TypeError, "lhs must be a float array"),
])
def test_bad_recipes_name_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
