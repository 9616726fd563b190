"""Every implementation that runs here against the float64 reference, over the whole contract.

Implementations join by registering: the Pallas TPU, Triton and Mosaic GPU kernels run here in
interpret mode. The forward and gradient checks go through kernelhub.testing, the harness users
get for their own ops, so it runs on every test run.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from conftest import assert_close, call, implementation_params, max_examples
from kernelhub import testing
from strategies import PATTERNS, Problem, normal, problems, sizes_for

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"


def gmm_case(p: Problem) -> testing.Case:
    rng = np.random.default_rng(p.seed)
    lhs = normal(rng, (p.m, p.k), p.lhs_dtype)
    rhs_shape = (p.local_groups, p.n, p.k) if p.transpose_rhs else (p.local_groups, p.k, p.n)
    rhs = normal(rng, rhs_shape, p.rhs_dtype)
    existing = normal(rng, (p.m, p.n), p.out_dtype) if p.with_existing else None
    return testing.Case(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(p.group_sizes),
                        preferred_element_type=p.out_dtype, group_offset=p.group_offset,
                        existing_out=None if existing is None else jnp.asarray(existing),
                        transpose_rhs=p.transpose_rhs).named(repr(p))


def gmm_reference(lhs, rhs, group_sizes, group_offset, existing_out, transpose_rhs, **_):
    return reference.gmm(lhs, rhs, group_sizes, group_offset, existing_out, transpose_rhs)


def gmm_reference_vjp(d_out, /, lhs, rhs, group_sizes, group_offset, existing_out, transpose_rhs, **_):
    d_lhs, d_rhs, d_existing = reference.gmm_vjp(lhs, rhs, group_sizes, d_out, group_offset,
                                                 transpose_rhs, existing_out is not None)
    return {"lhs": d_lhs, "rhs": d_rhs, "existing_out": d_existing}


def gmm_exact_rows(arguments, out) -> None:
    """The output's dtype, and rows no local group computes copied exactly, never approximated
    or left unset."""
    assert out.dtype == jnp.dtype(arguments["preferred_element_type"]), out.dtype
    lhs, rhs = arguments["lhs"], arguments["rhs"]
    offset = arguments["group_offset"]
    computed = np.zeros(lhs.shape[0], bool)
    for g, (start, end) in enumerate(reference.group_rows(arguments["group_sizes"], lhs.shape[0])):
        computed[start:end] = offset <= g < offset + rhs.shape[0]
    existing = arguments["existing_out"]
    kept = np.zeros(out.shape, out.dtype) if existing is None else np.asarray(existing)
    np.testing.assert_array_equal(np.asarray(out)[~computed], kept[~computed])


@pytest.mark.parametrize("spec", implementation_params(GMM))
def test_gmm_forward_and_gradients(spec):
    report = testing.check_implementations(
        GMM, gmm_reference, problems(patterns=itertools.cycle(PATTERNS)).map(gmm_case), reference_vjp=gmm_reference_vjp,
        check=gmm_exact_rows, implementations=[spec], examples=max_examples(spec))
    report.assert_ok()


def tgmm_case(p: Problem) -> testing.Case:
    rng = np.random.default_rng(p.seed)
    lhs = normal(rng, (p.k, p.m), p.lhs_dtype)
    rhs = normal(rng, (p.m, p.n), p.rhs_dtype)
    existing = normal(rng, (p.local_groups, p.k, p.n), p.out_dtype) if p.with_existing else None
    return testing.Case(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(p.group_sizes),
                        preferred_element_type=p.out_dtype, group_offset=p.group_offset,
                        num_actual_groups=p.local_groups,
                        existing_out=None if existing is None else jnp.asarray(existing)
                        ).named(repr(p))


def tgmm_reference(lhs, rhs, group_sizes, group_offset, num_actual_groups, existing_out, **_):
    return reference.tgmm(lhs, rhs, group_sizes, group_offset, num_actual_groups, existing_out)


def tgmm_reference_vjp(d_out, /, lhs, rhs, group_sizes, group_offset, existing_out, **_):
    d_lhs, d_rhs, d_existing = reference.tgmm_vjp(lhs, rhs, group_sizes, d_out, group_offset,
                                                  existing_out is not None)
    return {"lhs": d_lhs, "rhs": d_rhs, "existing_out": d_existing}


def tgmm_exact_empty_groups(arguments, out) -> None:
    """The output's dtype, and empty groups exactly 0 (or exactly existing_out)."""
    assert out.dtype == jnp.dtype(arguments["preferred_element_type"]), out.dtype
    bounds = reference.group_rows(arguments["group_sizes"], arguments["lhs"].shape[1])
    existing = arguments["existing_out"]
    for j in range(out.shape[0]):
        start, end = bounds[arguments["group_offset"] + j]
        if start == end:
            kept = 0 if existing is None else np.asarray(existing[j])
            np.testing.assert_array_equal(np.asarray(out[j]), np.broadcast_to(kept, out[j].shape))


@pytest.mark.parametrize("spec", implementation_params(TGMM))
def test_tgmm_forward_and_gradients(spec):
    report = testing.check_implementations(
        TGMM, tgmm_reference, problems(transposable=False, patterns=itertools.cycle(PATTERNS)).map(tgmm_case),
        reference_vjp=tgmm_reference_vjp, check=tgmm_exact_empty_groups, implementations=[spec],
        examples=max_examples(spec))
    report.assert_ok()


@pytest.mark.parametrize("spec", implementation_params(GMM))
@pytest.mark.parametrize("shards", [2, 4])
def test_gmm_shard_chain_equals_unsharded(spec, shards):
    """Experts split over shards, each adding its rows through existing_out, give the full result."""
    rng = np.random.default_rng(shards)
    m, k, n, experts = 61, 24, 20, 8
    sizes = sizes_for("with_zeros", m - 5, experts, rng)
    lhs, rhs = normal(rng, (m, k), jnp.float32), normal(rng, (experts, k, n), jnp.float32)
    gmm, per_shard = call(spec), experts // shards
    out = jnp.zeros((m, n), jnp.float32)
    for shard in range(shards):
        local = slice(shard * per_shard, (shard + 1) * per_shard)
        out = gmm(jnp.asarray(lhs), jnp.asarray(rhs[local]), jnp.asarray(sizes),
                  group_offset=shard * per_shard, existing_out=out)
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, jnp.float32, contraction=k)
    whole = gmm(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes))
    assert_close(out, np.asarray(whole), jnp.float32, jnp.float32, contraction=k)


@pytest.mark.parametrize("spec", implementation_params(TGMM))
def test_tgmm_shards_concatenate_to_unsharded(spec):
    rng = np.random.default_rng(3)
    m, k, n, experts, shards = 53, 12, 16, 8, 4
    sizes = sizes_for("with_zeros", m, experts, rng)
    lhs, rhs = normal(rng, (k, m), jnp.float32), normal(rng, (m, n), jnp.float32)
    tgmm, per_shard = call(spec), experts // shards
    parts = [tgmm(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes),
                  group_offset=s * per_shard, num_actual_groups=per_shard) for s in range(shards)]
    assert_close(jnp.concatenate(parts), reference.tgmm(lhs, rhs, sizes), jnp.float32, jnp.float32,
                 contraction=m)


@pytest.mark.parametrize("spec", implementation_params(GMM))
def test_gmm_under_jit_with_traced_offset(spec):
    rng = np.random.default_rng(5)
    m, k, n, experts = 40, 16, 8, 6
    sizes = np.array([5, 0, 12, 9, 3, 7], np.int32)
    lhs, rhs = normal(rng, (m, k), jnp.float32), normal(rng, (experts, k, n), jnp.float32)
    gmm = call(spec)

    @jax.jit
    def f(lhs, rhs, sizes, offset):
        return gmm(lhs, rhs, sizes, group_offset=offset)

    for offset in (0, 2, 3):
        out = f(jnp.asarray(lhs), jnp.asarray(rhs[offset:offset + 3]), jnp.asarray(sizes), offset)
        assert_close(out, reference.gmm(lhs, rhs[offset:offset + 3], sizes, offset), jnp.float32,
                     jnp.float32, contraction=k)


# The Mosaic GPU interpreter multiplies tiles with numpy, which warns of the NaN it is given.
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("spec", implementation_params(GMM))
def test_gmm_nan_stays_in_its_rows(spec):
    rng = np.random.default_rng(7)
    m, k, n = 32, 8, 8
    sizes = np.array([10, 0, 12], np.int32)  # rows 22..31 belong to no group
    lhs, rhs = normal(rng, (m, k), jnp.float32), normal(rng, (3, k, n), jnp.float32)
    lhs[3, 2] = np.nan
    lhs[25, 0] = np.inf
    out = np.asarray(call(spec)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes)))
    bad_rows = {3}
    for row in range(m):
        assert np.isnan(out[row]).any() == (row in bad_rows), row
    assert (out[22:] == 0).all()


@pytest.mark.parametrize("spec", implementation_params(TGMM))
def test_tgmm_nan_past_the_groups_reaches_nothing(spec):
    rng = np.random.default_rng(8)
    k, m, n = 8, 30, 8
    sizes = np.array([4, 11, 0, 9], np.int32)
    lhs, rhs = normal(rng, (k, m), jnp.float32), normal(rng, (m, n), jnp.float32)
    lhs[:, 27] = np.nan
    rhs[2, 1] = np.nan  # row 2 is group 0's
    out = np.asarray(call(spec)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes)))
    assert np.isnan(out[0]).any()
    assert not np.isnan(out[1:]).any()
    assert (out[2] == 0).all()


@pytest.mark.parametrize("spec", implementation_params(TGMM))
@pytest.mark.parametrize("sizes", [[180, 97, 0], [3, 290, 7], [3, 903, 7], [300, 1100, 5],
                                   [512, 1024, 0]])
def test_tgmm_few_large_groups(spec, sizes):
    """Groups larger than the hypothesis problems draw (some kernels switch strategy there).

    The xla kernel's chunks: 903 rows = 512 + 391 padded to 512; 1100 = 2 x 512 + 76 padded
    to 128; 300 padded to 512, 97 to 128, 7 to 16, 3 to 16; 512 and 1024, whole chunks with no
    rest.
    """
    rng = np.random.default_rng(11)
    k, n = 8, 8
    m = sum(sizes) + 5
    sizes = np.array(sizes, np.int32)
    lhs, rhs = normal(rng, (k, m), jnp.float32), normal(rng, (m, n), jnp.float32)
    out = call(spec)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes))
    assert_close(out, reference.tgmm(lhs, rhs, sizes), jnp.float32, jnp.float32, contraction=m)


@pytest.mark.parametrize("spec", implementation_params(TGMM))
@pytest.mark.parametrize("with_existing", [False, True])
def test_tgmm_many_groups_and_two_large_ones(spec, with_existing):
    """Many small groups (the xla kernel sums every group's first rows in one batched matmul)
    and two large ones whose rest goes on past it: 64 + 1024 rows, a rest of whole chunks, and
    64 + 300 rows, a rest padded to 512. With existing_out, the rests add to stored sums.
    """
    rng = np.random.default_rng(15)
    k, n = 8, 8
    sizes = np.array([10] * 6 + [1088, 0, 3] + [10] * 6 + [364], np.int32)
    m = int(sizes.sum()) + 5
    lhs, rhs = normal(rng, (k, m), jnp.float32), normal(rng, (m, n), jnp.float32)
    existing = normal(rng, (len(sizes), k, n), jnp.float32) if with_existing else None
    out = call(spec)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes),
                     existing_out=None if existing is None else jnp.asarray(existing))
    want = reference.tgmm(lhs, rhs, sizes, existing_out=existing)
    assert_close(out, want, jnp.float32, jnp.float32, contraction=m)


# Each group size with one dtype, not both: the sizes place the tiles, the dtype only what a
# tile holds (the pairs crossed until 2026-11-29).
@pytest.mark.parametrize("spec", implementation_params(GMM))
@pytest.mark.parametrize("dtype, sizes", [(jnp.float32, [613, 0, 80]),
                                          (jnp.bfloat16, [903, 0, 90])])
def test_gmm_few_large_groups(spec, dtype, sizes):
    rng = np.random.default_rng(12)
    k, n = 8, 8
    m = sum(sizes) + 7
    sizes = np.array(sizes, np.int32)
    lhs, rhs = normal(rng, (m, k), dtype), normal(rng, (3, k, n), dtype)
    out = call(spec)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes))
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, dtype, contraction=k)


@pytest.mark.parametrize("spec", implementation_params(GMM))
@pytest.mark.parametrize("sizes, spare_rows", [([592, 5, 17, 130, 0, 64, 12, 16], 3),
                                               ([3, 70, 9], 0), ([1, 0, 6], 0)])
def test_gmm_every_kind_of_rest(spec, sizes, spare_rows):
    """The xla kernel's chunks after a group's full 512-row ones: 64-row chunks, the last one
    masked; a rest of 9-16 or 1-8 rows in one masked chunk of 16 or 8; 17 rows, one masked
    64-row chunk. With no spare rows, the last windows are clamped back from the array's end.
    """
    rng = np.random.default_rng(16)
    k, n = 8, 8
    m = sum(sizes) + spare_rows
    sizes = np.array(sizes, np.int32)
    lhs, rhs = normal(rng, (m, k), jnp.float32), normal(rng, (len(sizes), k, n), jnp.float32)
    existing = normal(rng, (m, n), jnp.float32)
    out = call(spec)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes),
                     existing_out=jnp.asarray(existing))
    want = reference.gmm(lhs, rhs, sizes, existing_out=existing)
    assert_close(out, want, jnp.float32, jnp.float32, contraction=k)


@pytest.mark.parametrize("spec", implementation_params(GMM))
def test_gmm_under_vmap(spec):
    """A batch of independent problems, each with its own group sizes."""
    rng = np.random.default_rng(13)
    batch, m, k, n, experts = 3, 24, 8, 8, 4
    sizes = np.array([[5, 0, 12, 7], [24, 0, 0, 0], [1, 2, 3, 4]], np.int32)
    lhs = normal(rng, (batch, m, k), jnp.bfloat16)
    rhs = normal(rng, (batch, experts, k, n), jnp.bfloat16)
    out = jax.jit(jax.vmap(call(spec)))(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes))
    for b in range(batch):
        assert_close(out[b], reference.gmm(lhs[b], rhs[b], sizes[b]), jnp.float32, jnp.bfloat16,
                     contraction=k)


@pytest.mark.parametrize("spec", implementation_params(TGMM))
def test_tgmm_under_vmap(spec):
    rng = np.random.default_rng(14)
    batch, k, m, n = 2, 8, 24, 8
    sizes = np.array([[5, 0, 12, 7], [0, 20, 0, 1]], np.int32)
    lhs = normal(rng, (batch, k, m), jnp.bfloat16)
    rhs = normal(rng, (batch, m, n), jnp.bfloat16)
    out = jax.jit(jax.vmap(call(spec)))(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes))
    for b in range(batch):
        assert_close(out[b], reference.tgmm(lhs[b], rhs[b], sizes[b]), jnp.float32, jnp.bfloat16,
                     contraction=m)


# ---------------------------------------------------------------- empty axes (any m, k, n)


def _normal(rng, shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


@pytest.mark.parametrize("with_existing", [False, True])
@pytest.mark.parametrize("m, k, n", [(0, 8, 6), (12, 0, 6), (12, 8, 0)])
@pytest.mark.parametrize("spec", implementation_params(GMM))
def test_gmm_with_an_empty_axis(spec, m, k, n, with_existing):
    """Every output element is still fixed: the computed rows of an empty sum are 0, every other
    row existing_out's (or 0); gradients likewise. Two local groups of three, offset 1."""
    rng = np.random.default_rng(m + 10 * k + 100 * n)
    sizes = [0, 0, 0] if m == 0 else [4, 0, 5]
    lhs, rhs = _normal(rng, (m, k)), _normal(rng, (2, k, n))
    existing = _normal(rng, (m, n)) if with_existing else None
    d_out = _normal(rng, (m, n))

    def gmm(lhs, rhs, existing):
        return call(spec)(lhs, rhs, jnp.asarray(sizes, jnp.int32), group_offset=1,
                          existing_out=existing)

    out, vjp = jax.vjp(gmm, lhs, rhs, existing)
    assert_close(out, reference.gmm(lhs, rhs, sizes, 1, existing), jnp.float32)
    expected = reference.gmm_vjp(lhs, rhs, sizes, d_out, 1, has_existing=with_existing)
    for got, want in zip(vjp(d_out), expected):
        if want is not None:
            assert_close(got, want, jnp.float32)


@pytest.mark.parametrize("with_existing", [False, True])
@pytest.mark.parametrize("k, m, n", [(8, 0, 6), (0, 12, 6), (8, 12, 0)])
@pytest.mark.parametrize("spec", implementation_params(TGMM))
def test_tgmm_with_an_empty_axis(spec, k, m, n, with_existing):
    rng = np.random.default_rng(k + 10 * m + 100 * n)
    sizes = [0, 0, 0] if m == 0 else [4, 0, 5]
    lhs, rhs = _normal(rng, (k, m)), _normal(rng, (m, n))
    existing = _normal(rng, (3, k, n)) if with_existing else None
    d_out = _normal(rng, (3, k, n))

    def tgmm(lhs, rhs, existing):
        return call(spec)(lhs, rhs, jnp.asarray(sizes, jnp.int32), existing_out=existing)

    out, vjp = jax.vjp(tgmm, lhs, rhs, existing)
    assert_close(out, reference.tgmm(lhs, rhs, sizes, existing_out=existing), jnp.float32)
    expected = reference.tgmm_vjp(lhs, rhs, sizes, d_out, has_existing=with_existing)
    for got, want in zip(vjp(d_out), expected):
        if want is not None:
            assert_close(got, want, jnp.float32)


# ---------------------------------------------------------------- operands of 2**31 elements
# Only a GPU has the memory and speed for them (the GPU run): the few rows computed sit past
# element 2**31 of the operand, where an offset counted in 32 bits would wrap. (On this host
# tests/test_triton_gpu.py checks the Triton kernels' offset widths in their IR.)

BIG_K = 4096
BIG_ROWS = 2**31 // BIG_K  # lhs [BIG_ROWS, BIG_K]: 2**31 elements, 4 GiB of bf16
BIG_GROUPS = 130  # weights [130, 4096, 4096]: 2.2e9 elements
TAIL = 64  # the rows computed


def _big(shape, seed):
    if jax.default_backend() != "gpu":
        pytest.skip("operands of 2**31 elements: for a GPU (the GPU run)")
    return jax.random.normal(jax.random.key(seed), shape, jnp.bfloat16)


@pytest.mark.parametrize("operand", ["rhs", "lhs"])
@pytest.mark.parametrize("spec", implementation_params(GMM))
def test_gmm_reads_past_element_2_31(spec, operand):
    """rhs: 16 rows past the sum, the last two of 130 groups of weights [4096, 4096] computed.
    lhs: 2**31 elements, rows of two groups; only the last TAIL rows are the local group's
    (group_offset 1), the others stay 0."""
    if operand == "rhs":
        lhs, rhs, n = _big((80, BIG_K), 1), _big((BIG_GROUPS, BIG_K, BIG_K), 2), BIG_K
        sizes = np.zeros(BIG_GROUPS, np.int32)
        sizes[-2:] = [40, TAIL - 40]
        offset, rows = 0, slice(0, 80)
    else:
        lhs, rhs, n = _big((BIG_ROWS, BIG_K), 3), _big((1, BIG_K, 128), 4), 128
        sizes = np.array([BIG_ROWS - TAIL, TAIL], np.int32)
        offset, rows = 1, slice(BIG_ROWS - TAIL, BIG_ROWS)
    gmm = jax.jit(lambda l, r, s: call(spec)(l, r, s, group_offset=offset))
    out = gmm(lhs, rhs, jnp.asarray(sizes))
    assert out.shape == (lhs.shape[0], n)
    if operand == "rhs":
        expected = reference.gmm(lhs, rhs[-2:], sizes, group_offset=BIG_GROUPS - 2)
    else:
        expected = reference.gmm(lhs[rows], rhs, [0, TAIL], group_offset=1)
        assert int(jnp.count_nonzero(out[: rows.start])) == 0
    assert_close(out[rows], expected, jnp.float32, contraction=BIG_K)


@pytest.mark.parametrize("spec", implementation_params(TGMM))
def test_tgmm_reads_past_element_2_31(spec):
    """lhs x.T of x [2**31 / 4096, 4096] (a weight gradient's), the last TAIL rows the one
    local group's (group_offset 1, num_actual_groups 1)."""
    x, d_out = _big((BIG_ROWS, BIG_K), 5), _big((BIG_ROWS, 128), 6)
    sizes = jnp.array([BIG_ROWS - TAIL, TAIL], jnp.int32)
    tgmm = jax.jit(lambda x, dy, s: call(spec)(x.T, dy, s, group_offset=1, num_actual_groups=1))
    out = tgmm(x, d_out, sizes)
    tail = slice(BIG_ROWS - TAIL, BIG_ROWS)
    expected = reference.tgmm(np.asarray(x[tail]).T, d_out[tail], [0, TAIL], group_offset=1)
    assert_close(out, expected, jnp.float32, contraction=TAIL)
