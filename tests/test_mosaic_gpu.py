"""The Mosaic GPU kernels (kernelhub/_pallas/mosaic_gpu/): the contract's edges in Mosaic GPU's
interpret mode against the float64 reference, gradients, fp8 with one scale per row and column,
fused epilogues, calls routed elsewhere by feature, tiles, registration, and lowering for CUDA
at MoE shapes on a host without a GPU.

The interpreter simulates every warpgroup, barrier and TMA copy (a fraction of a second to a
few seconds per call): the shared suites run (mosaic, cpu) but for the cases they leave out
with a reason (tests/conftest.py, SLOW_INTERPRETERS), and the cases here are few and small,
each chosen to cross several of the kernels' paths and edges at once. On a Hopper GPU
platform="mosaic" resolves to the compiled kernels and the same tests run them.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import re
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import kernelhub.export
import reference
from conftest import as_float64, assert_close, jitted_vjp, quantized_operand
from kernelhub import testing
from kernelhub._grouped_matmul import visits
from kernelhub._grouped_matmul.epilogue import Epilogue
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas.mosaic_gpu import (block_rules, config, group_spans, grouped_matmul,
                                          heuristic, interpreter_programs, operand_types,
                                          roofline, scale_fitting, shared_memory, tuning_space)
from kernelhub._pallas.mosaic_gpu.tgmm_chunks import ChunkLayout
from kernelhub import quantization
from kernelhub.quantization import quantize

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"
ON_GPU = jax.default_backend() == "gpu"
# Interpreted, a kernel call compiles for seconds (a warp-specialized one, its three warpgroups
# on each of two programs, for tens of CPU seconds); compiled on a GPU, milliseconds. Cases so
# marked vary what only the compiled kernels tell apart (another dtype of the same path, a
# layout the interpreter slices alike, the other order of the same table): a GPU run takes
# every case, and the cases left here still cross each path of the kernels once.
GPU_RUN_ONLY = pytest.mark.skipif(
    not ON_GPU, reason="interpret mode: a covering subset runs here, every case on a GPU")


def _mosaic(op):
    return kernelhub.get(op, platform="mosaic")


def _values(rng, shape, dtype):
    """Values already rounded to `dtype`, so the reference sees exactly what the kernel does.
    (Rounded by numpy, as XLA rounds them, without a compilation per shape.)"""
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dtype))


# ---------------------------------------------------------------- grouped_matmul


def test_gmm_unaligned_shapes_empty_groups_and_rows_past_the_sum():
    """m, k, n off every tile; an empty group, groups crossing tiles, and 7 rows past the sum
    of the sizes, which must be exactly 0 (never uninitialised memory)."""
    rng = np.random.default_rng(0)
    m, k, n = 77, 40, 24
    sizes = np.array([10, 0, 33, 27], np.int32)  # sum 70
    lhs, rhs = _values(rng, (m, k), jnp.bfloat16), _values(rng, (4, k, n), jnp.bfloat16)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes))
    assert out.dtype == jnp.float32
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, contraction=k)
    assert np.all(np.asarray(out)[70:] == 0)


# The moved-back tiles are the visit table's, the same for one program per SM or two: here
# two, whose spread of the work items over twice the programs no other gmm case crosses.
@pytest.mark.parametrize("tiling", [pytest.param((64, 64, 64), marks=GPU_RUN_ONLY),
                                    (64, 64, 64, 2, 1, 1, 0, 2)],
                         ids=["one program per SM", "two per SM"])
def test_gmm_row_tiles_moved_back_from_the_end(tiling):
    """The last group and the rows past the sum start within a tile of the end: their row
    tiles (which start at a group's first row) are moved back to end there, holding rows of the
    group before, which they must not write. With two programs per SM the work items are
    spread over twice the programs."""
    rng = np.random.default_rng(7)
    m, k, n = 128, 64, 64
    sizes = np.array([100, 20], np.int32)  # rows 120.. past the sum
    lhs, rhs = _values(rng, (m, k), jnp.bfloat16), _values(rng, (2, k, n), jnp.bfloat16)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), tiling=tiling)
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, contraction=k)
    assert np.all(np.asarray(out)[120:] == 0)


def test_band_width_spans_whole_rows_where_groups_fit_one_row_tile(monkeypatch):
    """At DeepSeek-V3's 64 rows a group (16 n-tiles) and GPT-OSS's, one row tile holds a
    group: no weight tile is read twice, and a band spans every n-tile. At Mixtral's 1024 rows
    a group, bands of BAND keep their weight tiles in L2 while the row tiles pass."""
    assert grouped_matmul.band_width(16, 16384, 256, 64) == 16
    assert grouped_matmul.band_width(45, 8192, 128, 64) == 45
    assert grouped_matmul.band_width(112, 8192, 8, 64) == grouped_matmul.BAND == 8
    assert grouped_matmul.band_width(6, 8192, 8, 64) == 6
    monkeypatch.setattr(grouped_matmul, "WHOLE_ROWS_FOR_ONE_TILE_GROUPS", False)
    assert grouped_matmul.band_width(16, 16384, 256, 64) == 8


def test_gmm_in_bands_wider_than_eight_n_tiles():
    """Ten n-tiles of small groups, in one band of all ten: every (visit, n-tile) pair once,
    rows past the sum 0."""
    rng = np.random.default_rng(5)
    m, k, n = 96, 64, 640
    sizes = np.array([30, 0, 18, 40], np.int32)
    assert grouped_matmul.band_width(n // 64, m, 4, 64) == 10
    lhs, rhs = _values(rng, (m, k), jnp.bfloat16), _values(rng, (4, k, n), jnp.bfloat16)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), tiling=(64, 64, 64))
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, contraction=k)
    assert np.all(np.asarray(out)[88:] == 0)


# The spread order is the visit table's, which both bodies read alike; here the one-warpgroup
# body (the profile's, at DeepSeek-V3's shard) takes it. The warp-specialized body's zero-writing
# visits run here in test_warp_specialized_gmm_with_offset_existing_out_and_a_gated_unit (rows
# past the sum), and with the spread order on a GPU.
@pytest.mark.parametrize("tiling", [(64, 64, 64), pytest.param((64, 64, 64, 2, 2),
                                                               marks=GPU_RUN_ONLY)],
                         ids=["one warpgroup", "warp-specialized"])
def test_gmm_with_fills_spread_among_the_computing_visits(monkeypatch, tiling):
    """With visits.SPREAD_FILLS (a profile probe's schedule) the visits that write the other
    experts' rows as zeros come between the computing ones: every row still right, in both
    bodies, a shard of 2 of 6 groups with rows before, after and past the sum."""
    rng = np.random.default_rng(13)
    m, k, n = 256, 64, 64
    sizes = np.array([40, 30, 20, 60, 50, 40], np.int32)  # 240 rows; local rows 70..150
    lhs, rhs = _values(rng, (m, k), jnp.bfloat16), _values(rng, (2, k, n), jnp.bfloat16)
    jax.clear_caches()
    monkeypatch.setattr(visits, "SPREAD_FILLS", True)
    try:
        out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), group_offset=jnp.int32(2),
                           tiling=tiling)
    finally:
        jax.clear_caches()
    expected = reference.gmm(lhs, rhs, sizes, group_offset=2)
    assert_close(out, expected, jnp.float32, contraction=k)
    assert np.all(np.asarray(out)[np.r_[0:70, 150:m]] == 0)


def test_gmm_group_offset_existing_out_and_transpose_rhs():
    """Local groups 1..2 of 4, weights [G, n, k], float32 operands, a bf16 output starting as
    existing_out: other groups' rows keep existing_out's values bitwise."""
    rng = np.random.default_rng(1)
    m, k, n = 96, 24, 40
    sizes = np.array([20, 30, 0, 40], np.int32)  # groups 1 and 2 are local; rows 90.. past
    lhs, rhs = _values(rng, (m, k), jnp.float32), _values(rng, (2, n, k), jnp.float32)
    existing = _values(rng, (m, n), jnp.bfloat16)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), preferred_element_type=jnp.bfloat16,
                       group_offset=jnp.int32(1), existing_out=existing, transpose_rhs=True)
    expected = reference.gmm(lhs, rhs, sizes, group_offset=1, existing_out=existing,
                             transpose_rhs=True)
    assert out.dtype == jnp.bfloat16
    assert_close(out, expected, jnp.bfloat16, contraction=k)
    kept = np.r_[0:20, 50:m]
    np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])


def test_gmm_gradients_with_offset_existing_out_a_nan_elsewhere_and_wrapping_sums():
    """Under jit (the sizes unknown when tracing): local groups 1..2 of 4 with existing_out,
    a NaN in a row of group 0; the output and the gradients of lhs, rhs and existing_out
    against float64, the NaN's row exactly 0 in d lhs. Then sizes whose int32 running sums
    wrap: group 1 takes every row after group 0's, as saturating sums say."""
    rng = np.random.default_rng(3)
    m, k, n = 96, 24, 40
    sizes = np.array([20, 30, 0, 40], np.int32)
    lhs = np.asarray(_values(rng, (m, k), jnp.float32)).copy()
    lhs[5, 3] = np.nan
    rhs = _values(rng, (2, k, n), jnp.float32)
    existing = _values(rng, (m, n), jnp.float32)
    d_out = _values(rng, (m, n), jnp.float32)
    gmm = _mosaic(GMM)

    @jax.jit
    def step(lhs, rhs, existing, sizes):
        out, pullback = jax.vjp(lambda l, r, e: gmm(l, r, sizes, group_offset=jnp.int32(1),
                                                    existing_out=e), lhs, rhs, existing)
        return out, pullback(d_out)

    out, (d_lhs, d_rhs, d_existing) = step(jnp.asarray(lhs), rhs, existing, jnp.asarray(sizes))
    assert_close(out, reference.gmm(lhs, rhs, sizes, group_offset=1, existing_out=existing),
                 jnp.float32, contraction=k)
    expected = reference.gmm_vjp(lhs, rhs, sizes, d_out, group_offset=1, has_existing=True)
    for got, want, terms in zip((d_lhs, d_rhs, d_existing), expected, (n, 40, 1)):
        assert_close(got, want, jnp.float32, contraction=terms)
    assert not np.asarray(d_lhs)[5].any()

    # Int32 running sums that wrap, and one local group holding every row (the same
    # compilation: the sizes are traced).
    for other in ([20, 2**31 - 1, 2**31 - 1, 1], [0, m, 0, 0]):
        other = np.array(other, np.int32)
        out, _ = step(jnp.asarray(lhs), rhs, existing, jnp.asarray(other))
        assert_close(out, reference.gmm(lhs, rhs, other, group_offset=1, existing_out=existing),
                     jnp.float32, contraction=k)


# The interleaved layout of weights [G, k, 2n] is gathered into the concatenated one before the
# kernel: its case runs the concatenated kernel too (and the gated fp8, int8 and
# warp-specialized cases below take the concatenated layout as given). Stored [G, 2n, k] it is
# read in place: test_interleaved_gate_up_stored_gnk_is_read_in_place.
@pytest.mark.parametrize("glu_layout", ["interleaved",
                                        pytest.param("concatenated", marks=GPU_RUN_ONLY)])
def test_gmm_glu_with_bias(glu_layout):
    """A gated unit on the accumulators (two per tile), the group's bias added first, in both
    layouts; rows of no local group are 0."""
    rng = np.random.default_rng(2)
    m, k, n_rhs = 72, 32, 48
    sizes = np.array([40, 0, 30], np.int32)
    lhs, rhs = _values(rng, (m, k), jnp.bfloat16), _values(rng, (3, k, n_rhs), jnp.bfloat16)
    bias = _values(rng, (3, n_rhs), jnp.float32)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), bias=bias, glu="swiglu_oai",
                       glu_layout=glu_layout)
    expected = reference.gmm(lhs, rhs, sizes, bias=bias, glu="swiglu_oai",
                             glu_layout=glu_layout)
    assert out.shape == (m, n_rhs // 2)
    assert_close(out, expected, jnp.float32, contraction=k)
    assert np.all(np.asarray(out)[70:] == 0)


def test_gmm_activation_with_bias_and_gradients():
    """gelu (erf) after a bias, and the exact gradients the kit builds from these kernels:
    d lhs through the transposed-weights gmm, d rhs and d bias through tgmm."""
    rng = np.random.default_rng(3)
    m, k, n = 66, 24, 40
    sizes = np.array([30, 0, 30], np.int32)
    lhs, rhs = _values(rng, (m, k), jnp.float32), _values(rng, (3, k, n), jnp.float32)
    bias = _values(rng, (3, n), jnp.float32)
    d_out = _values(rng, (m, n), jnp.float32)

    def f(lhs, rhs, bias):
        return _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), bias=bias, activation="gelu")

    # The forward and its pullback in one jitted program (eagerly, the kit's XLA ops around
    # the kernels compile one by one).
    out, (d_lhs, d_rhs, d_bias) = jitted_vjp(f, (lhs, rhs, bias), d_out)
    assert_close(out, reference.gmm(lhs, rhs, sizes, bias=bias, activation="gelu"),
                 jnp.float32, contraction=k)
    grads = reference.gmm_epilogue_vjp(lhs, rhs, sizes, d_out, bias=bias, activation="gelu")
    assert_close(d_lhs, grads["lhs"], jnp.float32, contraction=n)
    assert_close(d_rhs, grads["rhs"], jnp.float32, contraction=m)
    assert_close(d_bias, grads["bias"], jnp.float32, contraction=m)


# Here int8 (its int32 sums converted before the scales). The fp8 pairs scale the same float32
# tile, which the gated fp8 cases below cross here: e4m3 weights [G, k, n] copied K-major for
# fp8 wgmma (the e5m2 case's kernel) and e5m2 ones converted per tile (the e4m3 case's, as the
# heuristic tiles it).
@pytest.mark.parametrize("dtypes, transpose_rhs", [
    pytest.param((jnp.float8_e4m3fn, jnp.float8_e4m3fn), False, marks=GPU_RUN_ONLY),
    pytest.param((jnp.float8_e5m2, jnp.float8_e5m2), True, marks=GPU_RUN_ONLY),
    ((jnp.int8, jnp.int8), True),
])
def test_gmm_8bit_with_row_and_column_scales(dtypes, transpose_rhs):
    """fp8 and int8 operands with one scale per row of lhs and per column of each expert: the
    kernel multiplies the stored values (fp8 or int8 wgmma) and scales its float32 tile (int8's
    int32 sums converted) before the store."""
    rng = np.random.default_rng(4)
    m, k, n = 70, 64, 32
    sizes = np.array([25, 45], np.int32)
    lhs = quantized_operand(_values(rng, (m, k), jnp.float32), dtypes[0], axis=1)
    weights = _values(rng, (2, n, k) if transpose_rhs else (2, k, n), jnp.float32)
    rhs = quantized_operand(weights, dtypes[1], axis=2 if transpose_rhs else 1)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), transpose_rhs=transpose_rhs)
    expected = reference.gmm(as_float64(lhs), as_float64(rhs), sizes, transpose_rhs=transpose_rhs)
    assert_close(out, expected, jnp.float32, contraction=k)


@pytest.mark.parametrize("dtype, upcast", [(jnp.float8_e4m3fn, 0), (jnp.float8_e5m2, 1)])
def test_gmm_fp8_weights_copied_or_upcast_with_offset_existing_out_and_a_gated_unit(dtype,
                                                                                  upcast):
    """fp8 weights [G, k, n] both ways (the tiling's upcast): copied K-major for 8-bit wgmma,
    or read as stored and converted to float16 tile by tile; with group_offset, existing_out's
    rows kept elsewhere, a bias and a gated unit (two accumulators: two weight tiles a step);
    k = 200 ends in a partial contraction step (zeros past it)."""
    rng = np.random.default_rng(11)
    m, k, n_rhs = 72, 200, 64
    sizes = np.array([10, 30, 0, 25], np.int32)  # local groups 1 and 2 (empty); sum 65 < 72
    lhs = quantized_operand(_values(rng, (m, k), jnp.float32), dtype, axis=1)
    rhs = quantized_operand(_values(rng, (2, k, n_rhs), jnp.float32), dtype, axis=1)
    bias = _values(rng, (2, n_rhs), jnp.float32)
    existing = _values(rng, (m, n_rhs // 2), jnp.float32)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), group_offset=1, existing_out=existing,
                       bias=bias, glu="silu", tiling=(64, 128, 32, 2, 1, 1, upcast))
    expected = reference.gmm(as_float64(lhs), as_float64(rhs), sizes, group_offset=1,
                             existing_out=existing, bias=bias, glu="silu")
    assert_close(out, expected, jnp.float32, contraction=k)
    kept = np.r_[0:10, 40:72]
    np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])


def _large_int8(rng, shape):
    """int8 values whose sums pass 2**24 within a few hundred terms, where float32 sums round."""
    return rng.integers(100, 128, shape).astype(np.int8)


def _exact(lhs, rhs):
    return lhs.astype(np.int64) @ rhs.astype(np.int64)


# Weights [G, k, n] are copied to [G, n, k] before the kernel that takes them as stored: the
# copied case runs that kernel here (and test_gmm_8bit_with_row_and_column_scales the stored
# layout under the heuristic's tiling).
@pytest.mark.parametrize("transpose_rhs, tiling", [
    (False, (64, 128, 64, 3, 1, 1, 0)), pytest.param(True, None, marks=GPU_RUN_ONLY)],
    ids=["weights [G, k, n] copied K-major", "[G, n, k] as stored"])
def test_int8_gmm_sums_are_exact_in_int32(transpose_rhs, tiling):
    """int8 x int8 on int8 wgmma: int32 sums, exact, rounded once to the float32 output, in
    both weight layouts (weights [G, k, n] copied K-major: upcast=0; [G, n, k] as stored).
    Sums reach 2e7, past 2**24, where float32 sums (the float16 upcast's) are off by 2. An
    empty group, and rows past the sum exactly 0."""
    rng = np.random.default_rng(21)
    m, k, n = 72, 1536, 64
    sizes = np.array([0, 40, 25], np.int32)  # rows 65.. past the sum
    lhs, rhs = _large_int8(rng, (m, k)), _large_int8(rng, (3, k, n))
    exact = np.zeros((m, n), np.int64)
    exact[:40], exact[40:65] = _exact(lhs[:40], rhs[1]), _exact(lhs[40:65], rhs[2])
    assert exact.max() > 2**24
    weights = np.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    out = _mosaic(GMM)(jnp.asarray(lhs), jnp.asarray(weights), jnp.asarray(sizes),
                       transpose_rhs=transpose_rhs, tiling=tiling)
    np.testing.assert_array_equal(np.asarray(out), exact.astype(np.float32))


def test_int8_tgmm_sums_are_exact_in_int32():
    """tgmm of int8 x int8: exact int32 sums over a group's 1450 rows (past 2**24), per group
    (the heuristic) and carried across a span of groups' chunks (group_span=8); a row of no
    group, its values masked, and an empty group's tile exactly 0."""
    rng = np.random.default_rng(22)
    k, m, n = 64, 1536, 64
    sizes = np.array([1450, 0, 50], np.int32)  # rows 1500.. belong to no group
    lhs, rhs = _large_int8(rng, (k, m)), _large_int8(rng, (m, n))
    exact = np.stack([_exact(lhs[:, :1450], rhs[:1450]), np.zeros((k, n), np.int64),
                      _exact(lhs[:, 1450:1500], rhs[1450:1500])])
    assert exact.max() > 2**24
    for tiling in (None, (128, 64, 64, 3, 1, 8)):
        out = _mosaic(TGMM)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes),
                            tiling=tiling)
        np.testing.assert_array_equal(np.asarray(out), exact.astype(np.float32))


def _quantized_unless_wide(values, dtype, axis):
    """`values` as `dtype` where it is 16 or 32 bits wide, else quantized to it along `axis`."""
    if jnp.dtype(dtype).itemsize >= 2:
        return values.astype(dtype)
    return quantized_operand(values, dtype, axis=axis)


# Here each conversion once: to bf16 beside bf16 in both weight layouts (e4m3's through
# float32; int4 and e2m1, e2m1's from its codes), to float32 beside float32; and one operand
# widened first, an astype before the kernel for every pair. The mixed pairs' tiles both go to
# float16, as an fp8 pair's do (test_gmm_fp8_weights_copied_or_upcast_..., e5m2).
@pytest.mark.parametrize("lhs_dtype, rhs_dtype, transpose_rhs, upcast", [
    (jnp.bfloat16, jnp.int8, False, 1),
    (jnp.bfloat16, jnp.int8, False, 0),
    (jnp.bfloat16, jnp.float8_e4m3fn, True, 1),
    pytest.param(jnp.bfloat16, jnp.float8_e4m3fn, True, 0, marks=GPU_RUN_ONLY),
    pytest.param(jnp.float8_e4m3fn, jnp.float8_e5m2, False, 1, marks=GPU_RUN_ONLY),
    pytest.param(jnp.float8_e4m3fn, jnp.float8_e5m2, False, 0, marks=GPU_RUN_ONLY),
    (jnp.int8, jnp.float32, False, 1),
    pytest.param(jnp.int8, jnp.float32, False, 0, marks=GPU_RUN_ONLY),
    (jnp.bfloat16, jnp.int4, False, 1),
    (jnp.bfloat16, jnp.float4_e2m1fn, True, 1),
    pytest.param(jnp.float4_e2m1fn, jnp.float32, False, 1, marks=GPU_RUN_ONLY),
    pytest.param(jnp.float8_e4m3fn, jnp.int4, False, 1, marks=GPU_RUN_ONLY),
    pytest.param(jnp.bfloat16, jnp.float4_e2m1fn, False, 0, marks=GPU_RUN_ONLY),
])
def test_gmm_8bit_and_4bit_tiles_beside_another_type_converted_per_tile_or_widened_first(
        lhs_dtype, rhs_dtype, transpose_rhs, upcast):
    """Weight-only quantization (bf16 activations, int8, e4m3, int4 or e2m1 weights with one
    scale per column; e2m1 read as its codes, whose float16 bits the kernel builds), a mixed
    8-bit pair, 8-bit beside 4-bit, and 8-bit or 4-bit activations beside float32 weights
    [G, k, n] (which float32 wgmma reads after a transpose; the float32 x int8 lhs gradient is
    test_gradients_of_a_quantized_call's), both ways (the tiling's upcast): the narrow tiles
    converted per step in shared memory (to bf16 beside bf16, float16 beside 8-bit, float32
    beside float32; e4m3 to bf16 through float32), or the operand widened before the kernel;
    with group_offset, existing_out's rows kept elsewhere, and k = 200 ending in a partial
    step."""
    rng = np.random.default_rng(23)
    m, k, n = 72, 200, 64
    sizes = np.array([10, 30, 0, 25], np.int32)  # local groups 1 and 2 (empty); sum 65 < 72
    lhs = _quantized_unless_wide(_values(rng, (m, k), jnp.float32), lhs_dtype, 1)
    rhs = _quantized_unless_wide(
        _values(rng, (2, n, k) if transpose_rhs else (2, k, n), jnp.float32), rhs_dtype,
        2 if transpose_rhs else 1)
    existing = _values(rng, (m, n), jnp.float32)
    expected = reference.gmm(as_float64(lhs), as_float64(rhs), sizes, group_offset=1,
                             existing_out=existing, transpose_rhs=transpose_rhs)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), group_offset=1, existing_out=existing,
                       transpose_rhs=transpose_rhs, tiling=(64, 64, 64, 2, 1, 1, upcast))
    assert_close(out, expected, jnp.float32, contraction=k)
    kept = np.r_[0:10, 40:72]
    np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])


@pytest.mark.parametrize("dtype, block_size, k, tiling", [
    (jnp.int8, None, 128, {"forward": (64, 128, 64, 2, 1, 1, 0)}),
    (jnp.float8_e4m3fn, 128, 192, None),
], ids=["int8 per row and column", "e4m3 in 128-blocks"])
def test_gradients_of_a_quantized_call(dtype, block_size, k, tiling):
    """jax.value_and_grad through a gmm of activations and weights quantized in the call.
    int8 with one scale per row and column: the forward on int8 wgmma (weights copied K-major,
    upcast=0); the gradients, whose scales vary along their contractions, take them folded into
    a float32 cotangent beside the int8 values, whose tiles the heuristic converts to float32 in
    shared memory (the lhs gradient reads the weights [G, k, n] K-major as stored; the weight
    gradient the activations transposed at one byte). e4m3 in 1x128 activation and 128 x 1
    weight blocks (a partial last block): the forward scales each k step's sums
    (scale_blocks.py); in the gradients the blocks run along an output axis, and each step's
    float32 cotangent tile (the lhs gradient) or each chunk's converted activation tile (the
    weight gradient) is scaled by its output tile's block. Against float64 of the dequantized
    product, whose gradients reach the bf16 operands unchanged (straight through); local
    groups 1..2 of 3 (group_offset), one of them empty, rows past the sum (their gradient rows
    exactly 0)."""
    rng = np.random.default_rng(25)
    m, n = 72, 64
    sizes = np.array([20, 0, 40], np.int32)  # group 0 not local; rows 60.. past the sum
    lhs, rhs = _values(rng, (m, k), jnp.bfloat16), _values(rng, (2, k, n), jnp.bfloat16)
    d_out = _values(rng, (m, n), jnp.bfloat16)

    def quantized(lhs, rhs):
        return (quantize(lhs, dtype, axis=1, block_size=block_size),
                quantize(rhs, dtype, axis=1, block_size=block_size))

    def loss(lhs, rhs):
        out = _mosaic(GMM)(*quantized(lhs, rhs), jnp.asarray(sizes), group_offset=1,
                           tiling=tiling, preferred_element_type=jnp.bfloat16)
        return jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32))

    # Jitted, as training runs it (eagerly, the quantization's ops and the kit's around the
    # kernels compile one by one: most of the time here).
    value, (d_lhs, d_rhs) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(lhs, rhs)
    q_lhs, q_rhs = (as_float64(q) for q in jax.jit(quantized)(lhs, rhs))
    out = reference.gmm(q_lhs, q_rhs, sizes, group_offset=1)
    want = float(np.sum(out * np.asarray(d_out, np.float64)))
    np.testing.assert_allclose(float(value), want, rtol=1e-2, atol=1.0)
    want_lhs, want_rhs, _ = reference.gmm_vjp(q_lhs, q_rhs, sizes, d_out, group_offset=1)
    assert_close(d_lhs, want_lhs, jnp.bfloat16, contraction=n)
    assert_close(d_rhs, want_rhs, jnp.bfloat16, contraction=m)
    assert np.all(np.asarray(d_lhs)[:20] == 0) and np.all(np.asarray(d_lhs)[60:] == 0)


@pytest.mark.parametrize("glu_layout", ["concatenated", "interleaved"])
def test_gmm_scale_blocks_along_k_scaled_step_by_step(glu_layout):
    """Scale blocks along k: each k step lies inside one block of both operands, its sums on
    int8 wgmma scaled by the step's row and column scales into a float32 total
    (scale_fitting.within_scale_block). int8 activations in blocks of 64 beside int8 weights
    [G, n, k] in blocks of 128 (steps of 64, k = 320: a partial last block), a gated unit with
    a bias (both halves' column scales, gathered into the concatenated layout; interleaved
    weights are read in place, so their tiles and their scales lie in two layouts), local
    groups 1..2 of 4 (one empty) with existing_out's other rows kept bitwise, against float64
    of the dequantized operands. (e4m3 in 128-blocks, forward and gradients:
    test_gradients_of_a_quantized_call.)"""
    rng = np.random.default_rng(31)
    m, k, n = 100, 320, 64
    sizes = np.array([12, 50, 0, 30], np.int32)  # local rows 12..62
    problem = Problem(Kernel.GMM_TRANSPOSED_RHS, m, k, 2 * n, 4, 2, "int8", "int8", "float32",
                      True)
    blocks = config.from_tiling(None, problem, 2, interpret=True, scale_block=64)
    assert blocks.scaled_steps and blocks.block_k == 64
    lhs = quantized_operand(_values(rng, (m, k), jnp.float32), jnp.int8, axis=1, block_size=64)
    gate_up = quantized_operand(_values(rng, (2, 2 * n, k), jnp.float32), jnp.int8, axis=2,
                                block_size=128)
    bias = _values(rng, (2, 2 * n), jnp.float32)
    existing = _values(rng, (m, n), jnp.float32)
    out = _mosaic(GMM)(lhs, gate_up, jnp.asarray(sizes), bias=bias, glu="silu",
                       glu_layout=glu_layout, transpose_rhs=True, group_offset=jnp.int32(1),
                       existing_out=existing)
    expected = reference.gmm(as_float64(lhs), as_float64(gate_up), sizes, bias=bias,
                             glu="silu", glu_layout=glu_layout, transpose_rhs=True,
                             group_offset=1, existing_out=existing)
    assert_close(out, expected, jnp.float32, contraction=k)
    kept = np.r_[0:12, 62:m]
    np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])


def test_warp_specialized_gmm_scales_each_step_in_both_compute_warpgroups():
    """compute_warpgroups=2 with scale blocks along k: the memory warpgroup loads each step's
    row and column scales beside its tiles, and each compute warpgroup scales its step's sums
    (its 64 columns' scales) into float32 totals. e4m3 activations in blocks of 64 beside
    weights in blocks of 128 (steps of 64, k = 192: a partial last block), local groups 1..2
    of 4 (one empty) with existing_out's other rows kept bitwise, against float64 of the
    dequantized operands. (Export at Mixtral's shape: the gated unit and the tuner's
    warp-specialized tilings lower too, by hand.)"""
    rng = np.random.default_rng(32)
    m, k, n = 100, 192, 128
    sizes = np.array([12, 50, 0, 30], np.int32)  # local rows 12..62
    tiling = (64, 64, 128, 2, 2)
    problem = Problem(Kernel.GMM, m, k, n, 4, 2, "float8_e4m3fn", "float8_e4m3fn", "float32",
                      True)
    blocks = config.from_tiling(tiling, problem, scale_block=64, interpret=True)
    assert blocks.scaled_steps and blocks.compute_warpgroups == 2
    lhs = quantized_operand(_values(rng, (m, k), jnp.float32), jnp.float8_e4m3fn, axis=1,
                            block_size=64)
    rhs = quantized_operand(_values(rng, (2, k, n), jnp.float32), jnp.float8_e4m3fn, axis=1,
                            block_size=128)
    existing = _values(rng, (m, n), jnp.float32)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), tiling=tiling, group_offset=jnp.int32(1),
                       existing_out=existing)
    expected = reference.gmm(as_float64(lhs), as_float64(rhs), sizes, group_offset=1,
                             existing_out=existing)
    assert_close(out, expected, jnp.float32, contraction=k)
    kept = np.r_[0:12, 62:m]
    np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])


# Interpreted, the warp-specialized scaled steps run in the test above; a gated unit only
# doubles the step's sums and scale vectors, which the interpreter runs alike.
@GPU_RUN_ONLY
def test_warp_specialized_gated_gmm_with_scale_blocks():
    """The warp-specialized scaled steps with a gated unit, a bias and e4m3 weights [G, n, k]
    (transpose_rhs) in blocks of 128 beside activations in blocks of 64, in the heuristic's
    compute-bound tiling cut for them, against float64; rows past the sum exactly 0."""
    rng = np.random.default_rng(33)
    m, k, n = 300, 384, 128
    sizes = np.array([100, 0, 150], np.int32)  # rows 250.. past the sum
    lhs = quantized_operand(_values(rng, (m, k), jnp.float32), jnp.float8_e4m3fn, axis=1,
                            block_size=64)
    gate_up = quantized_operand(_values(rng, (3, 2 * n, k), jnp.float32), jnp.float8_e4m3fn,
                                axis=2, block_size=128)
    bias = _values(rng, (3, 2 * n), jnp.float32)
    out = _mosaic(GMM)(lhs, gate_up, jnp.asarray(sizes), bias=bias, glu="silu",
                       transpose_rhs=True, tiling=(128, 128, 256, 3, 2),
                       preferred_element_type=jnp.bfloat16)
    expected = reference.gmm(as_float64(lhs), as_float64(gate_up), sizes, bias=bias,
                             glu="silu", transpose_rhs=True)
    assert_close(out, expected, jnp.bfloat16, contraction=k)
    assert np.all(np.asarray(out)[250:] == 0)


def test_scale_blocks_cut_the_tiling():
    """Steps inside one block of every scaled operand, a step's sums and the total within the
    registers of one 128 x 128 tile per compute warpgroup (a warp-specialized 128 x 256 tile
    becomes 128 x 128, 64 columns each, which the heuristic gives a compute-bound call), stages
    that fit; blocks shorter than a wgmma step of the values are widened before the kernel
    instead. Blocks along the output: each tile inside one, one compute warpgroup."""
    problem = Problem(Kernel.GMM, 8192, 4096, 14336, 8, 8, "float8_e4m3fn", "float8_e4m3fn",
                      "bfloat16", False)
    blocks = config.from_tiling((128, 128, 256, 3, 2), problem, scale_block=64)
    assert (blocks.block_m, blocks.block_k, blocks.block_n) == (128, 64, 128)
    assert blocks.compute_warpgroups == 2 and blocks.scaled_steps
    assert shared_memory.needed(blocks, problem) <= shared_memory.SHARED_MEMORY_BYTES
    assert config.from_tiling(None, problem, scale_block=128) == blocks.__class__(
        128, 128, 128, 3, 2, upcast=False, scaled_steps=True)
    gated = config.from_tiling(None, problem, 2, scale_block=128)
    assert 2 * 2 * gated.block_m * gated.warpgroup_columns <= block_rules.ACCUMULATOR_ELEMENTS
    assert scale_fitting.scale_steps_fit(problem, 32)
    assert not scale_fitting.scale_steps_fit(problem, 16)
    assert not config.from_tiling(None, problem).scaled_steps
    # The weight gradient's activations in blocks of 64 along k, its output rows: a span of
    # groups cut to one, the output rows to the block, the 8-bit tiles converted.
    tgmm = Problem(Kernel.TGMM, 16384, 7168, 2048, 256, 32, "float8_e4m3fn", "float32",
                   "bfloat16", False)
    cut = config.from_tiling((64, 128, 128, 4, 1, 8), tgmm, output_block=64)
    assert (cut.block_k, cut.group_span, cut.upcast, cut.scaled_lhs_tiles) == (64, 1, True, True)
    assert scale_fitting.output_block_fits(tgmm, 64)
    assert not scale_fitting.output_block_fits(tgmm, 32)
    # A tiling sized for the key's bf16 cotangent (a table's) still fits the call's float32 one.
    lhs_gradient = Problem(Kernel.GMM_TRANSPOSED_RHS, 16384, 2048, 7168, 256, 32, "float32",
                           "float8_e4m3fn", "bfloat16", False)
    for tiling in ((128, 128, 128, 3, 1, 1, 0), (64, 64, 128, 3, 1, 1, 1, 2)):
        fitted = config.from_tiling(tiling, lhs_gradient, output_block=128,
                                    wider_than_key=True)
        assert (shared_memory.needed(fitted, lhs_gradient)
                <= shared_memory.limit(fitted)), tiling


def test_int8_pairs_multiply_in_int8_only_while_their_int32_sums_cannot_wrap():
    """int8 x int8 tiles take int8 wgmma (int32 sums) up to quantization.MAX_EXACT_INT32_TERMS
    terms of the contraction, the bound the XLA loops share; one term more, or a contraction
    unknown when traced, and they are multiplied widened, summed in float32. (The shared
    suite's 131200-term sums, tests/test_quantization.py, leave this interpreter out.)"""
    int8, bound = np.dtype(np.int8), quantization.MAX_EXACT_INT32_TERMS
    assert bound * 128 * 128 <= np.iinfo(np.int32).max  # -128 * -128, `bound` times
    assert operand_types.kernel_dtype(int8, int8, bound) == int8
    assert operand_types.accumulator_dtype(int8) == np.int32
    assert operand_types.kernel_dtype(int8, int8, bound + 1) == np.dtype(jnp.bfloat16)
    (symbolic,) = jax.export.symbolic_shape("k")
    assert operand_types.kernel_dtype(int8, int8, symbolic) == np.dtype(jnp.bfloat16)
    assert operand_types.accumulator_dtype(jnp.bfloat16) == np.float32


def test_which_tiles_are_converted_per_tile():
    bf16, f16, int8 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.int8)
    e4m3, e5m2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
    assert operand_types.converted_dtype(bf16, int8) == bf16
    assert operand_types.converted_dtype(int8, f16) == f16
    assert operand_types.converted_dtype(e4m3, e5m2) == f16
    assert operand_types.converted_dtype(e4m3, e4m3) == f16
    assert operand_types.converted_dtype(bf16, bf16) is None
    assert operand_types.converted_dtype(np.float32, int8) == np.float32
    assert operand_types.converted_dtype(np.float32, np.float32) is None

    def problem(lhs, rhs, kernel=Kernel.GMM):  # DeepSeek-V3's shape, 32 local experts
        return Problem(kernel, 16384, 7168, 2048, 256, 32, lhs.name, rhs.name, "bfloat16",
                       True)

    # Beside a 16-bit operand, converting costs no FLOP rate and saves the widened copy: the
    # heuristic converts in both weight layouts (with one compute warpgroup) ...
    for kernel in (Kernel.GMM, Kernel.GMM_TRANSPOSED_RHS):
        assert operand_types.upcast_applies(problem(bf16, int8, kernel))
        assert config.from_tiling(None, problem(bf16, int8, kernel)).upcast is True
        assert config.from_tiling(None, problem(e4m3, e5m2, kernel)).upcast is True
    # ... and in tgmm where the copies fit: not beside the heuristic's two programs per SM at
    # 64 rows per expert (2 stages in half the shared memory), which widen first.
    tgmm = problem(bf16, int8, Kernel.TGMM)
    assert operand_types.upcast_applies(tgmm)
    assert config.from_tiling((64, 128, 128, 4), tgmm).upcast is True
    assert config.from_tiling(None, tgmm).as_tiling() == (64, 128, 128, 2, 1, 1, 0, 2)
    # ... an 8-bit pair of one kind needs nothing with weights [G, n, k] or in tgmm (8-bit
    # wgmma multiplies it, tgmm's rhs copied K-major).
    assert not operand_types.upcast_applies(problem(e4m3, e4m3, Kernel.GMM_TRANSPOSED_RHS))
    assert not operand_types.upcast_applies(problem(int8, int8, Kernel.TGMM))
    # A compute-bound call warp-specializes (roofline.compute_bound) and widens first.
    mixtral = Problem(Kernel.GMM, 8192, 4096, 14336, 8, 8, "bfloat16", "int8", "bfloat16", True)
    blocks = config.from_tiling(None, mixtral)
    assert (blocks.compute_warpgroups, blocks.upcast) == (2, False)
    # Beside float32 (a quantized call's gradients: the folded float32 cotangent), float32
    # wgmma reads both tiles K-major: the lhs gradient's weights [G, k, n] (read transposed)
    # and the weight gradient's activations are converted where they lie; 8-bit weights
    # [G, k, n] in a forward would need a transpose as well, and are widened first.
    f32 = np.dtype(np.float32)
    for gradient in (problem(f32, int8, Kernel.GMM_TRANSPOSED_RHS),
                     problem(int8, f32, Kernel.TGMM), problem(int8, f32, Kernel.GMM)):
        assert operand_types.upcast_applies(gradient)
        assert config.from_tiling(None, gradient).upcast is True
    assert not operand_types.upcast_applies(problem(f32, int8, Kernel.GMM))


def test_int8_multiplies_as_stored_while_int32_sums_cannot_wrap():
    limit = quantization.MAX_EXACT_INT32_TERMS
    int8, bf16 = np.dtype(np.int8), np.dtype(jnp.bfloat16)
    assert operand_types.kernel_dtype(int8, int8, limit) == int8
    assert operand_types.accumulator_dtype(int8) == np.dtype(np.int32)
    # Past the limit the values are widened exactly and summed in float32.
    assert operand_types.kernel_dtype(int8, int8, limit + 1) == bf16
    assert operand_types.accumulator_dtype(bf16) == np.dtype(np.float32)
    assert operand_types.kernel_dtype(int8, bf16, 64) == bf16
    assert operand_types.kernel_dtype(int8, jnp.float8_e4m3fn, 64) == bf16
    # tgmm's terms are its summed rows, m.
    tgmm = Problem(Kernel.TGMM, limit + 1, 256, 256, 4, 4, "int8", "int8", "float32", False)
    assert operand_types.problem_dtype(tgmm) == bf16
    assert operand_types.problem_dtype(dataclasses.replace(tgmm, m=limit)) == int8
    # Fine-grained MoE reads int8 weights [G, k, n] as stored, converted per tile, as for fp8.
    deepseek = Problem(Kernel.GMM, 16384, 7168, 2048, 256, 32, "int8", "int8", "bfloat16", True)
    assert config.from_tiling(None, deepseek).upcast is True


def test_warp_specialized_gmm_with_offset_existing_out_and_a_gated_unit():
    """compute_warpgroups=2: a memory warpgroup feeding two compute warpgroups, each of half
    the columns, on the interpreter's two programs (each walks several work items, so the
    pipeline runs on across them). Local groups 1..2 of 4 (the second empty) with
    existing_out (the other rows kept bitwise), unaligned groups, rows past the sum, in the
    heuristic's compute-bound tiling with the contract's float32 output, stored from 64-row
    pieces of each 128-row tile (shared_memory.output_tile_rows): group 1's 90 rows, in the tile
    from row 16, cross from the first piece into the second. Then a gated unit with a bias
    and int8 weights [G, n, k] (transpose_rhs) beside float32 activations, whose two
    accumulators per warpgroup read two weight tiles a step, each warpgroup converting its
    columns of both to float32 (upcast) and transposing them for wgmma (interpreted, through a
    tile per compute warpgroup allocated with the program's; compiled, a transposed view,
    which export checks), and rows past the sum exactly 0."""
    rng = np.random.default_rng(9)
    m, k, n = 170, 80, 96
    sizes = np.array([20, 90, 0, 40], np.int32)  # groups 1, 2 local: rows 20..110; sum 150
    lhs, rhs = _values(rng, (m, k), jnp.bfloat16), _values(rng, (2, k, n), jnp.bfloat16)
    existing = _values(rng, (m, n), jnp.float32)
    tiling = (128, 64, 256, 3, 2)
    problem = Problem(Kernel.GMM, m, k, n, 4, 2, "bfloat16", "bfloat16", "float32", True)
    assert shared_memory.output_tile_rows(config.from_tiling(tiling, problem), problem) == 64
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), tiling=tiling,
                       group_offset=jnp.int32(1), existing_out=existing)
    expected = reference.gmm(lhs, rhs, sizes, group_offset=1, existing_out=existing)
    assert_close(out, expected, jnp.float32, contraction=k)
    kept = np.r_[0:20, 110:m]
    np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])

    # int8 weights, converted per compute warpgroup (upcast): float32 tiles beside the float32
    # activations, as a quantized call's lhs gradient has them.
    gate_up = quantized_operand(_values(rng, (4, 2 * n, k), jnp.float32), jnp.int8, axis=2)
    bias = _values(rng, (4, 2 * n), jnp.float32)
    wide = lhs.astype(jnp.float32)
    out = _mosaic(GMM)(wide, gate_up, jnp.asarray(sizes), tiling=(64, 32, 128, 2, 2, 1, 1),
                       bias=bias, glu="silu", transpose_rhs=True,
                       preferred_element_type=jnp.bfloat16)
    expected = reference.gmm(wide, as_float64(gate_up), sizes, bias=bias, glu="silu",
                             transpose_rhs=True)
    assert_close(out, expected, jnp.bfloat16, contraction=k)
    assert np.all(np.asarray(out)[150:] == 0)


# Interpreted, each compute warpgroup's conversion is the one the gated call of the test above
# runs here (its half of the step's tile loaded, widened and stored to its copy, int8 to
# float32 there, to bf16 here); group_offset and existing_out run in that test's first call.
# What this case adds, column halves of a [k, n] tile and bf16 copies in their swizzled
# layouts, is the compiled kernel's: a GPU run takes it.
@GPU_RUN_ONLY
def test_warp_specialized_gmm_converts_8bit_tiles_per_compute_warpgroup():
    """compute_warpgroups=2 with upcast: each compute warpgroup converts its columns of the
    step's int8 weight tile [G, k, n] into a bf16 copy of its own (weight-only quantization of
    a compute-bound call), against float64 with group_offset, existing_out's rows kept bitwise
    and unaligned groups across work items. (float32 x int8 weights [G, n, k], the lhs
    gradient's layout, runs in the gated call of the test above.)"""
    lhs_dtype, rhs_dtype, transpose_rhs = jnp.bfloat16, jnp.int8, False
    rng = np.random.default_rng(26)
    m, k, n = 80, 64, 128
    sizes = np.array([10, 60, 0, 5], np.int32)  # local groups 1, 2 (empty): rows 10..70
    lhs = _quantized_unless_wide(_values(rng, (m, k), jnp.float32), lhs_dtype, 1)
    rhs = _quantized_unless_wide(
        _values(rng, (2, n, k) if transpose_rhs else (2, k, n), jnp.float32), rhs_dtype,
        2 if transpose_rhs else 1)
    existing = _values(rng, (m, n), jnp.float32)
    out = _mosaic(GMM)(lhs, rhs, jnp.asarray(sizes), tiling=(64, 32, 128, 2, 2, 1, 1),
                       group_offset=jnp.int32(1), existing_out=existing,
                       transpose_rhs=transpose_rhs)
    expected = reference.gmm(as_float64(lhs), as_float64(rhs), sizes, group_offset=1,
                             existing_out=existing, transpose_rhs=transpose_rhs)
    assert_close(out, expected, jnp.float32, contraction=k)
    kept = np.r_[0:10, 70:m]
    np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])


# ---------------------------------------------------------------- transposed_grouped_matmul


def test_tgmm_unaligned_offset_actual_groups_and_existing_out():
    """Groups 1..2 of 4 (num_actual_groups=2) summed over unaligned row ranges, one of them
    empty, bf16 operands, added to existing_out; an empty group's slice is existing_out's."""
    rng = np.random.default_rng(5)
    k, m, n = 40, 90, 24
    sizes = np.array([13, 0, 51, 20], np.int32)
    lhs, rhs = _values(rng, (k, m), jnp.bfloat16), _values(rng, (m, n), jnp.bfloat16)
    existing = _values(rng, (2, k, n), jnp.float32)
    out = _mosaic(TGMM)(lhs, rhs, jnp.asarray(sizes), group_offset=jnp.int32(1),
                        num_actual_groups=2, existing_out=existing)
    expected = reference.tgmm(lhs, rhs, sizes, group_offset=1, num_actual_groups=2,
                              existing_out=existing)
    assert_close(out, expected, jnp.float32, contraction=m)
    np.testing.assert_array_equal(np.asarray(out)[0], np.asarray(existing)[0])


def test_tgmm_float32_isolates_other_groups_nan():
    """float32 (its rhs read K-major), a NaN in a row of no group: no group's sum sees it."""
    rng = np.random.default_rng(6)
    k, m, n = 24, 70, 40
    sizes = np.array([30, 33], np.int32)  # rows 63.. belong to no group
    lhs = np.asarray(_values(rng, (k, m), jnp.float32)).copy()
    rhs = np.asarray(_values(rng, (m, n), jnp.float32)).copy()
    lhs[:, 65] = np.nan
    rhs[66] = np.inf
    out = _mosaic(TGMM)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes))
    assert_close(out, reference.tgmm(lhs, rhs, sizes), jnp.float32, contraction=m)


# The two fp8 kinds take one path (their select through float16 alike); e5m2 on a GPU.
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn,
                                   pytest.param(jnp.float8_e5m2, marks=GPU_RUN_ONLY)])
def test_tgmm_fp8_masks_other_groups_rows(dtype):
    """fp8 operands (summed on fp8 wgmma, rhs read K-major) with groups crossing chunks and a
    NaN in a row of no group: the rows outside a group are zeroed in shared memory (a select
    that Mosaic GPU runs on float16 for 8-bit values), so no sum sees another group's rows."""
    rng = np.random.default_rng(13)
    k, m, n = 64, 150, 64
    sizes = np.array([50, 0, 81], np.int32)  # rows 131.. belong to no group
    lhs = np.asarray(_values(rng, (k, m), dtype)).copy()
    rhs = np.asarray(_values(rng, (m, n), dtype)).copy()
    lhs[:, 140] = np.nan
    out = _mosaic(TGMM)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes))
    assert_close(out, reference.tgmm(lhs, rhs, sizes), jnp.float32, contraction=m)


# Here every pair under the heuristic (its tiles converted per chunk: each conversion, to bf16
# from int8 and from e4m3 through float32, to float16, to float32 in the K-major layouts); the
# spans of groups and the widened operand (an astype before the kernel, the same for every pair)
# once each, beside bf16. A span's chunks are the per-group body's in each layout.
@pytest.mark.parametrize("lhs_dtype, rhs_dtype, tiling", [
    pytest.param(lhs, rhs, tiling, id=f"{jnp.dtype(lhs).name}-{jnp.dtype(rhs).name}-{name}",
                 marks=[] if (name == "heuristic" and (lhs, rhs) != (jnp.bfloat16, jnp.int4))
                 or (lhs, rhs) == (jnp.int8, jnp.bfloat16) else [GPU_RUN_ONLY])
    for lhs, rhs in ((jnp.int8, jnp.bfloat16), (jnp.bfloat16, jnp.float8_e4m3fn),
                     (jnp.float8_e4m3fn, jnp.float8_e5m2), (jnp.int8, jnp.float32),
                     (jnp.float4_e2m1fn, jnp.bfloat16), (jnp.bfloat16, jnp.int4))
    for name, tiling in (("heuristic", None), ("spans", (64, 64, 64, 2, 1, 8, 1)),
                         ("widened", (64, 64, 64, 2, 1, 1, 0)))])
def test_tgmm_8bit_and_4bit_tiles_beside_another_type_converted_per_tile_or_widened_first(
        lhs_dtype, rhs_dtype, tiling):
    """tgmm of 8-bit or 4-bit activations beside a bf16 operand (and the reverse, and a mixed
    8-bit pair), as a caller computing a weight gradient from quantized activations, and beside a
    float32 one (a quantized call's weight gradient: the float32 layouts, both operands read
    K-major): the 8-bit tiles converted per chunk in shared memory, their other groups' rows
    zeroed in the same select (the heuristic's choice), over spans of groups too, or the
    operand widened before the kernel (upcast=0); groups 1..2 of 4 crossing chunks,
    existing_out added, against float64. Rows 70 (of group 3) and 5 (of group 0), neither
    local, hold a NaN (16- or 32-bit operand) or 8s (8-bit), which the select keeps out: row
    70 lies in group 2's last chunk in the 16-bit layouts (chunks from a group's first row
    rounded down to 8), row 5 in its first in the K-major ones (chunks of aligned rows)."""
    rng = np.random.default_rng(24)
    k, m, n = 64, 150, 64
    sizes = np.array([13, 0, 51, 70], np.int32)  # local groups 1, 2: rows 13..64

    def operand(shape, dtype, axis):
        values = np.asarray(_values(rng, shape, jnp.float32)).copy()
        wide = jnp.dtype(dtype).itemsize >= 2
        for row in (5, 70):
            values[(slice(None), row) if axis == 1 else row] = np.nan if wide else 8.0
        values = jnp.asarray(values)
        return values.astype(dtype) if wide else quantized_operand(values, dtype, axis=axis)

    lhs, rhs = operand((k, m), lhs_dtype, 1), operand((m, n), rhs_dtype, 0)
    existing = _values(rng, (2, k, n), jnp.float32)
    expected = reference.tgmm(as_float64(lhs), as_float64(rhs), sizes, group_offset=1,
                              num_actual_groups=2, existing_out=existing)
    out = _mosaic(TGMM)(lhs, rhs, jnp.asarray(sizes), group_offset=jnp.int32(1),
                        num_actual_groups=2, existing_out=existing, tiling=tiling)
    assert_close(out, expected, jnp.float32, contraction=m)


def test_tgmm_many_tiles_per_program_with_one_group_holding_every_row():
    """27 output tiles on the interpreter's 2 programs, so each program reuses its one store
    tile many times (existing_out read into it, its last store waited for): every tile
    against float64, the last one included. One local group owns every row; the two others
    are empty and keep existing_out. (The interpreter runs the stores in order: whether a
    store in flight is waited for before its tile is rewritten is the GPU run's to show.)"""
    rng = np.random.default_rng(8)
    k, m, n = 130, 75, 40
    sizes = np.array([0, m, 0, 0], np.int32)
    lhs, rhs = _values(rng, (k, m), jnp.bfloat16), _values(rng, (m, n), jnp.bfloat16)
    existing = _values(rng, (3, k, n), jnp.float32)
    out = _mosaic(TGMM)(lhs, rhs, jnp.asarray(sizes), tiling=(64, 64, 16),
                        group_offset=jnp.int32(1), num_actual_groups=3, existing_out=existing)
    expected = reference.tgmm(lhs, rhs, sizes, group_offset=1, num_actual_groups=3,
                              existing_out=existing)
    assert_close(out, expected, jnp.float32, contraction=m)
    np.testing.assert_array_equal(np.asarray(out)[1:], np.asarray(existing)[1:])


# Per group and two programs per SM move back the same chunk (the per-group body's): here the
# latter, whose programs no other tgmm case crosses.
@pytest.mark.parametrize("tiling", [pytest.param((64, 64, 64), marks=GPU_RUN_ONLY),
                                    (64, 64, 64, 2, 1, 2), (64, 64, 64, 2, 1, 1, 0, 2)],
                         ids=["per group", "spans", "two programs per SM"])
def test_tgmm_chunks_from_group_starts_moved_back_from_the_end(tiling):
    """bf16 chunks start at a group's first row rounded down to 8: the last group's (rows
    100..119, from row 96) would pass the 128 rows, so it is moved back to rows 64..127 and
    sums only rows 100..119 (the first group's rows in it stay out); a NaN past the sum
    reaches nothing."""
    rng = np.random.default_rng(12)
    k, m, n = 64, 128, 64
    sizes = np.array([100, 20], np.int32)  # rows 120.. past the sum
    lhs, rhs = _values(rng, (k, m), jnp.bfloat16), _values(rng, (m, n), jnp.bfloat16)
    rhs = rhs.at[120:].set(jnp.nan)
    out = _mosaic(TGMM)(lhs, rhs, jnp.asarray(sizes), tiling=tiling)
    assert_close(out, reference.tgmm(lhs, rhs, sizes), jnp.float32, contraction=m)


@pytest.mark.parametrize("dtype, tiling, k, n", [
    (jnp.bfloat16, (64, 128, 256, 3, 2), 128, 256),  # Mixtral's heuristic tiling
    (jnp.float32, (64, 64, 128, 2, 2), 64, 128)])
def test_warp_specialized_tgmm_with_offset_existing_out_and_other_groups_nan(dtype, tiling, k,
                                                                             n):
    """compute_warpgroups=2: a memory warpgroup loading each chunk for two compute warpgroups,
    each summing half of the output tile's columns, on the interpreter's two programs. Local
    groups 1..4 of 5 with existing_out, an empty group, boundaries inside chunks (both
    warpgroups mask the same rows of the shared tiles), a NaN in rows of no group; 16-bit
    values read lhs [m, k] (its tile transposed for wgmma), float32 ones rhs [n, m]. The bf16
    case's float32 output tiles of 128 rows do not fit beside its 3 stages: each warpgroup
    stores its half in 64-row pieces (shared_memory.output_tile_rows)."""
    rng = np.random.default_rng(3)
    m = 200
    sizes = np.array([13, 0, 51, 70, 9], np.int32)  # sum 143; local rows 13..143
    lhs, rhs = _values(rng, (k, m), dtype), _values(rng, (m, n), dtype)
    rhs = rhs.at[150:].set(jnp.nan)
    existing = _values(rng, (4, k, n), jnp.float32)
    problem = Problem(Kernel.TGMM, m, k, n, 5, 4, jnp.dtype(dtype).name, jnp.dtype(dtype).name,
                      "float32", True)
    assert shared_memory.output_tile_rows(config.from_tiling(tiling, problem), problem) == (
        64 if dtype == jnp.bfloat16 else k)
    out = _mosaic(TGMM)(lhs, rhs, jnp.asarray(sizes), tiling=tiling,
                        group_offset=jnp.int32(1), num_actual_groups=4, existing_out=existing)
    expected = reference.tgmm(lhs, rhs, sizes, group_offset=1, num_actual_groups=4,
                              existing_out=existing)
    assert_close(out, expected, jnp.float32, contraction=m)
    np.testing.assert_array_equal(np.asarray(out)[0], np.asarray(existing)[0])  # group 1: empty


def test_group_span_chunk_table_by_hand():
    """block_m 16 over 64 padded rows; groups [0, 26), empty, [26, 60), empty; spans of 3.
    Aligned chunks (float32's and fp8's): the chunk a boundary crosses (rows 16..31) is visited
    by both groups. Chunks from a group's first row rounded down to 8 (16-bit): [24, 40),
    [40, 56), then [56, 72) moved back to [48, 64), summing from row 56. An empty group gets one
    visit that sums no row (its zeros are stored); the spans are visits [0, 6) and [6, 7)."""
    starts, ends = jnp.array([0, 26, 26, 60], jnp.int32), jnp.array([26, 26, 60, 60], jnp.int32)
    groups, end = [0, 0, 1, 2, 2, 2, 3], [26, 26, 26, 60, 60, 60, 60]
    first, last = [1, 0, 1, 1, 0, 0, 1], [0, 1, 1, 0, 0, 1, 1]
    expected = {  # (first row of the tiles, first row summed) per visit
        True: ([0, 16, 16, 16, 32, 48, 48], [0, 16, 26, 26, 32, 48, 60]),
        False: ([0, 16, 24, 24, 40, 48, 48], [0, 16, 26, 26, 40, 56, 60]),
    }
    # Jitted, as the kernel calls it: run op by op, the table's ops compile one by one.
    chunk_tables = jax.jit(group_spans.chunk_tables, static_argnums=(2, 3, 4, 5))
    for k_major_only, (rows, summed_from) in expected.items():
        table, spans = chunk_tables(starts, ends, 3, 64, 16, ChunkLayout(k_major_only))
        assert table.shape == (6, 4 + 4)  # every chunk once, one more per group: static
        np.testing.assert_array_equal(np.asarray(table)[:, :7],
                                      [groups, rows, summed_from, end, first, last])
        np.testing.assert_array_equal(np.asarray(spans), [[0, 6], [6, 7]])


def test_tgmm_over_group_spans_with_empty_groups_offset_and_existing_out():
    """group_span=2: one pipeline sums two groups' chunks and stores at each group's end.
    Groups 1..5 of 7 (one span of one group at the end), empty groups inside a span and at
    its edges, unaligned boundaries inside 64-row chunks, rows past the sum, existing_out."""
    rng = np.random.default_rng(11)
    k, m, n = 40, 200, 24
    sizes = np.array([13, 0, 51, 20, 70, 0, 9], np.int32)  # sum 163
    lhs, rhs = _values(rng, (k, m), jnp.bfloat16), _values(rng, (m, n), jnp.bfloat16)
    existing = _values(rng, (5, k, n), jnp.float32)
    out = _mosaic(TGMM)(lhs, rhs, jnp.asarray(sizes), tiling=(64, 64, 16, 2, 1, 2),
                        group_offset=jnp.int32(1), num_actual_groups=5, existing_out=existing)
    expected = reference.tgmm(lhs, rhs, sizes, group_offset=1, num_actual_groups=5,
                              existing_out=existing)
    assert_close(out, expected, jnp.float32, contraction=m)
    for empty in (0, 4):  # groups 1 and 5: existing_out's tiles, plus exact zeros
        np.testing.assert_array_equal(np.asarray(out)[empty], np.asarray(existing)[empty])


def test_tgmm_over_group_spans_float32_isolates_other_groups_nan():
    """float32 (rhs read K-major) over one span of all three groups, a NaN and an inf in rows
    of no group: no group's sum sees them, and the empty group's tile is exactly 0."""
    rng = np.random.default_rng(12)
    k, m, n = 24, 140, 64
    sizes = np.array([30, 0, 66], np.int32)  # rows 96.. belong to no group
    lhs = np.asarray(_values(rng, (k, m), jnp.float32)).copy()
    rhs = np.asarray(_values(rng, (m, n), jnp.float32)).copy()
    lhs[:, 100] = np.nan
    rhs[120] = np.inf
    out = _mosaic(TGMM)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes),
                        tiling=(64, 64, 64, 2, 1, 4))
    assert_close(out, reference.tgmm(lhs, rhs, sizes), jnp.float32, contraction=m)
    assert np.all(np.asarray(out)[1] == 0)


# ---------------------------------------------------------------- kernelhub.testing


def test_equivalence_harness_runs_the_interpreted_kernels():
    # The interpreted kernels here, the compiled ones on a Hopper GPU.
    spec = next(s for s in testing.runnable_implementations(GMM) if s.platform.value == "mosaic")
    rng = np.random.default_rng(7)
    case = testing.Case(_values(rng, (40, 16), jnp.float32), _values(rng, (2, 16, 24), jnp.float32),
                        jnp.asarray([15, 20], jnp.int32))
    report = testing.check_implementations(
        GMM, lambda **a: reference.gmm(a["lhs"], a["rhs"], a["group_sizes"]), [case],
        gradients=False, implementations=[spec])
    report.assert_ok()


def test_calls_from_several_threads_at_once():
    """Four threads each call the kernel at once (interpreted here: jax's interpreter keeps one
    simulated GPU per process, and two kernels at once tore each other's shared memory down,
    failing half the calls until launches took turns; compiled on a GPU). Each result against
    float64."""
    import threading

    rng = np.random.default_rng(8)
    lhs, rhs = _values(rng, (24, 16), jnp.float32), _values(rng, (3, 16, 32), jnp.float32)
    sizes = jnp.asarray([7, 0, 13], jnp.int32)
    gmm, start = _mosaic(GMM), threading.Barrier(4)
    results: dict[int, object] = {}

    def call(i):
        start.wait()
        try:
            results[i] = np.asarray(gmm(lhs * (i + 1), rhs, sizes))
        except Exception as error:  # noqa: BLE001 - the test reports it
            results[i] = error

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(4):
        assert not isinstance(results[i], Exception), results[i]
        assert_close(results[i], reference.gmm(lhs * (i + 1), rhs, sizes), jnp.float32,
                     contraction=16)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's programs; a GPU runs the compiled kernels")
def test_kernels_that_trace_alike_share_one_interpreter_program(monkeypatch):
    """Rows that pad to the same tiles, and the forward traced again inside its VJP, run the
    interpreter program compiled first (each trace compiled its own: half a second, and code
    mapped for as long as the call's executable lives). Values against float64."""
    programs = {}  # every program compiled, held (the module holds them weakly)
    monkeypatch.setattr(interpreter_programs, "_PROGRAMS", programs)
    rng = np.random.default_rng(9)
    rhs, sizes = _values(rng, (3, 16, 32), jnp.float32), jnp.asarray([5, 0, 6], jnp.int32)
    gmm = _mosaic(GMM)
    for m in (13, 17):
        lhs = _values(rng, (m, 16), jnp.float32)
        assert_close(gmm(lhs, rhs, sizes), reference.gmm(lhs, rhs, sizes), jnp.float32,
                     contraction=16)
    assert len(programs) == 1
    d_out = _values(rng, (17, 32), jnp.float32)
    _, (d_lhs, d_rhs) = jitted_vjp(lambda a, b: gmm(a, b, sizes), (lhs, rhs), d_out)
    expected_lhs, expected_rhs, _ = reference.gmm_vjp(lhs, rhs, sizes, d_out)
    assert_close(d_lhs, expected_lhs, jnp.float32, contraction=32)
    assert_close(d_rhs, expected_rhs, jnp.float32, contraction=17)
    assert len(programs) == 3  # the gradients' two kernels; the forward's was shared


def test_interpreter_programs_differ_by_literal_and_are_not_shared_through_a_callback():
    """A program's jaxpr text names its literals, not the Python function a host callback
    runs: programs that differ only in a callback are compiled apart."""
    x = np.arange(4, dtype=np.float32)

    def plus(value):
        return lambda a: a + value

    def called_back(value):
        return lambda a: jax.pure_callback(lambda b: (b + value).astype(np.float32),
                                           jax.ShapeDtypeStruct(a.shape, a.dtype), a)

    for make in (plus, called_back):
        for value in (np.float32(1), np.float32(2)):
            program = interpreter_programs.compiled(make(value), [x])
            np.testing.assert_array_equal(np.asarray(program(x)), x + value)


def test_a_shared_interpreter_program_lives_only_while_a_call_holds_it():
    x = np.arange(4, dtype=np.float32)
    program = interpreter_programs.compiled(lambda a: a * 3, [x])
    assert interpreter_programs.compiled(lambda a: a * 3, [x]) is program
    held = weakref.ref(program)
    del program
    gc.collect()
    assert held() is None


# ---------------------------------------------------------------- routed by feature


@pytest.mark.parametrize("form, feature", [
    (dict(dtype=jnp.float8_e4m3fn, block_size=4), "quantized_odd_blocks"),
])
def test_forced_on_a_feature_it_lacks_names_the_feature(form, feature):
    lhs = jnp.ones((64, 64), jnp.float32)
    rhs = quantized_operand(jnp.ones((2, 64, 32), jnp.float32), form["dtype"], axis=1,
                            block_size=form.get("block_size"))
    with pytest.raises(kernelhub.NoImplementationError, match=feature):
        _mosaic(GMM)(lhs, rhs, jnp.asarray([32, 32], jnp.int32))


# ---------------------------------------------------------------- registration and tiles


def test_registered_below_triton_and_interpret_only_on_cpu():
    specs = {(s.platform.value, s.backend.value): s for s in kernelhub.implementations(GMM)}
    assert specs[("mosaic", "gpu")].priority < specs[("triton", "gpu")].priority
    assert specs[("mosaic", "cpu")].interpret_only
    if not ON_GPU:
        assert "no device" in specs[("mosaic", "gpu")].unavailable_reason()
        assert kernelhub.resolve(GMM, platform="mosaic").backend.value == "cpu"
    assert kernelhub.resolve(GMM).platform.value != "mosaic"


def test_forced_by_the_environment_variable(platform_variable):
    platform_variable(" Mosaic ")
    spec = kernelhub.resolve(TGMM)
    assert spec.platform.value == "mosaic"
    assert spec.backend.value == ("gpu" if ON_GPU else "cpu")
    assert kernelhub.resolve(GMM, backend="gpu").platform.value == "mosaic"


def test_other_gpus_keep_the_triton_kernels(monkeypatch):
    """Usable on Hopper only: another GPU gets a reason naming Hopper, which `kernelhub list`
    shows."""
    from kernelhub._pallas import mosaic_gpu

    class Ampere:
        platform = "gpu"
        compute_capability = "8.0"

    monkeypatch.setattr(jax, "devices", lambda *a: [Ampere()])
    assert "Hopper" in mosaic_gpu.needs_hopper() and "8.0" in mosaic_gpu.needs_hopper()
    Ampere.compute_capability = "9.0"
    assert mosaic_gpu.needs_hopper() is None


def _problem(kernel, m, k, n, groups, dtype="bfloat16"):
    return Problem(kernel, m, k, n, groups, groups, dtype, dtype, "bfloat16", False)


def test_heuristic_gives_small_groups_64_row_tiles():
    deepseek = heuristic.heuristic(_problem(Kernel.GMM, 16384, 7168, 2048, 256))
    assert (deepseek.block_m, deepseek.block_k, deepseek.block_n) == (64, 64, 128)
    mixtral = heuristic.heuristic(_problem(Kernel.GMM, 8192, 4096, 14336, 8))
    assert mixtral.block_m == 128
    fp8 = heuristic.heuristic(_problem(Kernel.GMM, 8192, 2048, 768, 128, "float8_e4m3fn"))
    assert fp8.block_k == 128  # one 128-byte row per step
    tgmm = heuristic.heuristic(_problem(Kernel.TGMM, 8192, 2048, 768, 128))
    assert tgmm.block_k in block_rules.OUTPUT_ROWS


SHARED = (64, 64, 128, 3, 1, 1, 0, 2)


@pytest.mark.parametrize("shape, tiling, float32_tiling", [
    # The winners of the H100 tune of 2026-11-27 at the fine-grained shapes (bf16 out); a
    # float32 output tile beside 128 rows in 2 stages passes half the shared memory.
    ((16384, 7168, 2048, 256, 32), (64, 128, 128, 2, 1, 1, 0, 2), SHARED),
    ((8192, 2048, 768, 128, 128), (64, 128, 128, 2, 1, 1, 0, 2), SHARED),
    ((8192, 2880, 5760, 128, 128), SHARED, SHARED),  # 2880: 64-row tiles, 3 stages
    # Mixtral's 1024 rows per expert fill a pipeline, and wgmma bounds it: warp-specialized
    # 128 x 256 tiles (a float32 output's stored in 64-row pieces); a small problem leaves a
    # second program per SM no work.
    ((8192, 4096, 14336, 8, 8), (64, 128, 256, 3, 2), (64, 128, 256, 3, 2)),
    ((512, 256, 384, 4, 4), (64, 128, 128, 4), (64, 128, 128, 4)),
])
def test_heuristic_shares_sms_between_tgmm_programs_where_groups_are_one_or_two_chunks(
        shape, tiling, float32_tiling):
    m, k, n, groups, local = shape
    problem = Problem(Kernel.TGMM, m, k, n, groups, local, "bfloat16", "bfloat16", "bfloat16",
                      False)
    assert heuristic.heuristic(problem).as_tiling() == tiling
    wide = dataclasses.replace(problem, out_dtype="float32")
    assert heuristic.heuristic(wide).as_tiling() == float32_tiling


@pytest.mark.parametrize("kernel", list(Kernel))
def test_heuristic_warp_specializes_compute_bound_calls_only(kernel):
    """Mixtral (1024 rows an expert) is compute-bound in every pass: two compute warpgroups
    of a 128 x 256 output tile, 3 stages of 16-bit tiles; a float32 output stored from
    64-row pieces; a gated unit's in 128 x 128 (its two sums share a warpgroup's registers);
    not interpreted. The
    fine-grained shapes, DeepSeek-V3's shard counted at its local rows, are bound by their
    bytes: one warpgroup."""
    mixtral = _problem(kernel, 8192, 4096, 14336, 8)
    assert roofline.compute_bound(mixtral)
    rows, contraction = (128, 64)
    expected = ((contraction, rows, 256, 3, 2) if kernel is Kernel.TGMM
                else (rows, contraction, 256, 3, 2))
    assert heuristic.heuristic(mixtral).as_tiling() == expected
    # Interpreted, one compute warpgroup (a warp-specialized program needs more XLA CPU
    # client threads than a small host has: config.check_interpretable), and the
    # interpreted tuning space's default says the same.
    interpreted = config.from_tiling(None, mixtral, interpret=True)
    assert interpreted.compute_warpgroups == 1
    assert tuning_space.space("mosaic-interpret").default(mixtral) == interpreted.as_tiling()
    assert tuning_space.space("mosaic").default(mixtral) == expected
    wide = dataclasses.replace(mixtral, out_dtype="float32")
    assert roofline.compute_bound(wide)
    blocks = heuristic.heuristic(wide)
    assert blocks.as_tiling() == expected and shared_memory.output_tile_rows(blocks, wide) == 64
    assert shared_memory.output_tile_rows(heuristic.heuristic(mixtral), mixtral) == 128
    if kernel is not Kernel.TGMM:
        # A gated unit: two sums a warpgroup in the registers of one, 128 x 128 tiles (64
        # columns of each sum a compute warpgroup); interpreted, 128 x 64 in one.
        assert config.from_tiling(None, mixtral, weight_tiles=2).as_tiling() == (
            128, 64, 128, 3, 2)
        assert config.from_tiling(None, mixtral, weight_tiles=2, interpret=True).as_tiling(
            ) == (128, 64, 64, 4)
    for shape in ((16384, 7168, 2048, 256, 32), (8192, 2048, 768, 128, 128),
                  (8192, 2880, 5760, 128, 128)):
        m, k, n, groups, local = shape
        problem = Problem(kernel, m, k, n, groups, local, "bfloat16", "bfloat16", "bfloat16",
                          False)
        assert not roofline.compute_bound(problem)
        assert heuristic.heuristic(problem).compute_warpgroups == 1


def test_row_tiles_start_with_their_group_so_each_reads_its_weights_once():
    """64-row groups that start 3 rows off a tile boundary: with tiles at fixed multiples of
    128 rows half the groups cross one and are visited (their weights read) twice; with tiles
    starting at each group's first row, rounded down to block_rules.ROW_ALIGN, once."""
    from kernelhub._grouped_matmul import visits

    sizes = jnp.asarray([3] + [64] * 32 + [61], jnp.int32)  # local groups 1..32
    m = int(sizes.sum())
    # Jitted, as the kernels call it: run op by op, the table's ops compile one by one.
    visit_table = jax.jit(visits.visit_table, static_argnums=(2, 3, 4, 5, 6))
    args = (sizes, jnp.int32(1), 32, m, 128, True)
    started = np.asarray(visit_table(*args, block_rules.ROW_ALIGN))
    fixed = np.asarray(visit_table(*args, None))
    assert [(started[1] == g).sum() for g in range(32)] == [1] * 32
    assert sum((fixed[1] == g).sum() for g in range(32)) == 48


@pytest.mark.parametrize("tiling, rule", [
    ((96, 64, 64), "power of two"),
    ((32, 64, 64), "64 at a time"),
    ((64, 64, 512), r"\[16, 256\]"),
    ((64, 64, 64, 9), "stages=9"),
    ((64, 64), "tuple of ints"),
    ((64, 64, 32), "multiple of 128 bytes"),  # bf16 rows of 64 bytes: TMA's stores
    ((128, 256, 256, 8), "shared memory"),
])
def test_invalid_tiling_names_the_rule(tiling, rule):
    with pytest.raises(ValueError, match=rule):
        config.from_tiling(tiling, _problem(Kernel.GMM, 256, 256, 256, 4))


@pytest.mark.parametrize("tiling, kernel, rule", [
    ((64, 64, 128, 4, 3), Kernel.GMM, "must be 1 or 2"),
    ((64, 128, 64, 4, 2), Kernel.TGMM, "its own 64 or more columns"),  # 32 columns each
    ((64, 128, 256, 3, 2, 2), Kernel.TGMM, "group_span=2 takes 1 compute warpgroup"),
    ((64, 64, 64, 4, 2), Kernel.GMM, "compute warpgroups' halves"),  # 32 bf16 columns each
    ((64, 64, 128, 4, 1, 2), Kernel.GMM, "group_span=2"),  # tgmm's option
    ((64, 128, 128, 4, 1, 0), Kernel.TGMM, "group_span=0"),
    ((64, 64, 128, 2, 1, 1, 0, 5), Kernel.GMM, "programs_per_sm=5"),
    ((64, 64, 128, 4, 1, 1, 0, 3), Kernel.GMM, "when 3 share an SM"),
    ((64, 64, 256, 4, 2, 1, 0, 2), Kernel.GMM, "one compute warpgroup"),
    ((64, 128, 128, 4, 1, 1, 0, 2), Kernel.TGMM, "when 2 share an SM"),  # 4 stages of 32 KiB
])
def test_invalid_warp_specialized_tiling_names_the_rule(tiling, kernel, rule):
    problem = Problem(kernel, 512, 256, 384, 4, 4, "bfloat16", "bfloat16", "bfloat16", False)
    with pytest.raises(ValueError, match=rule):
        config.from_tiling(tiling, problem)


def test_interpreted_warp_specialization_needs_a_client_thread_per_warpgroup(monkeypatch):
    """Interpreted, a program's three warpgroups run at once, each a computation on XLA's
    CPU client; with fewer threads than they and their callers need (2 on a 2-core host
    without NPROC) the interpreter would wait forever: a ValueError saying what to set,
    before anything runs. Compiled, and with one compute warpgroup, the threads don't
    matter."""
    from kernelhub._core import jax_internals

    problem = Problem(Kernel.GMM, 512, 256, 384, 4, 4, "bfloat16", "bfloat16", "bfloat16",
                      False)
    monkeypatch.setattr(jax_internals, "xla_cpu_client_threads", lambda: 2)
    with pytest.raises(ValueError, match="2 threads here.*NPROC=5"):
        config.from_tiling((64, 64, 128, 3, 2), problem, interpret=True)
    with pytest.raises(ValueError, match="NPROC"):
        config.from_tiling(block_rules.BlockConfig(64, 64, 128, 3, 2), problem, interpret=True)
    assert config.from_tiling((64, 64, 128, 3, 2), problem).compute_warpgroups == 2
    assert config.from_tiling((64, 64, 128, 3), problem, interpret=True).stages == 3
    monkeypatch.setattr(jax_internals, "xla_cpu_client_threads", lambda: 5)
    assert config.from_tiling((64, 64, 128, 3, 2), problem,
                              interpret=True).compute_warpgroups == 2


def test_xla_cpu_client_threads_follow_nproc(monkeypatch):
    from kernelhub._core import jax_internals

    monkeypatch.setenv("NPROC", "7")
    assert jax_internals.xla_cpu_client_threads() == 7
    monkeypatch.delenv("NPROC")
    assert jax_internals.xla_cpu_client_threads() >= 1


def test_a_table_tiling_too_big_for_a_gated_unit_gives_way_to_the_heuristic():
    """Tables are tuned without epilogues, and a gated call shares its key with the plain
    call of its weights: a tiling whose 4 stages fit the plain call's shared memory does not
    fit beside a gated unit's second weight tile. The table is then passed over for the gated
    call (one warning) rather than failing it; the plain call still takes it. So is a tiling
    whose one 128 x 128 sum fits a warpgroup's registers and whose gated two would not."""
    from kernelhub import tuning
    from kernelhub._grouped_matmul import active_table
    from kernelhub._grouped_matmul import tables as _tables
    from kernelhub.tuning import _autotune

    rng = np.random.default_rng(12)
    m, k, n = 200, 64, 64
    sizes = np.array([90, 40, 70], np.int32)
    lhs, gate_up = _values(rng, (m, k), jnp.bfloat16), _values(rng, (3, k, 2 * n), jnp.bfloat16)
    gmm = _mosaic(GMM)
    calls = {}
    for glu in (None, "silu"):
        # The recorder takes each call's key as it is traced: no kernel needs to run.
        recorder = _autotune.Recorder()
        with active_table.activated(recorder):
            jax.eval_shape(functools.partial(gmm, glu=glu, preferred_element_type=jnp.bfloat16),
                           lhs, gate_up, jnp.asarray(sizes))
        ((key, calls[glu]),) = recorder.calls.items()
    tiling = (128, 64, 256, 4)  # 4 x 48 KiB of tiles; 4 x 80 KiB with the gate's
    with pytest.raises(ValueError, match="shared memory"):
        config.from_tiling(tiling, calls["silu"].problem, weight_tiles=2)
    table = tuning.Tuning({key: tuning.Entry(tiling, (64, 64, 128), 1.0, 1.0, "test")})
    assert _tables.choose(None, table, calls[None]) == tiling
    with table:
        with pytest.warns(UserWarning, match=r"tiling \[128, 64, 256, 4\].*heuristic"):
            out = gmm(lhs, gate_up, jnp.asarray(sizes), glu="silu",
                      preferred_element_type=jnp.bfloat16)
    assert_close(out, reference.gmm(lhs, gate_up, sizes, glu="silu"), jnp.bfloat16,
                 contraction=k)
    assert _tables.choose(None, table, calls["silu"]) is None
    space, gated, plain = calls[None].space, calls["silu"].epilogue, calls[None].epilogue
    assert space.accepts((128, 64, 128, 4), calls[None].problem, plain)
    assert not space.accepts((128, 64, 128, 4), calls["silu"].problem, gated)
    assert space.accepts((128, 64, 64, 4), calls["silu"].problem, gated)


def test_a_table_tiling_is_judged_by_the_tiles_a_quantized_calls_gradient_multiplies():
    """A quantized call's lhs gradient is keyed by its operands' stored types (the bf16
    cotangent beside int8 weights), but its kernel multiplies the cotangent with the weights'
    column scales folded in, in float32 (kernelhub/_grouped_matmul/scale_folding.py): a
    table's tiling that fits the key's bf16 tiles may not fit those. Such a tiling is passed
    over (one warning) rather than failing the call, and the tuner draws its candidates and
    default for the float32 tiles. Exported for cuda at DeepSeek-V3's shape."""
    from kernelhub import tuning
    from kernelhub._grouped_matmul import active_table
    from kernelhub.tuning import _autotune

    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")

    def lhs_gradient(lhs, weights, scale, sizes, offset, d_out):
        rhs = quantization.QuantizedArray(weights, scale, axis=1)  # a scale per column
        _, pullback = jax.vjp(lambda x: gmm(x, rhs, sizes, group_offset=offset,
                                            preferred_element_type=jnp.bfloat16), lhs)
        return pullback(d_out)[0]

    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((local, k, n), jnp.int8),
            jax.ShapeDtypeStruct(quantization.scale_shape((local, k, n), 1, None), jnp.float32),
            jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32),
            jax.ShapeDtypeStruct((m, n), jnp.bfloat16))
    recorder = _autotune.Recorder()
    with active_table.activated(recorder):  # the calls' keys as they are traced
        jax.eval_shape(lhs_gradient, *args)
    key, call = next((key, call) for key, call in recorder.calls.items()
                     if key.pass_name == "lhs_gradient")
    assert (call.problem.lhs_dtype, call.kernel_problem.lhs_dtype) == ("bfloat16", "float32")
    assert call.kernel_problem.rhs_dtype == "int8"

    def fits(tiling, problem):
        try:
            config.from_tiling(tiling, problem)
        except ValueError:
            return False
        return True

    too_big = next(tiling for tiling in call.space.candidates(call.problem)
                   if not fits(tiling, call.kernel_problem))
    assert call.space.accepts(too_big, call.problem, call.epilogue)
    assert not call.space.accepts(too_big, call.kernel_problem, call.epilogue)
    # The tuner's candidates, its default first, all fit the kernel's tiles.
    assert all(fits(tiling, call.kernel_problem) for tiling in _autotune._candidates(call))

    table = tuning.Tuning({key: tuning.Entry(too_big, too_big, 1.0, 1.0, "test")})
    with table, pytest.warns(UserWarning, match=r"breaks the kernel's rules.*heuristic"):
        exported = _exported(lhs_gradient, *args)
    _check_mosaic_only(exported, 1)


@pytest.mark.parametrize("tiling, dtype, rule", [
    ((32, 64, 64), "bfloat16", "64 rows at a time"),  # block_m, masked in wgmma's layout
    ((64, 64, 32), "float32", "tiled \\[block_n, block_m\\]"),
    ((64, 128, 256, 3), "bfloat16", "shared memory"),  # 278560 bytes with a float32 tile
])
def test_invalid_tgmm_tiling_names_the_rule(tiling, dtype, rule):
    problem = Problem(Kernel.TGMM, 512, 256, 384, 4, 4, dtype, dtype, "float32", False)
    with pytest.raises(ValueError, match=rule):
        config.from_tiling(tiling, problem)


def test_two_programs_per_sm_take_half_the_shared_memory_each():
    """programs_per_sm, the tiling's eighth entry: a tiling names it after an upcast entry,
    which is 0 where upcast does not apply (the same as leaving it out), and round-trips."""
    problem = Problem(Kernel.TGMM, 512, 256, 384, 4, 4, "bfloat16", "bfloat16", "bfloat16",
                      False)
    blocks = config.from_tiling((64, 64, 128, 3, 1, 1, 0, 2), problem)
    assert (blocks.programs_per_sm, blocks.upcast) == (2, None)
    assert blocks.as_tiling() == (64, 64, 128, 3, 1, 1, 0, 2)
    # The heuristic's tiling (4 stages of 32 KiB and a 32 KiB tile) fits a program alone on
    # its SM, not one of two.
    alone = config.from_tiling((64, 128, 128, 4), problem)
    assert shared_memory.needed(alone, problem) > 233472 // 2
    with pytest.raises(ValueError, match="when 2 share an SM"):
        config.from_tiling((*alone.as_tiling(), 1, 1, 0, 2), problem)
    assert config.from_tiling((64, 64, 128, 3, 1, 1, 0), problem) == config.from_tiling(
        (64, 64, 128, 3), problem)


def test_shared_memory_holds_4bit_tiles_packed():
    """Mosaic GPU allocates 4-bit tiles two values to a byte: a pipeline of int4 or e2m1
    weight tiles takes half of an int8 one's bytes, and both have the same converted copies.
    (All 4-bit tuning candidates at Qwen3-MoE's shape, forward and both gradients, lowered for
    cuda under this count, whose limit Mosaic GPU checks there: by hand, 2026-11-29.)"""
    blocks = block_rules.BlockConfig(64, 128, 128, stages=6, upcast=True)

    def needed(rhs_dtype):
        problem = Problem(Kernel.GMM, 8192, 2048, 768, 128, 128, "bfloat16", rhs_dtype,
                          "bfloat16", False)
        return shared_memory.needed(blocks, problem)

    pipeline_rhs_bytes = 6 * 128 * 128
    assert needed("int8") - needed("int4") == pipeline_rhs_bytes // 2
    assert needed("float4_e2m1fn") == needed("int4")


def test_tiles_fitted_to_tiny_problems_keep_every_rule():
    """The heuristic, fitted to problems smaller than any tile (the contract tests' shapes) and
    to a mid-sized one, passes every rule (validate raises on the first it breaks) for each
    kernel and dtype, and the tuning space keeps candidates there besides it, warp-specialized
    ones among them."""
    for kernel, dtype, out in itertools.product(Kernel, ("bfloat16", "float32", "float16"),
                                                ("float32", "bfloat16")):
        for m, k, n in ((20, 24, 6), (8, 16, 8), (512, 256, 384)):
            problem = Problem(kernel, m, k, n, 3, 3, dtype, dtype, out, False)
            config.validate(heuristic.heuristic(problem), problem, "the heuristic's")
            candidates = tuning_space._candidates(problem)
            assert len(candidates) >= 2
            assert any(len(c) == 5 and c[4] == 2 for c in candidates)


@pytest.mark.parametrize("tiling, dtype, kernel, rule", [
    ((64, 64, 128, 4, 1, 1, 1), "bfloat16", Kernel.GMM, "two 8-bit operands of one kind"),
    ((64, 128, 128, 4, 1, 1, 1), "float8_e4m3fn", Kernel.GMM_TRANSPOSED_RHS, "leave it out"),
    ((64, 128, 128, 4, 1, 1, 1), "float8_e4m3fn", Kernel.TGMM, "two 8-bit operands of one kind"),
    ((64, 128, 256, 4, 2, 1, 1), ("bfloat16", "int8"), Kernel.TGMM, "one compute warpgroup"),
    ((64, 128, 128, 4, 1, 1, 2), "float8_e4m3fn", Kernel.GMM, "must be 0 or 1"),
    ((64, 32, 128, 4, 1, 1, 1), ("float32", "int8"), Kernel.GMM, "only after a transpose"),
])
def test_invalid_upcast_names_the_rule(tiling, dtype, kernel, rule):
    lhs_dtype, rhs_dtype = dtype if isinstance(dtype, tuple) else (dtype, dtype)
    problem = Problem(kernel, 512, 256, 384, 4, 4, lhs_dtype, rhs_dtype, "bfloat16", False)
    with pytest.raises(ValueError, match=rule):
        config.from_tiling(tiling, problem)


@pytest.mark.parametrize("name, m, k, n, groups, local, upcast", [
    ("deepseek-v3", 16384, 7168, 2048, 256, 32, True),
    ("qwen3-moe", 8192, 2048, 768, 128, 128, True),
    ("gpt-oss", 8192, 2880, 5760, 128, 128, True),
    ("mixtral", 8192, 4096, 14336, 8, 8, False),
])
def test_fp8_weights_are_upcast_where_their_bytes_bound_the_call(name, m, k, n, groups,
                                                                  local, upcast):
    """By the roofline, fine-grained MoE (64 rows per expert) reads fp8 weights [G, k, n] as
    stored and multiplies float16 conversions, where a copy K-major would move the weights'
    bytes twice more; Mixtral, bound by FLOPs, copies them for 8-bit wgmma at twice the rate.
    The tuner times both for every single-warpgroup tiling."""
    e4m3 = "float8_e4m3fn"
    problem = Problem(Kernel.GMM, m, k, n, groups, local, e4m3, e4m3, "bfloat16", False)
    assert config.from_tiling(None, problem).upcast is upcast
    candidates = tuning_space._candidates(problem)
    assert {c[6] for c in candidates if len(c) == 7} == {0, 1}
    transposed = dataclasses.replace(problem, kernel=Kernel.GMM_TRANSPOSED_RHS)
    assert config.from_tiling(None, transposed).upcast is None
    # No upcast entry chooses anything there: 0 only, holding programs_per_sm's place.
    assert all(len(c) < 7 or (c[6], len(c)) == (0, 8)
               for c in tuning_space._candidates(transposed))
    bf16 = dataclasses.replace(problem, lhs_dtype="bfloat16", rhs_dtype="bfloat16")
    assert config.from_tiling(None, bf16).upcast is None


def test_fp8_contraction_step_is_at_least_one_wgmma():
    with pytest.raises(ValueError, match="contraction step"):
        config.from_tiling((64, 16, 64), _problem(Kernel.GMM, 256, 256, 256, 4,
                                                  "float8_e4m3fn"))


# ---------------------------------------------------------------- lowering for CUDA

MOE_SHAPES = {
    # m, k, n, experts, local experts
    "deepseek_v3": (16384, 7168, 2048, 256, 32),
    "qwen3_moe": (8192, 2048, 768, 128, 128),
    "gpt_oss": (8192, 2880, 5760, 128, 128),
}
FOREIGN = ("__gpu$xla.gpu.triton", "triton_kernel_call", "stablehlo.while")


def _exported(fn, *args):
    if ON_GPU:
        pytest.skip("lowering for cuda from a CPU host: on a GPU the tests above run the kernels")
    return jax.export.export(jax.jit(fn), platforms=["cuda"])(*args)


def _check_mosaic_only(exported, kernels: int, unpadded: bool = False) -> None:
    text = exported.mlir_module()
    assert kernelhub.export.kernels_by_platform(exported) == {"cuda": {"mosaic_gpu": kernels}}
    assert text.count("custom_call @mosaic_gpu_v2(") == kernels
    for foreign in FOREIGN:
        assert foreign not in text
    if unpadded:
        # Dimensions that are multiples of 64 get tiles that divide them: no operand is padded
        # (at GPT-OSS the padding copied the whole weights, or tgmm's whole output).
        assert "stablehlo.pad" not in text


@pytest.mark.parametrize("shape", list(MOE_SHAPES))
def test_exports_for_cuda_with_only_mosaic_kernels(shape):
    """Forward, gradient (d lhs: gmm with the weights transposed; d rhs: tgmm) and tgmm at MoE
    shapes, bf16, jax.export's default checks: each holds the Mosaic GPU kernels and no Triton
    kernel or XLA loop. DeepSeek-V3 runs 32 local experts with a traced group_offset. The
    forward is lowered as a part of the forward with its gradients (its one kernel the first
    of their three: a forward of more kernels, or padded, would show there), not again alone."""
    m, k, n, experts, local = MOE_SHAPES[shape]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    tgmm = kernelhub.get(TGMM, platform="mosaic", backend="gpu")
    lhs = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((experts,), jnp.int32)
    offset = jax.ShapeDtypeStruct((), jnp.int32)

    def with_gradients(lhs, rhs, sizes, offset, d_out):
        out, pullback = jax.vjp(lambda l, r: gmm(l, r, sizes, group_offset=offset), lhs, rhs)
        return out, pullback(d_out)

    def transposed(lhs_t, d_out, sizes, offset):
        return tgmm(lhs_t, d_out, sizes, group_offset=offset, num_actual_groups=local)

    d_out = jax.ShapeDtypeStruct((m, n), jnp.float32)
    exported = _exported(with_gradients, lhs, rhs, sizes, offset, d_out)
    _check_mosaic_only(exported, 3, unpadded=True)
    forward = _kernel_operand_types(exported)[0]
    assert forward[1:3] == [f"tensor<{m}x{k}xbf16>", f"tensor<{local}x{k}x{n}xbf16>"], forward
    _check_mosaic_only(_exported(transposed, jax.ShapeDtypeStruct((k, m), jnp.bfloat16),
                                 jax.ShapeDtypeStruct((m, n), jnp.bfloat16), sizes, offset), 1,
                       unpadded=True)


@pytest.mark.parametrize("shape, upcast, dtype", [
    ("deepseek_v3", True, jnp.float8_e4m3fn), ("mixtral", False, jnp.float8_e4m3fn),
    ("deepseek_v3", True, jnp.int8), ("mixtral", False, jnp.int8)])
def test_8bit_forward_exports_with_the_weights_copied_only_where_bound_by_flops(shape, upcast,
                                                                                dtype):
    """An fp8 or int8 forward (both operands quantized in the call, one scale per row and
    column): one Mosaic GPU kernel; at DeepSeek-V3 it reads the weights [G, k, n] as stored
    (no transpose in the program), at Mixtral's shape it copies them K-major first (for int8
    wgmma with int32 sums)."""
    m, k, n, experts, local = {**MOE_SHAPES, "mixtral": (8192, 4096, 14336, 8, 8)}[shape]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")

    def forward(lhs, rhs, sizes, offset):
        lhs = quantize(lhs, dtype, axis=1)
        rhs = quantize(rhs, dtype, axis=1)
        return gmm(lhs, rhs, sizes, group_offset=offset, preferred_element_type=jnp.bfloat16)

    exported = _exported(forward, jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                         jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16),
                         jax.ShapeDtypeStruct((experts,), jnp.int32),
                         jax.ShapeDtypeStruct((), jnp.int32))
    _check_mosaic_only(exported, 1, unpadded=True)
    assert ("stablehlo.transpose" in exported.mlir_module()) is not upcast


@pytest.mark.parametrize("rhs_dtype, transpose_rhs", [(jnp.int8, False),
                                                      (jnp.float8_e4m3fn, True)])
def test_weight_only_8bit_forward_exports_reading_the_weights_as_stored(rhs_dtype,
                                                                        transpose_rhs):
    """bf16 activations beside 8-bit weights with one scale per column, at DeepSeek-V3's
    shape: one Mosaic GPU kernel, and (the heuristic converting their tiles in shared memory)
    no bf16 copy of the weights in the program, which upcast=0 makes."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    shape = (local, n, k) if transpose_rhs else (local, k, n)
    widened = "tensor<{}xbf16>".format("x".join(map(str, shape)))

    def forward(tiling, lhs, values, scale, sizes, offset):
        rhs = quantization.QuantizedArray(values, scale, axis=2 if transpose_rhs else 1)
        return gmm(lhs, rhs, sizes, group_offset=offset, transpose_rhs=transpose_rhs,
                   tiling=tiling, preferred_element_type=jnp.bfloat16)

    scale_shape = quantization.scale_shape(shape, 2 if transpose_rhs else 1, None)
    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct(shape, rhs_dtype),
            jax.ShapeDtypeStruct(scale_shape, jnp.float32),
            jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
    for tiling, copied in ((None, False), ((64, 64, 128, 4, 1, 1, 0), True)):
        exported = _exported(functools.partial(forward, tiling), *args)
        _check_mosaic_only(exported, 1, unpadded=True)
        assert (widened in exported.mlir_module()) is copied


def test_tgmm_of_8bit_activations_beside_bf16_exports_reading_them_as_stored():
    """tgmm of int8 activations (one scale per row of x^T) beside a bf16 operand (the
    cotangent of a weight gradient) at DeepSeek-V3's shape, one program per SM: one Mosaic GPU
    kernel, and with upcast no bf16 copy of the activations in the program (upcast=0 makes
    one)."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    tgmm = kernelhub.get(TGMM, platform="mosaic", backend="gpu")

    def weight_gradient(tiling, values, scale, d_out, sizes, offset):
        lhs = quantization.QuantizedArray(values, scale, axis=1)
        return tgmm(lhs, d_out, sizes, group_offset=offset, num_actual_groups=local,
                    tiling=tiling)

    args = (jax.ShapeDtypeStruct((k, m), jnp.int8), jax.ShapeDtypeStruct((k, 1), jnp.float32),
            jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
            jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
    for upcast in (1, 0):
        exported = _exported(functools.partial(weight_gradient, (64, 128, 128, 4, 1, 1, upcast)),
                             *args)
        _check_mosaic_only(exported, 1, unpadded=True)
        text = exported.mlir_module()
        copied = f"tensor<{k}x{m}xbf16>" in text or f"tensor<{m}x{k}xbf16>" in text
        assert copied is (upcast == 0)


def _kernel_operand_types(exported) -> list[list[str]]:
    """The operand types of each Mosaic GPU kernel in the program, in order."""
    calls = [line for line in exported.mlir_module().splitlines()
             if "custom_call @mosaic_gpu_v2(" in line]
    return [re.findall(r"tensor<[^>]*>", call.rsplit(" : ", 1)[-1].split("->")[0])
            for call in calls]


@pytest.mark.parametrize("dtype, block_size, transpose_rhs", [
    (jnp.int4, None, False), (jnp.int4, 128, False), (jnp.float4_e2m1fn, None, True)])
def test_four_bit_weights_export_read_as_stored(dtype, block_size, transpose_rhs):
    """bf16 activations beside 4-bit weights (int4 per column and in 128-blocks along k, e2m1
    per column [G, n, k]) at DeepSeek-V3's shape: the forward's one Mosaic GPU kernel reads the
    4-bit weights as stored (e2m1 as its uint4 codes: Hopper converts no e2m1 value, so the
    kernel builds float16 bits from them), and no op of the program widens them. The lhs
    gradient of int4 weights [G, k, n] reads them as stored too, beside the float32 cotangent
    (the 128-blocks' scales along its output columns scaling its lhs tiles); weights [G, n, k],
    which float32 wgmma would read transposed there, are widened first, as 8-bit ones are."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    shape = (local, n, k) if transpose_rhs else (local, k, n)
    stored = "x".join(map(str, shape)) + ("xi4" if dtype == jnp.int4 else "xui4")

    def forward(lhs, rhs, sizes, offset):
        weights = quantize(rhs, dtype, axis=2 if transpose_rhs else 1, block_size=block_size)
        return gmm(lhs, weights, sizes, group_offset=offset, transpose_rhs=transpose_rhs,
                   preferred_element_type=jnp.bfloat16)

    def lhs_gradient(lhs, rhs, sizes, offset, d_out):
        return jax.vjp(lambda x: forward(x, rhs, sizes, offset), lhs)[1](d_out)

    args = [jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct(shape, jnp.bfloat16),
            jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)]
    exported = _exported(forward, *args)
    # (quantize's own blocks reshape through a pad of nothing: no kernel operand is padded.)
    _check_mosaic_only(exported, 1, unpadded=block_size is None)
    (operands,) = _kernel_operand_types(exported)
    assert operands[1:3] == [f"tensor<{m}x{k}xbf16>", f"tensor<{stored}>"], operands
    whole = re.escape(stored[:-len(stored.rsplit("x", 1)[-1])])
    assert not re.findall(r"stablehlo\.convert [^\n]*\(tensor<" + whole + r"(?:i4|ui4|f4E2M1FN)>"
                          r"\) -> tensor<[^>]*x(?:bf16|f16|f32)>", exported.mlir_module())
    if not transpose_rhs:
        exported = _exported(lhs_gradient, *args, jax.ShapeDtypeStruct((m, n), jnp.bfloat16))
        # Beside the forward's kernel (and a weight gradient's of the bf16 rhs the weights are
        # quantized from), the lhs gradient's: the float32 cotangent and the 4-bit weights.
        cotangent = f"tensor<{m}x{n}xf32>"
        (gradient,) = [t for t in _kernel_operand_types(exported) if t[1] == cotangent]
        assert gradient[2] == f"tensor<{stored}>", gradient


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.float4_e2m1fn])
def test_weight_gradient_of_4bit_activations_exports_reading_them_as_stored(dtype):
    """The weight gradient of a call on 4-bit activations (one scale per row, folded into the
    float32 cotangent) at DeepSeek-V3's shape: its tgmm kernel reads the activations [k, m] at
    4 bits (int4, or e2m1's uint4 codes), beside the cotangent K-major in float32, their tiles
    converted per chunk."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    stored = "xi4" if dtype == jnp.int4 else "xui4"

    def weight_gradient(lhs, rhs, sizes, offset, d_out):
        def forward(rhs):
            return gmm(quantize(lhs, dtype, axis=1), rhs, sizes, group_offset=offset,
                       preferred_element_type=jnp.bfloat16)

        return jax.vjp(forward, rhs)[1](d_out)

    exported = _exported(weight_gradient, jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                         jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16),
                         jax.ShapeDtypeStruct((experts,), jnp.int32),
                         jax.ShapeDtypeStruct((), jnp.int32),
                         jax.ShapeDtypeStruct((m, n), jnp.bfloat16))
    _check_mosaic_only(exported, 2)  # and the gradient of the activations, a bf16 gmm
    tgmm_operands = [types for types in _kernel_operand_types(exported)
                     if types[1] == f"tensor<{k}x{m}{stored}>"]
    assert len(tgmm_operands) == 1, _kernel_operand_types(exported)
    assert tgmm_operands[0][2] == f"tensor<{n}x{m}xf32>", tgmm_operands


def test_converted_weight_tiles_keep_64_rows():
    """A tile converted in shared memory (the tiling's upcast) needs 64 rows or more: Mosaic
    GPU's layout inference finds no layout for converting fewer (lowering MXFP8's 32-blocks
    along k of weights [G, k, n], whose tiles have block_k = 32 rows, failed). The heuristic
    widens such weights first instead, and so does a tiling with upcast=1 whose block_k the
    blocks cut to 32, which lowers; a tiling itself naming block_k = 32 with upcast=1 is a
    ValueError naming the rows; weights [G, n, k] (tiles of block_n rows) convert."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")

    def forward(tiling, transpose_rhs, lhs, rhs, sizes):
        weights = quantize(rhs, "mxfp8", axis=2 if transpose_rhs else 1)
        return gmm(lhs, weights, sizes, tiling=tiling, transpose_rhs=transpose_rhs,
                   preferred_element_type=jnp.bfloat16)

    args = [jax.ShapeDtypeStruct((m, k), jnp.bfloat16), None,
            jax.ShapeDtypeStruct((local,), jnp.int32)]
    for transpose_rhs in (False, True):
        args[1] = jax.ShapeDtypeStruct((local, n, k) if transpose_rhs else (local, k, n),
                                       jnp.bfloat16)
        _check_mosaic_only(_exported(functools.partial(forward, None, transpose_rhs), *args), 1)
    _check_mosaic_only(_exported(functools.partial(forward, (64, 64, 64, 4, 1, 1, 1), True),
                                 *args), 1)
    args[1] = jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16)
    _check_mosaic_only(_exported(functools.partial(forward, (64, 64, 64, 4, 1, 1, 1), False),
                                 *args), 1)
    with pytest.raises(ValueError, match="tiles it converts have 32 rows"):
        _exported(functools.partial(forward, (64, 32, 64, 4, 1, 1, 1), False), *args)


def test_gradients_of_an_int8_call_export_reading_the_int8_values_as_stored():
    """The gradients of an int8 call at DeepSeek-V3's shape: the lhs gradient's kernel reads
    the int8 weights [G, k, n] themselves and the weight gradient's the int8 activations
    (transposed at one byte), each beside the float32 cotangent the kit folds the scales into,
    their tiles converted to float32 in shared memory; with upcast=0 (the control) both read
    float32 copies, four times the bytes."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")

    def gradients(tiling, lhs, rhs, d_out, sizes, offset):
        def loss(lhs, rhs):
            out = gmm(quantize(lhs, jnp.int8, axis=1), quantize(rhs, jnp.int8, axis=1), sizes,
                      group_offset=offset, tiling=tiling, preferred_element_type=jnp.bfloat16)
            return jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1))(lhs, rhs)

    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16),
            jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
            jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
    widened = {"lhs_gradient": (64, 32, 128, 4, 1, 1, 0),
               "rhs_gradient": (64, 128, 128, 2, 1, 1, 0)}
    for tiling, values in ((None, "i8"), (widened, "f32")):
        exported = _exported(functools.partial(gradients, tiling), *args)
        _check_mosaic_only(exported, 2, unpadded=True)
        lhs_gradient, rhs_gradient = _kernel_operand_types(exported)
        assert f"tensor<{local}x{k}x{n}x{values}>" in lhs_gradient
        assert f"tensor<{m}x{n}xf32>" in lhs_gradient
        assert f"tensor<{k}x{m}x{values}>" in rhs_gradient


def test_scale_blocks_export_with_the_values_as_stored():
    """DeepSeek-V3's forward with e4m3 1x128 activation and 128 x 1 weight blocks lowers for
    cuda to one Mosaic GPU kernel that reads both e4m3 arrays as stored, beside one float32
    scale vector per k step ([k / 128, m] and [G, k / 128, n]), the weights [G, k, n]
    converted per tile (the heuristic's upcast; e4m3 wgmma on weights copied K-major, upcast=0,
    lowers too: by hand). Its gradients' kernels read the e4m3 values as stored too."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")

    def forward(tiling, lhs, rhs, sizes, offset):
        return gmm(quantize(lhs, jnp.float8_e4m3fn, axis=1, block_size=128),
                   quantize(rhs, jnp.float8_e4m3fn, axis=1, block_size=128), sizes,
                   group_offset=offset, tiling=tiling, preferred_element_type=jnp.bfloat16)

    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16),
            jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
    exported = _exported(functools.partial(forward, None), *args)
    _check_mosaic_only(exported, 1)
    (operands,) = _kernel_operand_types(exported)
    assert operands[1:] == [f"tensor<{m}x{k}xf8E4M3FN>", f"tensor<{local}x{k}x{n}xf8E4M3FN>",
                            f"tensor<{k // 128}x{m}xf32>", f"tensor<{local}x{k // 128}x{n}xf32>"]

    # The gradients read the e4m3 values as stored too, each beside the float32 cotangent and
    # the blocked operand's scales for its output tiles.
    def gradients(lhs, rhs, d_out, sizes, offset):
        def loss(lhs, rhs):
            return jnp.sum(forward(None, lhs, rhs, sizes, offset).astype(jnp.float32)
                           * d_out.astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1))(lhs, rhs)

    exported = _exported(gradients, args[0], args[1],
                         jax.ShapeDtypeStruct((m, n), jnp.bfloat16), *args[2:])
    _check_mosaic_only(exported, 2)
    lhs_gradient, rhs_gradient = _kernel_operand_types(exported)
    assert lhs_gradient[1:] == [f"tensor<{m}x{n}xf32>", f"tensor<{local}x{k}x{n}xf8E4M3FN>",
                                f"tensor<{local}x{k // 128}x{n}xf32>"]
    assert rhs_gradient[1:] == [f"tensor<{k}x{m}xf8E4M3FN>", f"tensor<{n}x{m}xf32>",
                                f"tensor<{k // 128}x{m}xf32>"]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn, jnp.int8])
def test_tgmm_over_group_spans_exports_for_cuda(dtype):
    """group_span=8 at DeepSeek-V3's shape (32 local experts, a traced group_offset): one
    Mosaic GPU kernel, no padding. fp8 and int8 too: their masks select through float16 (an
    8-bit select does not lower), and int8's running sum is int32."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    tgmm = kernelhub.get(TGMM, platform="mosaic", backend="gpu")

    def transposed(lhs_t, d_out, sizes, offset):
        # One 128-byte row of summed rows per step.
        rows = 128 // jnp.dtype(dtype).itemsize
        return tgmm(lhs_t, d_out, sizes, group_offset=offset, num_actual_groups=local,
                    tiling=(rows, 128, 128, 4, 1, 8))

    _check_mosaic_only(_exported(transposed, jax.ShapeDtypeStruct((k, m), dtype),
                                 jax.ShapeDtypeStruct((m, n), dtype),
                                 jax.ShapeDtypeStruct((experts,), jnp.int32),
                                 jax.ShapeDtypeStruct((), jnp.int32)), 1, unpadded=True)


def _covering(candidates: list[tuple]) -> list[tuple]:
    """Tilings from `candidates` until each number of programs per SM and each block shape
    (block_m, block_k, block_n) among them is taken, the one taking the most not yet taken
    first."""
    def parts(tiling):
        return {("programs", tiling[7]), ("blocks", tiling[:3])}

    left, taken, chosen = set().union(*map(parts, candidates)), list(candidates), []
    while left:
        best = max(taken, key=lambda tiling: len(parts(tiling) & left))
        chosen.append(best)
        left -= parts(best)
        taken.remove(best)
    return chosen


@pytest.mark.parametrize("kernel", [Kernel.GMM, Kernel.GMM_TRANSPOSED_RHS, Kernel.TGMM])
def test_shared_sm_candidates_export_for_cuda(kernel):
    """The tuning candidates with programs sharing an SM (two to four) at DeepSeek-V3's shape
    (bf16 in and out, a traced group_offset) lower to one Mosaic GPU kernel without padding,
    so that the next GPU tune times them all: each number of programs per SM and each block
    shape among them. The others differ from those only in their stages, or pair a number of
    programs with a block shape each lowered here (and the tuning space keeps only tilings
    whose stages config.from_tiling fits in the SM's shared memory)."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    bf16 = jnp.bfloat16
    problem = Problem(kernel, m, k, n, experts, local, "bfloat16", "bfloat16", "bfloat16",
                      False)
    call = kernelhub.get(TGMM if kernel is Kernel.TGMM else GMM, platform="mosaic",
                         backend="gpu")
    shapes = {Kernel.GMM: ((m, k), (local, k, n)),
              Kernel.GMM_TRANSPOSED_RHS: ((m, n), (local, k, n)),
              Kernel.TGMM: ((k, m), (m, n))}[kernel]
    candidates = [c for c in tuning_space._candidates(problem) if len(c) == 8 and c[7] > 1]
    assert {c[7] for c in candidates} == {2, 3, 4}
    for tiling in _covering(candidates):
        def one_pass(lhs, rhs, sizes, offset, tiling=tiling):
            if kernel is Kernel.TGMM:
                return call(lhs, rhs, sizes, group_offset=offset, num_actual_groups=local,
                            preferred_element_type=bf16, tiling=tiling)
            return call(lhs, rhs, sizes, group_offset=offset, preferred_element_type=bf16,
                        transpose_rhs=kernel is Kernel.GMM_TRANSPOSED_RHS, tiling=tiling)

        _check_mosaic_only(_exported(one_pass, *(jax.ShapeDtypeStruct(s, bf16) for s in shapes),
                                     jax.ShapeDtypeStruct((experts,), jnp.int32),
                                     jax.ShapeDtypeStruct((), jnp.int32)), 1, unpadded=True)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_exports_for_cuda_at_shapes_smaller_than_a_tile(dtype):
    """The contract tests' tiny shapes (20 x 24 x 6: every block fitted down to its least), a
    forward with existing_out and a traced group_offset and its gradients, both weight
    layouts (float32's alike): Mosaic GPU's layout inference takes tgmm's masks in wgmma's
    layout (64-row tiles) and the kernels fit shared memory. (The first H100 run found both
    broken.)"""
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    m, k, n, groups = 20, 24, 6, 3
    sizes = jax.ShapeDtypeStruct((groups,), jnp.int32)
    # float32 wgmma reads both tiles K-major: float32 weights [G, k, n] are copied to [G, n, k]
    # first, so both layouts lower the same three kernels, and float32 takes [G, k, n] only.
    for transpose_rhs in (False, True) if dtype == jnp.bfloat16 else (False,):
        def with_gradients(lhs, rhs, existing, offset, sizes, transpose_rhs=transpose_rhs):
            out, pullback = jax.vjp(
                lambda l, r, e: gmm(l, r, sizes, group_offset=offset, existing_out=e,
                                    transpose_rhs=transpose_rhs), lhs, rhs, existing)
            return out, pullback(out)

        weights = (groups - 1, n, k) if transpose_rhs else (groups - 1, k, n)
        _check_mosaic_only(_exported(
            with_gradients, jax.ShapeDtypeStruct((m, k), dtype),
            jax.ShapeDtypeStruct(weights, dtype), jax.ShapeDtypeStruct((m, n), jnp.float32),
            jax.ShapeDtypeStruct((), jnp.int32), sizes), 3)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int4, jnp.float4_e2m1fn])
def test_narrow_weights_export_for_cuda_at_shapes_smaller_than_a_tile(dtype):
    """bf16 activations beside 8-bit or 4-bit weights with one scale per column at the contract
    tests' tiny shape, both weight layouts, a float32 output, with its gradients; and tgmm of
    such activations: every kernel lowers. The heuristic converts such tiles in shared memory
    only where they keep the rules conversion takes (block_rules.conversion_problem: 64 rows, and
    32 values along a 4-bit tile's minor axis), else widens the operand first: at this shape
    weights [G, n, k] have tiles of 32 rows (int8 and e4m3 ones failed to lower, "Layout
    inference failed") and 4-bit tiles 16 values along k ("async_copy requires all GMEM strides
    except the last one to be a multiple of 16 bytes")."""
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    tgmm = kernelhub.get(TGMM, platform="mosaic", backend="gpu")
    m, k, n, groups = 20, 24, 6, 3
    sizes = jax.ShapeDtypeStruct((groups,), jnp.int32)
    for transpose_rhs in (False, True):
        def with_gradient(lhs, rhs, sizes, transpose_rhs=transpose_rhs):
            weights = quantize(rhs, dtype, axis=2 if transpose_rhs else 1)
            out, pullback = jax.vjp(
                lambda l: gmm(l, weights, sizes, transpose_rhs=transpose_rhs), lhs)
            return out, pullback(out)

        shape = (groups, n, k) if transpose_rhs else (groups, k, n)
        _check_mosaic_only(_exported(
            with_gradient, jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct(shape, jnp.bfloat16), sizes), 3)
    _check_mosaic_only(_exported(
        lambda lhs, rhs, sizes: tgmm(quantize(lhs, dtype, axis=1), rhs, sizes),
        jax.ShapeDtypeStruct((k, m), jnp.bfloat16), jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        sizes), 1)


@pytest.mark.skipif(ON_GPU, reason="a CPU host's check: on a GPU the kernels run compiled")
def test_every_interpreted_kernel_call_is_lowered_for_cuda_after_its_test():
    """tests/lowered_twins.py, which the whole suite's interpreted calls go through: a forward and
    its gradients interpreted here note three kernel calls (each with its shapes, dtypes and
    static arguments), each lowered for cuda to a Mosaic GPU kernel once, however often it
    ran; a call that lowers to no Mosaic GPU kernel is reported with its arguments."""
    import lowered_twins

    # forward, lhs gradient (gmm again), weight gradient
    assert lowered_twins.lowered_for_a_forward_with_gradients("mosaic") == (3, [])
    twins = lowered_twins.TWINS

    def not_a_kernel(lhs, scale, *, interpret):
        return lhs * scale

    call = lowered_twins.KernelCall(not_a_kernel, "mosaic_gpu", "cuda",
                                    jax.tree.structure(((0, 0), {})),
                                    (jax.ShapeDtypeStruct((4, 8), jnp.float32), 2.0), False)
    twins.note(call)
    twins.note(call)
    assert twins.lower() == [
        "mosaic_gpu not_a_kernel(float32[4, 8], 2.0): lowered with no mosaic_gpu kernel"]


def test_forward_with_fills_spread_exports_for_cuda(monkeypatch):
    """The profile's spread-fills forward (visits.SPREAD_FILLS) at DeepSeek-V3's shard lowers
    to one Mosaic GPU kernel and nothing else of ours, another program than the row-ordered
    one (the spread order is computed by XLA before the kernel)."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16),
            jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
    texts = []
    for spread in (False, True):
        jax.clear_caches()
        monkeypatch.setattr(visits, "SPREAD_FILLS", spread)
        try:
            exported = _exported(lambda lhs, rhs, sizes, offset: gmm(
                lhs, rhs, sizes, group_offset=offset, preferred_element_type=jnp.bfloat16),
                *args)
        finally:
            jax.clear_caches()
        _check_mosaic_only(exported, 1, unpadded=True)
        texts.append(exported.mlir_module())
    assert [text.count("stablehlo.sort") for text in texts] == [0, 1]


def test_warp_specialized_gmm_exports_for_cuda():
    """compute_warpgroups=2 at Qwen3-MoE's shape: three warpgroups a program; the forward with
    bf16 weights in both layouts, and fp8 (K-major: a transposed view of each warpgroup's
    half of the weight tile) with a gated unit's two weight tiles a step. Then Mixtral's
    forward with the contract's float32 output under the heuristic: a 128 x 256 tile stored
    from 64-row pieces of the accumulators (shared_memory.output_tile_rows); and its gated unit."""
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    m, k, n, experts = 8192, 2048, 768, 128
    sizes = jax.ShapeDtypeStruct((experts,), jnp.int32)
    for transpose_rhs in (False, True):
        weights = (experts, n, k) if transpose_rhs else (experts, k, n)
        exported = _exported(
            lambda lhs, rhs, sizes, t=transpose_rhs: gmm(
                lhs, rhs, sizes, tiling=(64, 64, 256, 4, 2), transpose_rhs=t,
                preferred_element_type=jnp.bfloat16),
            jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct(weights, jnp.bfloat16), sizes)
        _check_mosaic_only(exported, 1)
    fp8 = jnp.float8_e4m3fn
    _check_mosaic_only(_exported(
        lambda lhs, rhs, sizes: gmm(lhs, rhs, sizes, tiling=(64, 128, 128, 3, 2), glu="silu",
                                    transpose_rhs=True, preferred_element_type=jnp.bfloat16),
        jax.ShapeDtypeStruct((m, k), fp8), jax.ShapeDtypeStruct((experts, 2 * n, k), fp8),
        sizes), 1)
    m, k, n, experts = 8192, 4096, 14336, 8
    problem = Problem(Kernel.GMM, m, k, n, experts, experts, "bfloat16", "bfloat16",
                      "float32", False)
    blocks = heuristic.heuristic(problem)
    assert (blocks.as_tiling(), shared_memory.output_tile_rows(blocks, problem)) == (
        (128, 64, 256, 3, 2), 64)
    _check_mosaic_only(_exported(
        gmm, jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
        jax.ShapeDtypeStruct((experts, k, n), jnp.bfloat16),
        jax.ShapeDtypeStruct((experts,), jnp.int32)), 1, unpadded=True)
    # Its fused gate and up projection under the heuristic: 128 x 128 tiles, each compute
    # warpgroup two 128 x 64 sums.
    _check_mosaic_only(_exported(
        lambda lhs, rhs, sizes: gmm(lhs, rhs, sizes, glu="silu",
                                    preferred_element_type=jnp.bfloat16),
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
        jax.ShapeDtypeStruct((experts, k, 2 * n), jnp.bfloat16),
        jax.ShapeDtypeStruct((experts,), jnp.int32)), 1, unpadded=True)


def test_warp_specialized_tgmm_exports_for_cuda():
    """The heuristic's weight gradient at Mixtral's shape (compute-bound): two compute
    warpgroups of a 128 x 256 tile, bf16 (lhs read [m, k], each warpgroup's B a column half of
    the rhs tile; a bf16 output, and a float32 one stored in 64-row pieces) and fp8 (both read
    K-major: each warpgroup's B a transposed view of its rows of the [n, m] tile), one Mosaic
    GPU kernel each."""
    tgmm = kernelhub.get(TGMM, platform="mosaic", backend="gpu")
    m, k, n, experts = 8192, 4096, 14336, 8
    sizes = jax.ShapeDtypeStruct((experts,), jnp.int32)
    for dtype, tiling, out in ((jnp.bfloat16, None, jnp.bfloat16),
                               (jnp.bfloat16, None, jnp.float32),
                               (jnp.float8_e4m3fn, (128, 128, 256, 3, 2), jnp.bfloat16)):
        if tiling is None:
            problem = Problem(Kernel.TGMM, m, k, n, experts, experts, "bfloat16", "bfloat16",
                              jnp.dtype(out).name, False)
            blocks = heuristic.heuristic(problem)
            assert blocks.compute_warpgroups == 2
            # A float32 output's 128-row tiles stored in 64-row pieces.
            assert shared_memory.output_tile_rows(blocks, problem) == (
                64 if out == jnp.float32 else 128)
        _check_mosaic_only(_exported(
            lambda lhs, rhs, sizes, tiling=tiling, out=out: tgmm(
                lhs, rhs, sizes, tiling=tiling, preferred_element_type=out),
            jax.ShapeDtypeStruct((k, m), dtype), jax.ShapeDtypeStruct((m, n), dtype), sizes),
            1, unpadded=True)


@pytest.mark.parametrize("epilogue", [{"activation": "gelu"},
                                      {"glu": "swiglu_oai", "glu_layout": "interleaved"}])
def test_fused_epilogues_export_for_cuda(epilogue):
    """Mosaic GPU's layout inference takes the epilogue on the accumulator: gelu's erf (a
    polynomial: jax 0.10.2 has no layout rule for math.erf) after a bias, GPT-OSS's gate."""
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    columns = 512 * (2 if "glu" in epilogue else 1)
    lhs = jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((8, 256, columns), jnp.bfloat16)
    bias = jax.ShapeDtypeStruct((8, columns), jnp.float32)
    sizes = jax.ShapeDtypeStruct((8,), jnp.int32)
    _check_mosaic_only(_exported(
        lambda lhs, rhs, bias, sizes: gmm(lhs, rhs, sizes, bias=bias,
                                          preferred_element_type=jnp.bfloat16, **epilogue),
        lhs, rhs, bias, sizes), 1)


def test_interleaved_gate_up_stored_gnk_is_read_in_place():
    """Interleaved gate and up weights stored [G, 2n, k] (GPT-OSS's checkpoints: gate row j,
    then up row j) are the rows of a [G, n, 2k] view, the gate's k values then the up's: both
    halves' tiles are read from it, with no copy of the weights ([G, k, 2n] are still gathered
    into the concatenated layout). Unaligned k and n (the weights padded along k, then the
    view's rows), a bias, local groups 1..3 of 4 (one empty) with existing_out's other rows
    kept bitwise, one compute warpgroup and two, against float64. Then exported for cuda at
    GPT-OSS's shape and Mixtral's (warp-specialized) under the heuristic: one Mosaic GPU
    kernel reading the weights argument itself (a reshape), nothing padded."""
    rng = np.random.default_rng(34)
    m, k, n = 90, 40, 40
    sizes = np.array([10, 30, 0, 25], np.int32)  # local rows 10..65
    lhs = _values(rng, (m, k), jnp.bfloat16)
    gate_up = _values(rng, (3, 2 * n, k), jnp.bfloat16)
    bias = _values(rng, (3, 2 * n), jnp.float32)
    existing = _values(rng, (m, n), jnp.float32)
    expected = reference.gmm(lhs, gate_up, sizes, bias=bias, glu="swiglu_oai",
                             glu_layout="interleaved", transpose_rhs=True, group_offset=1,
                             existing_out=existing)
    kept = np.r_[0:10, 65:m]
    for tiling in (None, (64, 32, 128, 2, 2)):
        out = _mosaic(GMM)(lhs, gate_up, jnp.asarray(sizes), bias=bias, glu="swiglu_oai",
                           glu_layout="interleaved", transpose_rhs=True, tiling=tiling,
                           group_offset=jnp.int32(1), existing_out=existing)
        assert_close(out, expected, jnp.float32, contraction=k)
        np.testing.assert_array_equal(np.asarray(out)[kept], np.asarray(existing)[kept])

    # GPT-OSS's shape, and Mixtral's, whose heuristic warp-specializes (compute-bound).
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    for m, k, n, experts in (MOE_SHAPES["gpt_oss"][:4], (8192, 4096, 2 * 14336, 8)):
        weights = f"tensor<{experts}x{n}x{k}xbf16>"
        exported = _exported(
            lambda lhs, rhs, bias, sizes: gmm(lhs, rhs, sizes, bias=bias, glu="swiglu_oai",
                                              glu_layout="interleaved", transpose_rhs=True,
                                              preferred_element_type=jnp.bfloat16),
            jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((experts, n, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((experts, n), jnp.float32),
            jax.ShapeDtypeStruct((experts,), jnp.int32))
        _check_mosaic_only(exported, 1, unpadded=True)
        _check_read_in_place(exported, weights)


@pytest.mark.parametrize("dtype, glu_layout, transpose_rhs", [
    (jnp.float4_e2m1fn, "interleaved", True), (jnp.int4, "concatenated", False)])
def test_gated_unit_on_4bit_weights_converted_per_tile(dtype, glu_layout, transpose_rhs):
    """Gate and up weights of 4-bit values with one scale per column under a gated unit with a
    bias: e2m1 interleaved [G, 2n, k] (GPT-OSS's layout, its uint4 codes read in place as the
    rows of a [G, n, 2k] view) and int4 concatenated [G, k, 2n], each step's 4-bit tiles
    converted in shared memory (upcast), against float64 of the dequantized weights; rows past
    the sum exactly 0."""
    rng = np.random.default_rng(35)
    m, k, n = 72, 128, 64
    sizes = np.array([20, 0, 40], np.int32)  # rows 60.. past the sum
    lhs = _values(rng, (m, k), jnp.bfloat16)
    shape = (3, 2 * n, k) if transpose_rhs else (3, k, 2 * n)
    gate_up = quantized_operand(_values(rng, shape, jnp.float32), dtype,
                                axis=2 if transpose_rhs else 1)
    bias = _values(rng, (3, 2 * n), jnp.float32)
    expected = reference.gmm(lhs, as_float64(gate_up), sizes, bias=bias, glu="silu",
                             glu_layout=glu_layout, transpose_rhs=transpose_rhs)
    out = _mosaic(GMM)(lhs, gate_up, jnp.asarray(sizes), bias=bias, glu="silu",
                       glu_layout=glu_layout, transpose_rhs=transpose_rhs,
                       tiling=(64, 64, 64, 2, 1, 1, 1))
    assert_close(out, expected, jnp.float32, contraction=k)
    np.testing.assert_array_equal(np.asarray(out)[60:], 0.0)


def _check_read_in_place(exported, weights: str) -> None:
    """The array of MLIR type `weights` reaches the kernel as it is (or reshaped): nothing else
    reads it (no slice, gather or concatenation making a copy)."""
    reads = [line for line in exported.mlir_module().splitlines() if weights in line]
    assert reads and all(re.search(r"func\.func|= call @|return |stablehlo\.reshape|"
                                   r"@mosaic_gpu_v2", line) for line in reads), reads


def test_a_gated_unit_tiles_each_half_of_the_weights():
    """A gated unit pads each half of the weights' columns to whole tiles, so its tiles divide
    the output's columns, half the weights': at GPT-OSS's 2 x 2880 the heuristic takes 64
    columns (exported for cuda: the weights reach the kernel uncopied), and a table's 128
    (which divides 5760, so the plain call it was timed for pads nothing) is passed over for
    the gated call, whose weights it would copy. The tables time interleaved weights only
    where the kernel reads them in place, stored [G, 2n, k]."""
    m, k, n, experts, _ = MOE_SHAPES["gpt_oss"]
    problem = Problem(Kernel.GMM, m, k, n, experts, experts, "bfloat16", "bfloat16",
                      "bfloat16", False)
    gated = config.from_tiling(None, problem, weight_tiles=2)
    assert (n // 2) % gated.block_n == 0 and gated.block_n == 64
    # Concatenated halves [G, k, 2n] reach the kernel as they are (each half whole tiles).
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    exported = _exported(
        lambda lhs, rhs, sizes: gmm(lhs, rhs, sizes, glu="silu",
                                    preferred_element_type=jnp.bfloat16),
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
        jax.ShapeDtypeStruct((experts, k, n), jnp.bfloat16),
        jax.ShapeDtypeStruct((experts,), jnp.int32))
    _check_mosaic_only(exported, 1, unpadded=True)
    _check_read_in_place(exported, f"tensor<{experts}x{k}x{n}xbf16>")
    space = tuning_space.space("mosaic")
    swiglu = Epilogue(glu="swiglu_oai")
    for tiling, plain, gate in (((64, 64, 128, 4), True, False), ((64, 64, 64, 4), True, True)):
        assert space.accepts(tiling, problem, Epilogue()) == plain
        assert space.accepts(tiling, problem, swiglu) == gate
    interleaved = Epilogue(glu="swiglu_oai", glu_layout="interleaved")
    assert space.times_epilogue(interleaved, True)
    assert not space.times_epilogue(interleaved, False)
    assert space.times_epilogue(swiglu, False)


def test_compiled_rows_are_padded_to_a_multiple_of_8_only():
    """A serving batch's rows are rarely a multiple of the 64- or 128-row tiles: compiled, gmm
    pads them only to a multiple of 8 (Mosaic GPU cuts rows in groups of 8; TMA fills a tile's
    reads past the last row with zeros, and only rows below m are stored), and so does bf16
    tgmm (its chunks sum only their group's rows). So at DeepSeek-V3's shape with 16008 rows
    the activations reach the kernels and the output leaves them uncopied: the forward and the
    training step's three kernels; at 16003 rows they are padded to 16008 (the forward's
    output sliced back). (Interpreted, rows are padded to
    whole tiles: the cases here with unaligned m check the values, and the GPU run checks them
    compiled.)"""
    _, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    for m, copies in ((16008, 0), (16003, 1)):
        def forward(lhs, rhs, sizes, offset):
            return gmm(lhs, rhs, sizes, group_offset=offset, preferred_element_type=jnp.bfloat16)

        def training(lhs, rhs, sizes, offset):
            out, pullback = jax.vjp(lambda a, b: forward(a, b, sizes, offset), lhs, rhs)
            return pullback(out)

        arguments = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                     jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16),
                     jax.ShapeDtypeStruct((experts,), jnp.int32),
                     jax.ShapeDtypeStruct((), jnp.int32))
        exported = _exported(forward, *arguments)
        _check_mosaic_only(exported, 1)
        text = exported.mlir_module()
        assert text.count("stablehlo.pad") == copies, m
        assert len(re.findall(rf"stablehlo\.slice .*-> tensor<{m}x", text)) == copies, m
        stepped = _exported(training, *arguments)
        _check_mosaic_only(stepped, 3)
        assert ("stablehlo.pad" in stepped.mlir_module()) == bool(copies), m
        if not copies:
            _check_read_in_place(exported, f"tensor<{m}x{k}xbf16>")


# 17 experts of 16384 x 8192: 2.3e9 elements, past int32's range; the last expert's weights (or
# weight gradient) start 2.1e9 elements in.
HUGE = (17, 16384, 8192)


def test_operands_of_2_31_elements_or_more_export_for_cuda():
    """Weights of HUGE's 2.3e9 elements, bf16, int8 and int4 beside bf16 activations, in both
    layouts, and tgmm's weight gradient of as many: each lowers to one Mosaic GPU kernel (TMA
    addresses a tile by its coordinates along each axis, each far below 2^31; the GPU run
    checks the values: test_operands_of_2_31_elements_or_more)."""
    experts, k, n = HUGE
    m = 4096
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")
    tgmm = kernelhub.get(TGMM, platform="mosaic", backend="gpu")
    lhs = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((experts,), jnp.int32)
    for transpose_rhs in (False, True):
        shape = (experts, n, k) if transpose_rhs else HUGE
        axis = 2 if transpose_rhs else 1
        scale = tuple(1 if a == axis else d for a, d in enumerate(shape))
        _check_mosaic_only(_exported(
            lambda lhs, rhs, sizes, t=transpose_rhs: gmm(lhs, rhs, sizes, transpose_rhs=t),
            lhs, jax.ShapeDtypeStruct(shape, jnp.bfloat16), sizes), 1)
        for dtype in (jnp.int8, jnp.int4):
            _check_mosaic_only(_exported(
                lambda lhs, values, scale, sizes, t=transpose_rhs, axis=axis: gmm(
                    lhs, kernelhub.QuantizedArray(values, scale, axis=axis), sizes,
                    transpose_rhs=t),
                lhs, jax.ShapeDtypeStruct(shape, dtype),
                jax.ShapeDtypeStruct(scale, jnp.float32), sizes), 1)
    _check_mosaic_only(_exported(
        lambda lhs, d_out, sizes: tgmm(lhs.T, d_out, sizes,
                                       preferred_element_type=jnp.bfloat16),
        lhs, jax.ShapeDtypeStruct((m, n), jnp.bfloat16), sizes), 1)


@GPU_RUN_ONLY
def test_operands_of_2_31_elements_or_more():
    """int8 and int4 weights of HUGE's 2.3e9 elements beside bf16 activations whose rows all
    belong to the last expert, whose weights start 2.1e9 elements in (int4's 1.05e9 bytes);
    then tgmm's bf16 weight gradient of those rows, as many elements, the last expert's block
    as far in and the empty experts' blocks zeros. Against float64 of the values read back."""
    experts, k, n = HUGE
    m = 64
    rng = np.random.default_rng(35)
    scale = jnp.full((experts, 1, n), 1 / 64, jnp.float32)
    lhs = _values(rng, (m, k), jnp.bfloat16)
    sizes = jnp.asarray([0] * (experts - 1) + [m], jnp.int32)
    for dtype, bound in ((jnp.int8, 128), (jnp.int4, 8)):
        values = jax.random.randint(jax.random.key(35), HUGE, 1 - bound, bound,
                                    jnp.int8).astype(dtype)
        out = _mosaic(GMM)(lhs, kernelhub.QuantizedArray(values, scale, axis=1), sizes)
        last = np.asarray(values[-1].astype(jnp.int8), np.float64) / 64
        assert_close(out, np.asarray(lhs, np.float64) @ last, jnp.float32, contraction=k)
        del values, last
    d_out = _values(rng, (m, n), jnp.bfloat16)
    grad = _mosaic(TGMM)(lhs.T, d_out, sizes, preferred_element_type=jnp.bfloat16)
    assert grad.shape == HUGE
    expected = np.asarray(lhs, np.float64).T @ np.asarray(d_out, np.float64)
    assert_close(grad[-1], expected, jnp.bfloat16, contraction=m)
    assert not bool(jnp.any(grad[:-1] != 0))  # on the device: 2.1e9 elements


def test_existing_out_is_updated_in_place_when_compiled():
    """Expert parallelism (32 of DeepSeek-V3's 256 experts here): compiled, the output is
    existing_out's buffer, aliased, so the other experts' rows are neither read nor written
    (interpret mode copies them instead: test_gmm_group_offset_existing_out_and_transpose_rhs)."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    gmm = kernelhub.get(GMM, platform="mosaic", backend="gpu")

    def forward(lhs, rhs, sizes, offset, existing):
        return gmm(lhs, rhs, sizes, group_offset=offset, existing_out=existing,
                   preferred_element_type=jnp.bfloat16)

    if ON_GPU:
        pytest.skip("lowering for cuda from a CPU host")
    exported = jax.export.export(jax.jit(forward, donate_argnums=4), platforms=["cuda"])(
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
        jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16),
        jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32),
        jax.ShapeDtypeStruct((m, n), jnp.bfloat16))
    text = exported.mlir_module()
    _check_mosaic_only(exported, 1)
    call = next(line for line in text.splitlines() if "custom_call @mosaic_gpu_v2(" in line)
    assert "output_operand_aliases" in call
    assert "tf.aliasing_output = 0" in text


@pytest.mark.parametrize("tiling", [None, (64, 128, 256, 3, 2), (64, 128, 128, 4, 1, 8)],
                         ids=["heuristic", "warp-specialized", "spans"])
def test_tgmm_existing_out_is_updated_in_place_when_compiled(tiling):
    """Gradient accumulation into a weight gradient (DeepSeek-V3's 32 local experts): compiled,
    tgmm's output is existing_out's buffer, aliased, in each of its three bodies (one compute
    warpgroup, two, spans of groups), so no second [G, k, n] buffer is allocated. Only the
    aliasing is checked here; the values (an empty group's slice left as existing_out's) are
    test_tgmm_unaligned_offset_actual_groups_and_existing_out's, which on a GPU runs this path
    and here the interpreter's, where existing_out is an operand."""
    m, k, n, experts, local = MOE_SHAPES["deepseek_v3"]
    tgmm = kernelhub.get(TGMM, platform="mosaic", backend="gpu")

    def weight_gradient(lhs, rhs, sizes, offset, existing):
        return tgmm(lhs, rhs, sizes, group_offset=offset, num_actual_groups=local,
                    existing_out=existing, tiling=tiling, preferred_element_type=jnp.float32)

    if ON_GPU:
        pytest.skip("lowering for cuda from a CPU host")
    exported = jax.export.export(jax.jit(weight_gradient, donate_argnums=4),
                                 platforms=["cuda"])(
        jax.ShapeDtypeStruct((k, m), jnp.bfloat16), jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        jax.ShapeDtypeStruct((experts,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32),
        jax.ShapeDtypeStruct((local, k, n), jnp.float32))
    text = exported.mlir_module()
    _check_mosaic_only(exported, 1, unpadded=True)
    call = next(line for line in text.splitlines() if "custom_call @mosaic_gpu_v2(" in line)
    assert "output_operand_aliases" in call
    assert "tf.aliasing_output = 0" in text
