"""The Triton kernels beyond the shared contract suite: block configs, kernel paths the small
contract shapes miss (several k steps, tiles crossed by many groups, interior row chunks),
lowering for CUDA at real MoE shapes on a host without a GPU, and the GPU benchmark's plumbing.
On a GPU host the same tests run the real kernels (platform="triton" resolves to them).

Correctness against the reference over the whole contract is tests/test_contract.py's job.
"""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import reference
from kernelhub._grouped_matmul.groups import NO_OFFSET
from kernelhub._grouped_matmul.problem import Kernel, Problem
from conftest import assert_close
from kernelhub._grouped_matmul import visits
from kernelhub._pallas.gpu import config
from kernelhub._verify import cuda_lowering as cuda_export

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"


# ---------------------------------------------------------------- block configs


@pytest.mark.parametrize("tiling, rule", [
    ((96, 64, 64), "power of two"),
    ((64, 48, 64), "power of two"),
    ((64, 64, 8), r"\[16, 1024\]"),
    ((2048, 64, 64), r"\[16, 1024\]"),
    ((64, 64, 64, 3), "num_warps=3 must be a power of two"),
    ((64, 64, 64, 4, 0), "num_stages=0"),
    ((64, 64), "tuple of ints"),
    ((64, 64, 64, 4, 3, 1), "tuple of ints"),
])
def test_invalid_tiling_names_the_rule(tiling, rule):
    with pytest.raises(ValueError, match=rule):
        config.from_tiling(tiling, 64, 64, 64, config.BlockConfig(64, 64, 64))


@pytest.mark.parametrize("op", [GMM, TGMM])
def test_invalid_tiling_reaches_the_caller(op):
    fn = kernelhub.get(op, platform="triton")
    lhs = jnp.ones((32, 16) if op == GMM else (16, 32), jnp.float32)
    rhs = jnp.ones((2, 16, 8) if op == GMM else (32, 8), jnp.float32)
    with pytest.raises(ValueError, match="power of two"):
        fn(lhs, rhs, jnp.array([16, 16], jnp.int32), tiling=(64, 64, 24))
    with pytest.raises(ValueError, match="power of two"):  # a callable's answer is checked too
        fn(lhs, rhs, jnp.array([16, 16], jnp.int32), tiling=lambda m, k, n: (m + 1, 16, 16))


def test_tiling_forms():
    default = config.BlockConfig(64, 32, 128, 4, 3)
    assert config.from_tiling(None, 10, 10, 10, default) is default
    assert config.from_tiling(lambda m, k, n: None, 10, 10, 10, default) is default
    assert config.from_tiling((16, 32, 64), 10, 10, 10, default) == config.BlockConfig(16, 32, 64, 4, 3)
    assert config.from_tiling((16, 32, 64, 8, 2), 10, 10, 10, default).as_tiling() == (16, 32, 64, 8, 2)


def _problem(kernel: Kernel, m: int, k: int, n: int, groups: int, dtype: str) -> Problem:
    return Problem(kernel, m, k, n, groups, groups, dtype, dtype, dtype, False)


@pytest.mark.parametrize("m, k, n, groups", [
    (8192, 4096, 14336, 8), (16384, 7168, 2048, 256), (8192, 2048, 768, 128), (1000, 520, 200, 7),
    (1, 1, 1, 1), (72, 40, 3, 9),
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_heuristics_give_valid_configs_that_fit_the_shape(m, k, n, groups, dtype):
    for kernel in Kernel:
        blocks = config.validate(config.heuristic(_problem(kernel, m, k, n, groups, dtype)),
                                 "heuristic")
        for block, dim in ((blocks.block_m, m), (blocks.block_k, k), (blocks.block_n, n)):
            assert block <= max(config.MIN_BLOCK, 2 * dim)


def test_heuristic_follows_group_sizes():
    mixtral = config.gmm_heuristic(_problem(Kernel.GMM, 8192, 4096, 14336, 8, "bfloat16"))
    assert (mixtral.block_m, mixtral.block_n, mixtral.num_warps) == (128, 256, 8)
    deepseek = config.gmm_heuristic(_problem(Kernel.GMM, 16384, 7168, 2048, 256, "bfloat16"))
    assert deepseek.block_m == 64  # 64 rows per expert on average


# ---------------------------------------------------------------- visit metadata


# Each row_align and each (fill, spread) once: row_align 1 (the Triton kernels' tiles at each
# group's first row) with plain fills, 8 (the Mosaic GPU kernels') without fills (existing_out),
# 16 (= block_m, the fixed tiles of scale blocks along the output rows) with spread fills. Every
# case also builds the fixed tiles' table it is compared with, and spreading only reorders a
# table (test_spread_fills_... checks it keeps every visit).
@pytest.mark.parametrize("row_align, fill, spread", [(1, True, False), (8, False, False),
                                                     (16, True, True)])
def test_visits_cover_every_row_once(fill, spread, row_align):
    """Every row is written by exactly one visit (only the local groups' rows without fill),
    from a tile inside the padded rows that starts at a multiple of row_align; tiles that start
    at a group's first row (row_align < block_m) never cost a group more visits than the fixed
    tiles (row_align = block_m) do."""
    rng = np.random.default_rng(0)
    m, block_m, groups = 203, 16, 9
    table_for = jax.jit(visits.visit_table, static_argnums=(2, 3, 4, 5, 6, 7))
    for trial, local in enumerate([1, 1, 4, 4, 4, 9, 9, 9]):
        sizes = rng.multinomial(int(rng.integers(0, m + 1)), rng.dirichlet(np.full(groups, 0.5)))
        sizes = np.where(rng.random(groups) < 0.3, 0, sizes).astype(np.int32)
        offset = int(rng.integers(0, groups - local + 1))
        args = (jnp.asarray(sizes), jnp.int32(offset), local, m, block_m, fill)
        table = np.asarray(table_for(*args, row_align, spread))
        fixed = np.asarray(table_for(*args, block_m, spread))
        assert table.shape[1] == visits.visit_count(m, block_m, local, fill)
        written = np.zeros(m, int)
        for first_row, group, start, end in table.T:
            if group == visits.IDLE:
                continue
            assert first_row % row_align == 0
            assert 0 <= first_row <= -(-m // block_m) * block_m - block_m
            assert first_row <= start < end <= first_row + block_m, "owns rows of its tile"
            written[start:end] += 1
        bounds = reference.group_rows(sizes, m)
        computed = np.zeros(m, bool)
        for g in range(offset, offset + local):
            computed[bounds[g][0]:bounds[g][1]] = True
        expected = np.ones(m, int) if fill else computed.astype(int)
        np.testing.assert_array_equal(written, expected, err_msg=f"trial {trial}")
        for g in range(local):
            assert (table[1] == g).sum() <= (fixed[1] == g).sum()
            if row_align == 1:
                assert (table[1] == g).sum() == -(-int(sizes[offset + g]) // block_m)


def test_spread_fills_puts_the_zero_writing_visits_evenly_among_the_computing_ones():
    """A shard's 3 local groups among 24 row tiles: spread, the same visits, the computing ones
    in their row order (a group's tiles together), the FILL visits at most ceil(F / C) + 1 in
    a row and between any two computing visits, the IDLE ones last; without fills (existing_out)
    nothing moves."""
    sizes = jnp.asarray([100, 90, 7, 40, 9, 130], jnp.int32)  # 376 of 384 rows
    # Jitted, as the kernels call it: run op by op, the table's ops took seconds.
    table_for = jax.jit(visits.visit_table, static_argnums=(2, 3, 4, 5, 6, 7))
    args = (sizes, jnp.int32(2), 3, 384, 16, True, 16)
    by_row = np.asarray(table_for(*args, False))
    spread = np.asarray(table_for(*args, True))
    assert sorted(map(tuple, spread.T)) == sorted(map(tuple, by_row.T))
    group = spread[visits.GROUP]
    computing = [tuple(v) for v in spread.T if v[visits.GROUP] >= 0]
    assert computing == [tuple(v) for v in by_row.T if v[visits.GROUP] >= 0]
    fills, computes = (group == visits.FILL).sum(), (group >= 0).sum()
    assert fills >= 3 * computes > 0
    live = group[group != visits.IDLE]
    assert (group[len(live):] == visits.IDLE).all()
    runs = np.diff(np.flatnonzero(np.r_[True, live >= 0, True])) - 1  # fills between computes
    assert runs.max() <= -(-fills // computes) + 1
    assert (by_row[visits.GROUP][:3] == visits.FILL).all()  # in row order, fills lead
    kept = (sizes, jnp.int32(2), 3, 384, 16, False, 16)
    np.testing.assert_array_equal(table_for(*kept, True), table_for(*kept, False))


def test_visit_row_align_must_divide_block_m():
    with pytest.raises(ValueError, match="row_align 24 must divide block_m 16"):
        visits.visit_table(jnp.ones(4, jnp.int32), jnp.int32(0), 4, 16, 16, True, 24)


# ---------------------------------------------------------------- kernel paths, interpret mode

SMALL_TILES = (16, 16, 16)


def _rounded(rng, shape, dtype):
    return np.array(jnp.asarray(rng.standard_normal(shape), dtype))


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_many_k_steps_and_crossed_tiles(transpose_rhs):
    rng = np.random.default_rng(1)
    m, k, n = 150, 70, 50  # several k and n steps, all unaligned to 16
    sizes = np.array([1, 0, 37, 16, 2, 0, 45, 3, 30], np.int32)  # sum 134 < m
    lhs = _rounded(rng, (m, k), jnp.float32)
    rhs = _rounded(rng, (6, n, k) if transpose_rhs else (6, k, n), jnp.float32)
    gmm = kernelhub.get(GMM, platform="triton")
    out = gmm(lhs, rhs, sizes, tiling=SMALL_TILES, group_offset=2, transpose_rhs=transpose_rhs)
    expected = reference.gmm(lhs, rhs, sizes, 2, transpose_rhs=transpose_rhs)
    assert_close(out, expected, jnp.float32, jnp.float32, contraction=k)
    computed = np.zeros(m, bool)
    computed[1:1 + 37 + 16 + 2 + 0 + 45 + 3] = True  # groups 2..7
    assert (np.asarray(out)[~computed] == 0).all()


def test_gmm_with_fills_spread_among_the_computing_visits(monkeypatch):
    """With visits.SPREAD_FILLS (a measurement's schedule) the visits that write the other
    experts' rows as zeros come between the computing ones: every row still right, in the
    interpreted Triton kernel, a shard of 2 of 9 groups with rows before, after and past."""
    rng = np.random.default_rng(14)
    m, k, n = 150, 40, 50
    sizes = np.array([1, 0, 37, 16, 2, 0, 45, 3, 30], np.int32)  # 134 rows
    lhs, rhs = _rounded(rng, (m, k), jnp.float32), _rounded(rng, (2, k, n), jnp.float32)
    gmm = kernelhub.get(GMM, platform="triton")
    sorts = []
    for spread in (False, True):
        jax.clear_caches()
        monkeypatch.setattr(visits, "SPREAD_FILLS", spread)
        try:
            # Run only with the spread (the plain order runs in every other test).
            out = gmm(lhs, rhs, sizes, tiling=SMALL_TILES, group_offset=2) if spread else None
            sorts.append(jax.jit(lambda x, w, s: gmm(x, w, s, tiling=SMALL_TILES,
                                                     group_offset=2)).lower(
                lhs, rhs, sizes).as_text().count("stablehlo.sort"))
        finally:
            jax.clear_caches()
    assert sorts == [0, 1]  # the spread order is computed only where asked for
    assert_close(out, reference.gmm(lhs, rhs, sizes, 2), jnp.float32, jnp.float32, contraction=k)
    assert (np.asarray(out)[:1] == 0).all() and (np.asarray(out)[54:] == 0).all()


def test_gmm_row_tiles_moved_back_from_the_end():
    """Tiles start at each group's first row; the last group's and the rows past the sum start
    within a tile of the padded end, so they are moved back over the rows before them."""
    rng = np.random.default_rng(3)
    m, k, n = 150, 40, 24
    sizes = np.array([146, 2], np.int32)  # rows 148.. past the sum
    lhs, rhs = _rounded(rng, (m, k), jnp.float32), _rounded(rng, (2, k, n), jnp.float32)
    out = kernelhub.get(GMM, platform="triton")(lhs, rhs, sizes, tiling=SMALL_TILES)
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, jnp.float32, contraction=k)
    assert (np.asarray(out)[148:] == 0).all()


def test_tgmm_interior_and_edge_chunks():
    rng = np.random.default_rng(2)
    k, m, n = 40, 170, 36
    sizes = np.array([5, 64, 0, 33, 16, 11, 20], np.int32)  # aligned, unaligned, one-chunk groups
    lhs = _rounded(rng, (k, m), jnp.bfloat16)
    rhs = _rounded(rng, (m, n), jnp.bfloat16)
    rhs[160:] = np.nan  # past the groups: must reach nothing
    tgmm = kernelhub.get(TGMM, platform="triton")
    existing = _rounded(rng, (len(sizes), k, n), jnp.float32)
    out = tgmm(lhs, rhs, sizes, tiling=SMALL_TILES, existing_out=existing)
    expected = reference.tgmm(lhs, rhs, sizes, existing_out=existing)
    assert_close(out, expected, jnp.float32, jnp.bfloat16, contraction=m)
    np.testing.assert_array_equal(np.asarray(out[2]), existing[2])


def test_gmm_bf16_output_with_existing_keeps_other_rows_bitwise():
    rng = np.random.default_rng(3)
    m, k, n = 90, 33, 40
    sizes = np.array([20, 30, 25], np.int32)
    lhs = _rounded(rng, (m, k), jnp.bfloat16)
    rhs = _rounded(rng, (1, k, n), jnp.bfloat16)
    existing = _rounded(rng, (m, n), jnp.bfloat16)
    out = kernelhub.get(GMM, platform="triton")(
        lhs, rhs, sizes, preferred_element_type=jnp.bfloat16, group_offset=1,
        existing_out=existing, tiling=SMALL_TILES)
    expected = reference.gmm(lhs, rhs, sizes, 1, existing)
    assert_close(out, expected, jnp.bfloat16, jnp.bfloat16, contraction=k)
    kept = np.r_[0:20, 50:90]
    np.testing.assert_array_equal(np.asarray(out)[kept], existing[kept])


E4M3, E5M2, INT8 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8


def test_which_tiles_are_multiplied_as_stored():
    from kernelhub import quantization
    from kernelhub._pallas.gpu._tiles import TileProduct, tile_product

    f32, i32, bf16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.int32), jnp.dtype(jnp.bfloat16)
    assert tile_product(INT8, INT8, 64, 4096, True) == TileProduct(None, i32)
    assert tile_product(E4M3, E4M3, 32, 100, True) == TileProduct(None, f32)
    assert tile_product(E4M3, E5M2, 128, 100, True) == TileProduct(None, f32)
    assert tile_product(E4M3, E4M3, 16, 100, True) == TileProduct(bf16, f32)  # k block < 32
    assert tile_product(jnp.bfloat16, INT8, 64, 100, True) == TileProduct(bf16, f32)
    assert tile_product(jnp.float32, E4M3, 64, 100, True) == TileProduct(f32, f32)
    assert tile_product(INT8, E4M3, 64, 100, True) == TileProduct(bf16, f32)
    # Too long a contraction for exact int32 sums: int32 per block, float32 across blocks.
    limit = quantization.MAX_EXACT_INT32_TERMS
    assert tile_product(INT8, INT8, 64, limit + 1, True) == TileProduct(None, f32)
    assert tile_product(INT8, INT8, 64, limit, True) == TileProduct(None, i32)


def _narrow_values(rng, shape, dtype):
    if dtype == INT8:
        return jnp.asarray(rng.integers(-128, 128, shape), INT8)  # -128 included
    return jnp.asarray(rng.standard_normal(shape) * 8, dtype)


# Every pair and every path, not their product: N-major weights read as they are (e5m2, int8),
# copied K-major first (e4m3, int8: the K-major kernel after the copy) and K-major as given
# (the mixed pair: nothing copied). int8, whose sums are asserted exact, takes both N-major
# paths. (Until 2026-11-28 every pair ran in both layouts at m=90.)
@pytest.mark.parametrize("lhs_dtype, rhs_dtype, transpose_rhs, m", [
    (E4M3, E5M2, True, 90), (E5M2, E5M2, False, 90), (INT8, INT8, False, 90),
    (E4M3, E4M3, False, 180), (INT8, INT8, False, 180)])
def test_narrow_dots_in_interpret_mode(lhs_dtype, rhs_dtype, transpose_rhs, m):
    """int8 x int8 and fp8 x fp8 tiles multiplied as stored, as on Hopper's 8-bit wgmma: int8
    sums exact in int32, fp8 products (exact) summed in float32. [G, k, n] weights at 45 rows
    per group (m=180) are first copied K-major (K_MAJOR_COPY_ROWS); at 22 they are not."""
    from kernelhub._pallas.gpu.grouped_matmul import K_MAJOR_COPY_ROWS, raw_grouped_matmul

    rng = np.random.default_rng(7)
    k, n = 100, 40  # 4 k steps of 32, the last one partial
    sizes = np.array([25, 0, 50, 10], np.int32) * (m // 90)
    lhs = _narrow_values(rng, (m, k), lhs_dtype)
    rhs = _narrow_values(rng, (4, n, k) if transpose_rhs else (4, k, n), rhs_dtype)

    def gmm(lhs, rhs, sizes):
        return raw_grouped_matmul(lhs, rhs, sizes, jnp.float32, (32, 32, 32), NO_OFFSET, None,
                                  transpose_rhs, interpret=True)

    jaxpr = str(jax.make_jaxpr(gmm)(lhs, rhs, sizes))
    assert "kernelhub_narrow_dot" in jaxpr
    copied = not transpose_rhs and m >= K_MAJOR_COPY_ROWS * len(sizes)
    assert ("transpose[" in jaxpr) == copied
    out = gmm(lhs, rhs, jnp.asarray(sizes))
    as_float = lambda x: np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    expected = reference.gmm(as_float(lhs), as_float(rhs), sizes, transpose_rhs=transpose_rhs)
    if lhs_dtype == INT8:  # |sums| < 2**24: exact in float32 too
        np.testing.assert_array_equal(np.asarray(out, np.float64), expected)
    else:
        assert_close(out, expected, jnp.float32, jnp.float32, contraction=k)


def test_int8_contraction_past_exact_int32_sums(monkeypatch):
    """Past MAX_EXACT_INT32_TERMS products an int32 total could wrap: each block's sum stays
    exact in int32 and the blocks add in float32 (here the limit is lowered to reach it)."""
    from kernelhub import quantization
    from kernelhub._pallas.gpu.transposed_grouped_matmul import raw_transposed_grouped_matmul

    monkeypatch.setattr(quantization, "MAX_EXACT_INT32_TERMS", 64)
    rng = np.random.default_rng(8)
    k, m, n = 48, 150, 32
    sizes = np.array([70, 0, 75], np.int32)
    lhs = _narrow_values(rng, (k, m), INT8)
    rhs = _narrow_values(rng, (m, n), INT8)
    out = raw_transposed_grouped_matmul(lhs, rhs, jnp.asarray(sizes), jnp.float32, (32, 32, 32),
                                        NO_OFFSET, len(sizes), None, interpret=True)
    expected = reference.tgmm(np.asarray(lhs, np.float64), np.asarray(rhs, np.float64), sizes)
    np.testing.assert_array_equal(np.asarray(out, np.float64), expected)


# ---------------------------------------------------------------- lowering for CUDA

# (name, m, k, n, num_groups, local_groups): local < num_groups means a traced group_offset.
MOE_SHAPES = [
    ("mixtral", 8192, 4096, 14336, 8, 8),
    ("deepseek-v3", 16384, 7168, 2048, 256, 32),
    ("qwen3-moe", 8192, 2048, 768, 128, 128),
    ("odd", 1000, 520, 200, 7, 7),
]


def _gmm_problem(m, k, n, groups, local, dtype):
    gmm = kernelhub.get(GMM, platform="triton", backend="gpu")
    specs = [jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((local, k, n), dtype),
             jax.ShapeDtypeStruct((groups,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)]

    def forward(lhs, rhs, sizes, offset):
        return gmm(lhs, rhs, sizes, preferred_element_type=dtype, group_offset=offset)

    return forward, specs


def _tgmm_problem(m, k, n, groups, local, dtype):
    tgmm = kernelhub.get(TGMM, platform="triton", backend="gpu")
    specs = [jax.ShapeDtypeStruct((k, m), dtype), jax.ShapeDtypeStruct((m, n), dtype),
             jax.ShapeDtypeStruct((groups,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)]

    def forward(lhs, rhs, sizes, offset):
        return tgmm(lhs, rhs, sizes, preferred_element_type=dtype, group_offset=offset,
                    num_actual_groups=local)

    return forward, specs


def _with_vjp(forward):
    def backward(lhs, rhs, sizes, offset):
        out, vjp = jax.vjp(lambda a, b: forward(a, b, sizes, offset), lhs, rhs)
        return out, vjp(jnp.ones_like(out))

    return backward


def _lower(fn, specs):
    try:
        return cuda_export.export_for_cuda(fn, specs).mlir_module()
    except RuntimeError as error:  # newer jaxlibs compile Triton while lowering
        if "compilation handler" in str(error):
            pytest.skip(f"this jaxlib compiles Triton at lowering and has no CUDA compiler here: {error}")
        raise


# The forward and its VJP, lowered together: the forward's own lowering is a part of it (a
# forward of more than one kernel would make more than three), so it is not lowered again alone.
@pytest.mark.parametrize("op", [GMM, TGMM])
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=[s[0] for s in MOE_SHAPES])
def test_lowers_for_cuda(shape, op):
    name, m, k, n, groups, local = shape
    dtype = jnp.float32 if name == "odd" else jnp.bfloat16  # odd also covers the f32/TF32 path
    forward, specs = (_gmm_problem if op == GMM else _tgmm_problem)(m, k, n, groups, local, dtype)
    started = time.perf_counter()
    text = _lower(_with_vjp(forward), specs)
    seconds = time.perf_counter() - started
    calls = cuda_export.count_triton_calls(text)
    targets = sorted(set(re.findall(r"custom_call @([\w$.]+)\(", text)))
    # the forward kernel, then one gmm and one tgmm (or two gmms) for the VJP
    assert calls == 3, (calls, targets)
    # Nothing reads group_sizes on the host: no loops (whose conditions a GPU sends to the host)
    # and no custom call besides the kernels (no host callbacks).
    assert "stablehlo.while" not in text
    assert set(targets) <= set(cuda_export.triton_call_targets()), targets
    for launch in cuda_export.triton_launches(text):
        assert launch.name.startswith("kernelhub_") and launch.grid >= 1
    assert seconds < 60, f"lowering {name} {op} with its VJP took {seconds:.1f}s"


def test_lowering_for_cuda_without_a_gpu_names_one_inside_kernelhub_calls_only():
    """jax 0.11's Pallas Triton lowering asks the host or an abstract mesh which GPU it compiles
    for and refuses where none is named (jax 0.10.2 assumed an H100): kernelhub's calls lower
    for cuda from this GPU-less host as on 0.10.2, while a Pallas Triton kernel of the user's
    own keeps jax's rule (on 0.11, its RuntimeError)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    if jax.devices()[0].platform == "gpu":
        pytest.skip("the host names its GPU")
    specs = [jax.ShapeDtypeStruct((64, 32), jnp.float32),
             jax.ShapeDtypeStruct((2, 32, 16), jnp.float32),
             jax.ShapeDtypeStruct((2,), jnp.int32)]
    gmm = kernelhub.get(GMM, platform="triton", backend="gpu")
    assert cuda_export.count_triton_calls(_lower(gmm, specs)) == 1

    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def users_kernel(x):
        return pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              compiler_params=pltriton.CompilerParams())(x)

    try:
        from jax._src.pallas.triton import gpu_info  # noqa: F401
    except ImportError:  # jax 0.10.2 assumes the GPU for every kernel
        assert cuda_export.count_triton_calls(_lower(users_kernel, specs[:1])) == 1
    else:
        with pytest.raises(RuntimeError, match="No supported GPU devices"):
            _lower(users_kernel, specs[:1])


def test_lowers_for_cuda_with_existing_out_and_transposed_rhs():
    gmm = kernelhub.get(GMM, platform="triton", backend="gpu")
    m, k, n, groups = 1000, 520, 200, 7
    specs = [jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
             jax.ShapeDtypeStruct((groups, n, k), jnp.bfloat16),
             jax.ShapeDtypeStruct((groups,), jnp.int32),
             jax.ShapeDtypeStruct((m, n), jnp.bfloat16)]

    def forward(lhs, rhs, sizes, existing):
        return gmm(lhs, rhs, sizes, preferred_element_type=jnp.bfloat16, existing_out=existing,
                   transpose_rhs=True)

    text = _lower(forward, specs)
    assert cuda_export.count_triton_calls(text) == 1
    # existing_out is aliased to the output: the kernel writes into it, no extra buffer
    assert "output_operand_alias" in text or "operand_output_alias" in text or "tf.aliasing_output" in text


@pytest.mark.skipif(jax.default_backend() == "gpu",
                    reason="a CPU host's check: on a GPU the kernels run compiled")
def test_every_interpreted_kernel_call_is_lowered_for_cuda_after_its_test():
    """tests/lowered_twins.py, for the Triton kernels: a forward and its gradients interpreted
    here note three kernel calls, each lowered for cuda to a Triton kernel once however often
    it ran (its failure path: tests/test_mosaic_gpu.py's test of the same name)."""
    import lowered_twins

    # forward, lhs gradient (gmm again), weight gradient
    assert lowered_twins.lowered_for_a_forward_with_gradients("triton") == (3, [])


def _offset_bits(triton_ir: str) -> dict[int, set[int]]:
    """For each kernel argument (by position), the integer widths its pointer offsets are
    added in (`tt.addptr` on a splat of `%argN`)."""
    defined: dict[str, str] = {}
    bits: dict[int, set[int]] = {}
    for line in triton_ir.splitlines():
        found = re.match(r"\s*(%\w+) = (.*)", line)
        if not found:
            continue
        name, body = found.groups()
        added = re.match(r"tt\.addptr (%\w+), %\w+ : .*, (?:tensor<[\dx]+x)?i(\d+)>?$", body)
        if added:
            source = re.match(r"tt\.splat %arg(\d+) ", defined.get(added.group(1), ""))
            if source:
                bits.setdefault(int(source.group(1)), set()).add(int(added.group(2)))
        defined[name] = body
    return bits


E4M3 = jnp.float8_e4m3fn


@pytest.mark.parametrize("op, lhs_shape, rhs_shape, dtype, wide", [
    # DeepSeek-V3's experts in fp8: 256 x 7168 x 2048 = 3.8e9 elements, 3.8 GB. (In int8 too
    # until 2026-11-28: offsets widen by element count whatever the 8-bit dtype, through the
    # same pointer arithmetic, so e4m3 stands for both.)
    (GMM, (16384, 7168), (256, 7168, 2048), E4M3, {"rhs"}),
    # 786432 tokens of 4096 in fp8: 3.2e9 elements
    (GMM, (786432, 4096), (8, 4096, 512), E4M3, {"lhs"}),
    (TGMM, (4096, 786432), (786432, 256), E4M3, {"lhs"}),
    # below 2**31 elements 32-bit offsets are safe, and kept (they are faster)
    (GMM, (8192, 2048), (128, 2048, 768), E4M3, set()),
    (GMM, (16384, 7168), (32, 7168, 2048), jnp.bfloat16, set()),
])
def test_offsets_are_64_bit_exactly_for_operands_of_2_31_elements(op, lhs_shape, rhs_shape,
                                                                   dtype, wide):
    """Pallas widens offsets by bytes (> 2**32), but they count elements: an 8-bit operand of
    2**31 to 2**32 elements would get 32-bit offsets that wrap negative past group 147 of
    DeepSeek-V3's experts. Lowered for CUDA on this host, the Triton IR shows the width."""
    fn = kernelhub.get(op, platform="triton", backend="gpu")
    groups = rhs_shape[0] if op == GMM else 8
    specs = [jax.ShapeDtypeStruct(lhs_shape, jnp.bfloat16),
             jax.ShapeDtypeStruct(rhs_shape, jnp.bfloat16),
             jax.ShapeDtypeStruct((groups,), jnp.int32)]
    operand_axes = (1, 1) if op == GMM else (1, 0)

    def forward(lhs, rhs, sizes):
        if dtype != jnp.bfloat16:
            lhs, rhs = (kernelhub.quantize(x, dtype, axis=axis)
                        for x, axis in zip((lhs, rhs), operand_axes))
        return fn(lhs, rhs, sizes, preferred_element_type=jnp.bfloat16)

    try:
        (module,) = cuda_export.triton_modules(forward, specs)
    except RuntimeError as error:
        pytest.skip(str(error))
    bits = _offset_bits(module.ir)
    # arguments: the visit table, lhs, rhs, then scales and the output
    for name, position in (("lhs", 1), ("rhs", 2)):
        assert bits[position] == ({64} if name in wide else {32}), (name, bits)
    assert all(widths == {32} for position, widths in bits.items() if position > 2), bits


# ---------------------------------------------------------------- PTX for Hopper, without a GPU


# Qwen3-MoE's kernels also compiled to PTX (2026-11-26); CI's time keeps DeepSeek-V3 for the
# fine-grained shapes (test_lowers_for_cuda lowers all four). One op per shape, in turn
# (both until 2026-11-28): either op's VJP compiles all three kernels (gmm, gmm with
# transpose_rhs, tgmm) at the shape's sizes, as the other's does.
PTX_CASES = [(shape, op) for shape, op in zip(
    [shape for shape in MOE_SHAPES if shape[0] != "qwen3-moe"], [GMM, TGMM, GMM])]


@pytest.mark.parametrize("shape, op", PTX_CASES,
                         ids=[f"{shape[0]}-{op}" for shape, op in PTX_CASES])
def test_compiles_to_hopper_ptx(shape, op):
    """The kernels of forward and backward compile for sm_90 within shared memory, on tensor
    cores, with vectorised pipelined loads. Needs the `triton` package (else skipped)."""
    from kernelhub._verify import ptx as ptx_check

    if (reason := ptx_check.available()) is not None:
        pytest.skip(reason)
    name, m, k, n, groups, local = shape
    dtype = jnp.float32 if name == "odd" else jnp.bfloat16
    forward, specs = (_gmm_problem if op == GMM else _tgmm_problem)(m, k, n, groups, local, dtype)
    try:
        modules = cuda_export.triton_modules(_with_vjp(forward), specs)
    except RuntimeError as error:
        pytest.skip(str(error))
    for module in modules:
        report = ptx_check.compile_to_ptx(module.ir, module.num_warps, module.num_stages)
        where = f"{name} {module.name} (warps {module.num_warps}, stages {module.num_stages})"
        assert report.shared_bytes <= ptx_check.HOPPER_SHARED_BYTES, where
        assert report.wgmma > 0, f"{where}: no wgmma"
        assert report.wgmma_serialized is not True, f"{where}: ptxas serialized the wgmmas"
        if dtype == jnp.bfloat16:  # aligned 16-bit shapes: every operand load vectorised
            assert report.overlapped_wgmma, f"{where}: tensor-core steps do not overlap"
            assert report.async_copies_16b > 0 and report.scalar_loads == 0, (where, report)


# ---------------------------------------------------------------- the GPU benchmark's plumbing


def test_gpu_benchmark_refuses_without_a_gpu(capsys, tmp_path):
    from kernelhub._cli.bench import gpu as bench_gpu

    if bench_gpu.gpu_missing() is None:
        pytest.skip("a GPU is present")
    parser = __import__("argparse").ArgumentParser()
    bench_gpu.add_gpu_arguments(parser)
    assert bench_gpu.run_gpu_benchmark(parser.parse_args(["--gpu-out", str(tmp_path)])) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_gpu_benchmark_report_with_fake_timings():
    from kernelhub._cli.bench import gpu as bench_gpu

    mixtral, qwen = bench_gpu.SHAPES[0], bench_gpu.SHAPES[2]
    flops = 2.0 * mixtral.m * mixtral.k * mixtral.n
    results = [
        bench_gpu.Measurement(mixtral, "balanced", "gmm forward", flops,
                              {"kernelhub": flops / 600e12, "dense": flops / 750e12,
                               "ragged_dot": flops / 300e12}, 1e-3),
        bench_gpu.Measurement(qwen, "skewed", "tgmm", flops,
                              {"kernelhub": flops / 400e12, "dense": flops / 700e12,
                               "ragged_dot": None}, None),
    ]
    header = {"date": "today", "device": "gpu: NVIDIA H200", "jax": "0.11.2"}
    report = bench_gpu.markdown_report(results, header)
    assert "| mixtral | balanced | gmm forward | 600.0 | 750.0 | 300.0 | 0.80 | 2.0 | 1.0e-03 |" in report
    assert "| qwen3-moe | skewed | tgmm | 400.0 | 700.0 | - | 0.57 | - | - |" in report
    assert ">= 70% of dense (aim 85%): 80% -> met" in report
    assert "device: gpu: NVIDIA H200" in report
    record = bench_gpu.as_record(results[0])
    assert record["tflops"]["kernelhub"] == pytest.approx(600.0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gpu_benchmark_inputs_keep_the_benchmarked_dtype(dtype):
    """Every operand is drawn in the dtype the table names (a numpy float64 scale once made the
    weights float32, so that the first H100 run timed bf16 x f32 gmms on TF32 tiles)."""
    from kernelhub._cli.bench import gpu as bench_gpu

    problem = bench_gpu.make_problem(bench_gpu.SMOKE_SHAPES[0], "balanced", dtype)
    for name in ("lhs", "lhs_t", "rhs", "d_out"):
        assert getattr(problem, name).dtype == jnp.dtype(dtype), name


def test_gpu_benchmark_passes_run_and_agree_with_ragged_dot_in_smoke_mode():
    from kernelhub._cli.bench import gpu as bench_gpu

    shard = bench_gpu.SMOKE_SHAPES[1]  # 2 local experts of 8: group_offset and skipped rows
    results = bench_gpu.measure_shape(shard, "skewed", jnp.float32, reps=1, warmup=0)
    assert [r.pass_name for r in results] == list(bench_gpu.PASSES)
    # Both sides use TF32 on a GPU, differently rounded.
    tolerance = 2e-2 if jax.default_backend() == "gpu" else 1e-5
    for result in results:
        assert all(seconds for seconds in result.seconds.values()), result
        assert result.max_relative_error < tolerance, result


def test_gpu_benchmark_quantized_rows_run_in_smoke_mode():
    """The 8-bit rows (kernelhub's quantized gmm beside dense bf16 and dense 8-bit matmuls) run
    end to end; kernelhub's result matches the xla implementation's up to the bf16 output."""
    from kernelhub._cli.bench import gpu as bench_gpu
    from kernelhub._cli.bench import gpu_quantized as quantized

    shard = bench_gpu.SMOKE_SHAPES[1]
    # Each way the bench makes a row, once: both operands quantized per channel beside the int8
    # floor (int32 sums), in scale blocks beside the fp8 floor (per channel), and the weights
    # alone (w4a16, no 8-bit floor). Left out, as the same rows with other values: the N-major
    # ones (the weights' layout), e4m3 per channel (int8's row with the fp8 floor), MXFP8 (the
    # blocked row in MX blocks) and MXFP4 (int4's row); the GPU runs time them all.
    left_out = ("e4m3 x e4m3", "int8 x int8", "e4m3 x e4m3, K-major weights",
                "mxfp8 x mxfp8, K-major weights", "bf16 x mxfp4, K-major weights")
    formats = [f for f in quantized.FORMATS if f.name not in left_out]
    assert len(formats) == len(quantized.FORMATS) - len(left_out)
    results = quantized.measure_quantized(shard, reps=1, warmup=0, formats=formats)
    assert [r.format for r in results] == [f.name for f in formats]
    for result in results:
        assert all(result.seconds.values()), result
        assert result.max_relative_error < 1e-2, result
    table = "\n".join(quantized.markdown_lines(results))
    assert "| smoke-shard | int8 x int8, K-major weights |" in table
    assert quantized.as_record(results[0])["tflops"]["dense 8-bit"] > 0


def test_narrow_dot_lowers_in_pallas_triton_kernels_with_this_jax():
    """The Triton lowering of 8-bit dots reaches into jax's Pallas internals; when a jax release
    moves them the kernels quietly widen 8-bit tiles to bf16, and this test says so."""
    from kernelhub._pallas.gpu import _narrow_dot

    assert _narrow_dot.triton_lowering_missing() is None


def _quantized_kernels(op, lhs_dtype, rhs_dtype, transpose_rhs=False, block_size=None):
    """The PTX reports of forward and backward (jax.vjp) of `op` at the Qwen3-MoE shape, with
    lhs and rhs quantized per channel (or in blocks of `block_size` along the contraction) to
    these dtypes (None: left bf16)."""
    from kernelhub._verify import ptx as ptx_check

    if (reason := ptx_check.available()) is not None:
        pytest.skip(reason)
    m, k, n, groups = 8192, 2048, 768, 128
    fn = kernelhub.get(op, platform="triton", backend="gpu")
    if op == GMM:
        shapes = [(m, k), (groups, n, k) if transpose_rhs else (groups, k, n)]
        axes = [1, 2 if transpose_rhs else 1]
        options = dict(transpose_rhs=transpose_rhs)
    else:
        shapes, axes, options = [(k, m), (m, n)], [1, 0], {}
    specs = [jax.ShapeDtypeStruct(shape, jnp.bfloat16) for shape in shapes]
    specs.append(jax.ShapeDtypeStruct((groups,), jnp.int32))

    def operand(x, dtype, axis):
        return x if dtype is None else kernelhub.quantize(x, dtype, axis=axis,
                                                          block_size=block_size)

    def step(lhs, rhs, sizes):
        def forward(lhs, rhs):
            return fn(operand(lhs, lhs_dtype, axes[0]), operand(rhs, rhs_dtype, axes[1]), sizes,
                      preferred_element_type=jnp.bfloat16, **options)
        out, vjp = jax.vjp(forward, lhs, rhs)
        return out, vjp(jnp.ones_like(out))

    try:
        modules = cuda_export.triton_modules(step, specs)
    except RuntimeError as error:
        pytest.skip(str(error))
    assert len(modules) == 3  # the forward kernel, then the two of the backward
    return [ptx_check.compile_to_ptx(module.ir, module.num_warps, module.num_stages)
            for module in modules]


EIGHT_BIT_WGMMA = (".e4m3", ".e5m2", ".s8")
INT4, E2M1 = jnp.int4, jnp.float4_e2m1fn


_QUANTIZED_PAIRS = [
    (E4M3, E4M3, "f32.e4m3.e4m3"),
    (E4M3, E5M2, "f32.e4m3.e5m2"),
    (INT8, INT8, "s32.s8.s8"),
    (None, INT8, "f32.bf16.bf16"),  # weight-only: the int8 tiles widen to bf16 in registers
    # 4-bit operands are read packed and unpacked per tile (kernelhub/_pallas/gpu/_four_bit.py):
    # int4 to int8 and e2m1 to e4m3, multiplied on the 8-bit wgmma; beside bf16, widened.
    (INT4, INT4, "s32.s8.s8"),  # N-major (not transposed): bf16, asserted below
    (E2M1, E2M1, "f32.e4m3.e4m3"),
    (None, INT4, "f32.bf16.bf16"),
]
# Every pair but e4m3 x e5m2 with N-major weights; K-major (transpose_rhs) where the path
# differs: 8-bit tiles straight from memory to the tensor cores (e4m3 x e5m2) and int4's 8-bit
# wgmma. Each pair's wgmma type is checked in one layout.
# Weight-only pairs, e5m2 x e5m2 and e2m1 transposed also passed (2026-11-26), left out of CI;
# so are, since 2026-11-27, int8 K-major (8 s; the fp8 K-major case takes the same 8-bit path)
# and e5m2 x e5m2 N-major (e4m3 x e5m2 checks e5m2 tiles), and since 2026-11-28 e4m3 x e4m3
# K-major and e4m3 x e5m2 N-major (each layout's fp8 path runs with the other pair); the GPU
# runs pass them.
_K_MAJOR = {(E4M3, E5M2), (INT4, INT4)}
_N_MAJOR = {(lhs, rhs) for lhs, rhs, _ in _QUANTIZED_PAIRS} - {(E4M3, E5M2)}


@pytest.mark.parametrize("lhs_dtype, rhs_dtype, forward_wgmma, transpose_rhs", [
    (lhs, rhs, wgmma, transpose) for transpose in (False, True)
    for lhs, rhs, wgmma in _QUANTIZED_PAIRS
    if (lhs, rhs) in (_K_MAJOR if transpose else _N_MAJOR)])
def test_quantized_gmm_compiles_to_hopper_ptx(lhs_dtype, rhs_dtype, forward_wgmma,
                                              transpose_rhs):
    """Quantized operands (one scale per row and column, applied around the kernels) exported
    for CUDA: int8 x int8 and fp8 x fp8 forward kernels multiply on Hopper's 8-bit wgmma, with
    the contraction's fp8 partial sums promoted to float32 (kernelhub/_pallas/gpu/_narrow_dot.py);
    every kernel fits shared memory. Needs the `triton` package (else skipped)."""
    from kernelhub._verify import ptx as ptx_check

    forward, *backward = _quantized_kernels(GMM, lhs_dtype, rhs_dtype, transpose_rhs)
    for report in (forward, *backward):
        assert report.shared_bytes <= ptx_check.HOPPER_SHARED_BYTES, report
        assert report.wgmma > 0, report
    if rhs_dtype == INT4 and lhs_dtype == INT4 and not transpose_rhs:
        forward_wgmma = "f32.bf16.bf16"  # test_quantized_tgmm_compiles_to_hopper_ptx says why
    assert forward.wgmma_types == {forward_wgmma}, forward
    # ptxas keeps the wgmma pipeline: fp8's promotion adds come once per k block, after the
    # block's wgmmas (adds between them would serialize every wgmma of the kernel).
    assert forward.wgmma_serialized is not True, forward
    if forward_wgmma.startswith("f32.e"):
        # fp8 partial sums are promoted: float32 adds into the accumulator (the kernel has none
        # other; without maxNumImpreciseAcc <= block_k there are none at all).
        assert "add.f32" in forward.ptx
    four_bit = jnp.dtype(rhs_dtype) in (jnp.dtype(INT4), jnp.dtype(E2M1))
    if transpose_rhs and lhs_dtype is not None and not four_bit:
        # Both tiles K-major: memory to tensor cores (4-bit tiles pass through registers).
        assert forward.shared_byte_stores == 0 and forward.async_copies_16b > 0, forward
        assert forward.scalar_loads == 0, forward
    if not transpose_rhs and lhs_dtype is not None and forward_wgmma != "f32.bf16.bf16":
        if four_bit:
            # An N-major 8-bit tile is transposed through registers (8-bit wgmma reads K-major).
            assert forward.shared_byte_stores > 0, forward
        else:
            # At 64 rows per expert, N-major 8-bit weights are copied K-major first
            # (grouped_matmul.K_MAJOR_COPY_ROWS): no tile is transposed in the kernel.
            assert forward.shared_byte_stores == 0 and forward.async_copies_16b > 0, forward
    # The backward products pair a float cotangent (scales folded in) with a quantized operand:
    # widened tiles, never 8-bit wgmma.
    for report in backward:
        assert not any(t.endswith(EIGHT_BIT_WGMMA) for t in report.wgmma_types), report
        assert report.wgmma_serialized is not True, report


@pytest.mark.parametrize("dtype, forward_wgmma", [
    (E4M3, "f32.e4m3.e4m3"), (INT8, "s32.s8.s8"), (E2M1, "f32.e4m3.e4m3"),
    # An N-major int8 tile unpacked in registers is one Triton cannot lay out for the int8
    # wgmma ("Illegal shared layout"): int4 rhs tiles along n widen to bf16 (_four_bit.py).
    (INT4, "f32.bf16.bf16")])
def test_quantized_tgmm_compiles_to_hopper_ptx(dtype, forward_wgmma):
    """tgmm of two operands quantized along m (scales per k and per n, outside the kernel): the
    forward kernel sums the rows on 8-bit wgmma too. (With fp8, its 128-row k tiles on one
    warpgroup make Triton promote between wgmmas, and ptxas serializes them: docs/gpu.md.)"""
    from kernelhub._verify import ptx as ptx_check

    forward, *backward = _quantized_kernels(TGMM, dtype, dtype)
    assert forward.wgmma_types == {forward_wgmma}, forward
    for report in (forward, *backward):
        assert report.shared_bytes <= ptx_check.HOPPER_SHARED_BYTES and report.wgmma > 0, report
    for report in backward:
        assert not any(t.endswith(EIGHT_BIT_WGMMA) for t in report.wgmma_types), report


@pytest.mark.parametrize("op, dtype, forward_wgmma", [
    (GMM, E4M3, "f32.e4m3.e4m3"), (GMM, INT8, "s32.s8.s8"), (TGMM, E4M3, "f32.e4m3.e4m3")])
def test_scale_blocks_compile_to_hopper_ptx(op, dtype, forward_wgmma):
    """DeepSeek-style blocks of 128 along the contraction, scaled inside the forward kernel:
    each block's 8-bit wgmma sums are scaled and added in float32, and the kernels fit shared
    memory. The backward products dequantize the blocked operand (widened tiles)."""
    from kernelhub._verify import ptx as ptx_check

    forward, *backward = _quantized_kernels(op, dtype, dtype, block_size=128)
    assert forward.wgmma_types == {forward_wgmma}, forward
    assert forward.wgmma_serialized is not True, forward
    for report in (forward, *backward):
        assert report.shared_bytes <= ptx_check.HOPPER_SHARED_BYTES and report.wgmma > 0, report
    for report in backward:
        assert not any(t.endswith(EIGHT_BIT_WGMMA) for t in report.wgmma_types), report


@pytest.mark.parametrize("op", [GMM, TGMM])
def test_raw_int8_with_int32_results_compiles_to_int8_wgmma(op):
    """lax's int8 x int8 -> int32 (what qwix and AQT call): the tiles multiply as stored on
    Hopper's int8 tensor cores and the int32 total is written as it is, at the Qwen3-MoE shape."""
    from kernelhub._verify import ptx as ptx_check

    if (reason := ptx_check.available()) is not None:
        pytest.skip(reason)
    m, k, n, groups = 8192, 2048, 768, 128
    fn = kernelhub.get(op, platform="triton", backend="gpu")
    shapes = [(m, k), (groups, k, n)] if op == GMM else [(k, m), (m, n)]
    specs = [jax.ShapeDtypeStruct(shape, jnp.int8) for shape in shapes]
    specs.append(jax.ShapeDtypeStruct((groups,), jnp.int32))

    def forward(lhs, rhs, sizes):
        return fn(lhs, rhs, sizes, preferred_element_type=jnp.int32)

    try:
        (module,) = cuda_export.triton_modules(forward, specs)
    except RuntimeError as error:
        pytest.skip(str(error))
    report = ptx_check.compile_to_ptx(module.ir, module.num_warps, module.num_stages)
    assert report.wgmma_types == {"s32.s8.s8"}, report.wgmma_types
    assert re.search(r"st\.global[.\w]*\.(b32|s32|u32|v2\.b32|v4\.b32)", report.ptx)  # int32 out
    assert "cvt.rn.f32.s32" not in report.ptx  # never through float32


def _global_stores(ptx: str) -> list[str]:
    """The global store instructions of a kernel's PTX (e.g. "st.global.v4.b32"), one per use."""
    return re.findall(r"\bst\.global[.\w]*", ptx)


def test_glu_compiles_to_hopper_ptx_and_stores_only_the_output():
    """A fused SwiGLU (glu="silu", bf16) exported for CUDA: the forward kernel multiplies on
    wgmma, keeps its loads vectorised and pipelined in both layouts, and stores one kind of
    value, the gated output: no more global stores than the kernel without a glu writing the
    same output tile (block_n counts the rhs columns a program reads, gate and up together), so
    the pre-activation is never written."""
    from kernelhub._verify import ptx as ptx_check

    if (reason := ptx_check.available()) is not None:
        pytest.skip(reason)
    m, k, n, groups = 512, 256, 256, 8
    fn = kernelhub.get(GMM, platform="triton", backend="gpu")

    def report(glu, layout, block_n, bias):
        n_rhs = 2 * n if glu else n
        specs = [jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                 jax.ShapeDtypeStruct((groups, k, n_rhs), jnp.bfloat16),
                 jax.ShapeDtypeStruct((groups,), jnp.int32),
                 jax.ShapeDtypeStruct((groups, n_rhs), jnp.float32)]

        def forward(lhs, rhs, sizes, bias_values):
            return fn(lhs, rhs, sizes, preferred_element_type=jnp.bfloat16, glu=glu,
                      glu_layout=layout, bias=bias_values if bias else None,
                      tiling=(64, 64, block_n))

        try:
            (module,) = cuda_export.triton_modules(forward, specs)
        except RuntimeError as error:
            pytest.skip(str(error))
        return ptx_check.compile_to_ptx(module.ir, module.num_warps, module.num_stages)

    plain = report(None, "concatenated", 128, bias=False)
    plain_stores = _global_stores(plain.ptx)
    assert plain_stores and len(set(plain_stores)) == 1, plain_stores
    for layout, bias in (("concatenated", False), ("interleaved", True)):
        gated = report("silu", layout, 256, bias)
        where = f"glu silu {layout}{' with bias' if bias else ''}"
        assert gated.wgmma > 0 and gated.wgmma_types == {"f32.bf16.bf16"}, (where, gated)
        assert gated.wgmma_serialized is not True, where
        assert gated.shared_bytes <= ptx_check.HOPPER_SHARED_BYTES, where
        assert gated.overlapped_wgmma and gated.scalar_loads == 0, (where, gated)
        stores = _global_stores(gated.ptx)
        assert len(set(stores)) == 1, (where, stores)  # the bf16 output, nothing else
        assert len(stores) <= len(plain_stores), (where, len(stores), len(plain_stores))


# ---------------------------------------------------------------- 4-bit operands


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.float4_e2m1fn])
def test_four_bit_tiles_unpack_to_the_exact_eight_bit_values(dtype):
    """Every 4-bit value, packed two to a byte as the kernels take it and unpacked as their
    tiles are, is the 8-bit value (int8, e4m3) equal to it, in its place."""
    from kernelhub._pallas.gpu import _four_bit

    codes = np.arange(16, dtype=np.uint8)
    values = jax.lax.bitcast_convert_type(jnp.asarray(codes).astype(jnp.uint4), dtype)
    tile = jnp.stack([values, values[::-1]])  # [2, 16]: each value at an even and an odd place
    packed, packing = _four_bit.packed(tile)
    assert packed.dtype == jnp.uint8 and packed.shape == (2, 8)
    unpacked = packing.unpacked(packed)
    assert unpacked.dtype == _four_bit.tile_dtype(dtype)
    np.testing.assert_array_equal(np.asarray(unpacked.astype(jnp.float32)),
                                  np.asarray(tile.astype(jnp.float32)))
    if dtype == jnp.float4_e2m1fn:  # the sign of -0 too
        np.testing.assert_array_equal(np.signbit(np.asarray(unpacked.astype(jnp.float32))),
                                      np.signbit(np.asarray(tile.astype(jnp.float32))))


# Each layout with one form, the forms in turn; the odd gate half (widened first) with both,
# as each widens to its own 8-bit tiles (int8, e4m3).
@pytest.mark.parametrize("form, n, glu_layout", [
    ("int4", 48, "concatenated"), ("nvfp4", 48, "interleaved"), ("int4", 40, None),
    ("int4", 42, "concatenated"), ("nvfp4", 42, "concatenated")])
def test_packed_four_bit_weights_meet_the_reference_at_their_edges(form, n, glu_layout):
    """4-bit weights read packed by the Triton kernel (interpret mode here; the GPU runs it in
    scripts/gpu_bench.sh): ragged k and n tiles, both glu layouts (a concatenated gate half of
    odd width, 21 columns of 42, cannot be split into bytes along n, so it is widened first),
    against float64 of the dequantized operands."""
    rng = np.random.default_rng(11)
    m, k, groups = 40, 96, 3
    sizes = np.array([13, 0, 20], np.int32)
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((groups, k, n)), jnp.float32)
    if form == "int4":
        weights = kernelhub.quantize(rhs, jnp.int4, axis=1, block_size=32)
    else:
        weights = kernelhub.quantize(rhs, form, axis=1)
    gmm = kernelhub.get(GMM, platform="triton")
    glu = {} if glu_layout is None else dict(glu="silu", glu_layout=glu_layout)
    out = gmm(lhs, weights, jnp.asarray(sizes), **glu)
    z = reference.gmm(np.asarray(lhs, np.float64), np.asarray(weights.dequantize(), np.float64),
                      sizes)
    want = z if glu_layout is None else reference.epilogue(z, glu="silu", glu_layout=glu_layout)
    assert_close(out, want, jnp.float32, contraction=k)


@pytest.mark.parametrize("m", [96, 95])
def test_packed_four_bit_tgmm_rows_meet_the_reference(m):
    """tgmm of e2m1 lhs and int4 rhs, both quantized along m, read packed along m (lhs) and n
    (rhs); an odd m gets a zero value appended to make whole bytes."""
    rng = np.random.default_rng(12)
    k, n = 24, 16
    sizes = np.array([30, 0, m - 30], np.int32)
    lhs = kernelhub.quantize(jnp.asarray(rng.standard_normal((k, m)), jnp.float32), "nvfp4",
                             axis=1)
    rhs = kernelhub.quantize(jnp.asarray(rng.standard_normal((m, n)), jnp.float32), jnp.int4,
                             axis=0, block_size=32)
    out = kernelhub.get(TGMM, platform="triton")(lhs, rhs, jnp.asarray(sizes))
    want = reference.tgmm(np.asarray(lhs.dequantize(), np.float64),
                          np.asarray(rhs.dequantize(), np.float64), sizes)
    assert_close(out, want, jnp.float32, contraction=m)
