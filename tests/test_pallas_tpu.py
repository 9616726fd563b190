"""The Pallas TPU kernels beyond the shared contract suite (which runs them in interpret mode):

- their schedules, simulated in numpy for many group-size patterns;
- a few cases in the TPU memory simulator, which flags data races and reads of memory no one
  wrote (it fills fresh buffers with NaN);
- tiling rules and defaults;
- ahead-of-time compilation for TPU v4, v5e, v5p, v6e and v7x at real MoE shapes (needs libtpu,
  the `tpu` extra; marked slow).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelhub
from kernelhub._grouped_matmul.problem import Kernel, Problem
import reference
from conftest import assert_close, equations
from kernelhub._pallas.tpu import hardware, interpreted, schedule, tiling
from kernelhub._verify import tpu_ahead_of_time as ahead_of_time
from strategies import PATTERNS, normal, sizes_for

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"


# --- schedules ------------------------------------------------------------------------------


# One compilation per static combination, instead of one per operation and shape.
_gmm_schedule = jax.jit(schedule.gmm_schedule, static_argnums=(2, 3, 4, 5))
_tgmm_schedule = jax.jit(schedule.tgmm_schedule, static_argnums=(2, 3, 4))


def _table(plan: schedule.Schedule, fields) -> dict:
    rows = np.asarray(plan.table).reshape(len(fields), plan.items)
    return {f: rows[f] for f in fields}


def _local_rows(sizes, offset, local, m):
    owner = np.full(m, -1)
    for g, (start, end) in enumerate(reference.group_rows(sizes, m)):
        if offset <= g < offset + local:
            owner[start:end] = g - offset
    return owner


@st.composite
def _schedule_cases(draw):
    # Few distinct shapes: each new one costs XLA compilations of the schedule's ops, while the
    # sizes, offsets and patterns (values, not shapes) vary freely.
    m = draw(st.sampled_from((37, 300)))
    groups = draw(st.sampled_from((1, 12)))
    local = draw(st.sampled_from(sorted({1, (groups + 1) // 2, groups})))
    offset = draw(st.integers(0, groups - local))
    sizes = sizes_for(draw(st.sampled_from(PATTERNS)), m, groups,
                      np.random.default_rng(draw(st.integers(0, 2**31 - 1))))
    # k_tiles: one k block (held first and last alike) or several (a static argument: each
    # value costs compilations, and 2 is no different from 3).
    return m, sizes, local, offset, draw(st.sampled_from((8, 128))), draw(st.sampled_from((1, 3)))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_schedule_cases())
def test_gmm_schedule_writes_every_row_once_per_owner(case):
    """Replays the schedule the way the kernel does, on row labels instead of numbers."""
    m, sizes, local, offset, tm, k_tiles = case
    plan = _gmm_schedule(jnp.asarray(sizes), jnp.int32(offset), local, m, tm, k_tiles)
    F = schedule.GmmField
    t = _table(plan, F)
    assert plan.items == -(-m // tm) + local - 1
    written = np.full(m, -2)  # -2: never initialised; -1: zero/existing_out; j: group j's product
    seen_tiles = []
    held = None  # (lhs tile, group) of the last multiplying item
    for i in range(plan.items):
        tile = t[F.OUT_TILE][i]
        rows = slice(tile * tm, min((tile + 1) * tm, m))
        if t[F.FIRST_VISIT][i]:
            assert tile not in seen_tiles, "an output tile must be visited in one run"
            seen_tiles.append(tile)
            written[rows] = -1
        if t[F.MULTIPLIES][i]:
            assert t[F.HOLD_K][i] == -1 and t[F.LHS_TILE][i] == tile
            row = np.arange(rows.start, rows.stop)
            mine = (row >= t[F.ROW_START][i]) & (row < t[F.ROW_END][i])
            assert mine.any(), "a multiplying item must own rows of its tile"
            written[row[mine]] = t[F.GROUP][i]
            held = (t[F.LHS_TILE][i], t[F.GROUP][i])
        elif held is None:  # before any multiplying item: hold the first one's first blocks
            assert t[F.HOLD_K][i] == 0
        else:  # after one: keep its last blocks, so that nothing is fetched
            assert t[F.HOLD_K][i] == k_tiles - 1
            assert (t[F.LHS_TILE][i], t[F.GROUP][i]) == held
    assert sorted(seen_tiles) == list(range(-(-m // tm)))
    np.testing.assert_array_equal(written, _local_rows(sizes, offset, local, m))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_schedule_cases())
def test_tgmm_schedule_visits_each_group_once_with_all_its_rows(case):
    m, sizes, actual, offset, tm, _ = case
    plan = _tgmm_schedule(jnp.asarray(sizes), jnp.int32(offset), actual, m, tm)
    F = schedule.TgmmField
    t = _table(plan, F)
    covered = np.full(m, -1)
    stored, open_group = [], None
    for i in range(plan.items):
        group = t[F.GROUP][i]
        if t[F.FIRST][i]:
            assert open_group is None and group not in stored
            open_group = group
        if t[F.MULTIPLIES][i]:
            assert group == open_group
            row = t[F.TILE][i] * tm + np.arange(tm)
            mine = (row >= t[F.ROW_START][i]) & (row < t[F.ROW_END][i]) & (row < m)
            assert mine.any() and (covered[row[mine]] == -1).all()
            covered[row[mine]] = group
        if t[F.LAST][i]:
            assert group == open_group
            stored.append(group)
            open_group = None
    assert stored == list(range(actual)), "every local group's block is written, in order"
    np.testing.assert_array_equal(covered, _local_rows(sizes, offset, actual, m))


# --- the TPU memory simulator ---------------------------------------------------------------


@pytest.fixture
def simulated_tpu():
    """The kernels under the TPU memory simulator: fresh buffers hold NaN, races are tracked.

    Two cores, so the grid's parallel axes are split between them as on a megacore chip.
    """
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as simulator
    from jax.experimental.pallas import tpu as pltpu

    params = pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan",
                                   num_cores_or_threads=2)
    pltpu.reset_tpu_interpret_mode_state()

    def races_found() -> bool:
        return simulator.races is not None and simulator.races.races_found

    yield interpreted(params), races_found
    pltpu.reset_tpu_interpret_mode_state()


# (m, k, n) off every tile multiple; sizes with an empty group, an unaligned one, rows past the
# groups, and only some groups local.
SIM_SIZES = np.array([5, 0, 12, 9, 3, 4], np.int32)
SIM_M, SIM_K, SIM_N = 37, 200, 136


# Each option once, not their product: the rhs layout changes only how its blocks are indexed
# and contracted, existing_out only what an output block starts from.
@pytest.mark.parametrize("transpose_rhs, with_existing", [(False, True), (True, False)])
def test_gmm_in_memory_simulator(simulated_tpu, transpose_rhs, with_existing):
    ops, races_found = simulated_tpu
    rng = np.random.default_rng(11)
    lhs = normal(rng, (SIM_M, SIM_K), jnp.float32)
    rhs = normal(rng, (3, SIM_N, SIM_K) if transpose_rhs else (3, SIM_K, SIM_N), jnp.float32)
    existing = normal(rng, (SIM_M, SIM_N), jnp.float32) if with_existing else None
    out = ops.grouped_matmul(
        jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(SIM_SIZES), jnp.float32, (8, 128, 128),
        jnp.int32(2), None if existing is None else jnp.asarray(existing), transpose_rhs)
    out = np.asarray(out)
    assert not races_found()
    assert not np.isnan(out).any(), "a row was left unwritten or read before it was written"
    assert_close(out, reference.gmm(lhs, rhs, SIM_SIZES, 2, existing, transpose_rhs),
                 jnp.float32, jnp.float32, contraction=SIM_K)


@pytest.mark.parametrize("with_existing", [False, True])
def test_tgmm_in_memory_simulator(simulated_tpu, with_existing):
    ops, races_found = simulated_tpu
    rng = np.random.default_rng(12)
    m = 300  # three row tiles of 128
    sizes = np.array([50, 0, 120, 90, 3, 7], np.int32)
    lhs, rhs = normal(rng, (SIM_K, m), jnp.bfloat16), normal(rng, (m, SIM_N), jnp.bfloat16)
    existing = normal(rng, (4, SIM_K, SIM_N), jnp.float32) if with_existing else None
    out = ops.transposed_grouped_matmul(
        jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes), jnp.float32, (128, 64, 128),
        jnp.int32(1), 4, None if existing is None else jnp.asarray(existing))
    out = np.asarray(out)
    assert not races_found()
    assert not np.isnan(out).any()
    assert_close(out, reference.tgmm(lhs, rhs, sizes, 1, 4, existing), jnp.float32,
                 jnp.bfloat16, contraction=m)


def test_all_empty_groups_in_memory_simulator(simulated_tpu):
    ops, races_found = simulated_tpu
    rng = np.random.default_rng(13)
    sizes = np.zeros(4, np.int32)
    lhs, rhs = normal(rng, (SIM_M, SIM_K), jnp.bfloat16), normal(rng, (4, SIM_K, SIM_N), jnp.bfloat16)
    out = np.asarray(ops.grouped_matmul(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes),
                                        jnp.bfloat16, (16, 128, 128), None, None, False))
    assert not races_found()
    np.testing.assert_array_equal(out.astype(np.float32), 0)
    weights = np.asarray(ops.transposed_grouped_matmul(
        jnp.asarray(lhs.T), jnp.asarray(normal(rng, (SIM_M, SIM_N), jnp.bfloat16)),
        jnp.asarray(sizes), jnp.float32, None, None, 4, None))
    assert not races_found()
    np.testing.assert_array_equal(weights, 0)


def test_memory_simulator_does_catch_a_race(simulated_tpu):
    """The checks above mean something: two cores writing one block is reported."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    _, races_found = simulated_tpu

    def both_write_block_zero(x_ref, o_ref):
        o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32)

    racy = pl.pallas_call(
        both_write_block_zero, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2))
    jax.block_until_ready(racy(jnp.zeros((8, 128), jnp.float32)))
    assert races_found()


# --- tiling ---------------------------------------------------------------------------------


def _gmm_call(tiling_value, m=40, k=300, n=260, dtype=jnp.float32, transpose_rhs=False):
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(normal(rng, (m, k), dtype))
    rhs = jnp.asarray(normal(rng, (2, n, k) if transpose_rhs else (2, k, n), dtype))
    sizes = jnp.asarray(np.array([m // 2, m - m // 2], np.int32))
    gmm = kernelhub.get(GMM, platform="pallas")
    return gmm(lhs, rhs, sizes, tiling=tiling_value, transpose_rhs=transpose_rhs)


@pytest.mark.parametrize("bad, rule", [
    ((8, 128), "three positive block sizes"),  # the contract's own check
    ((12, 128, 128), "tm=12 must be a multiple of 8"),
    ((8, 100, 128), "tk=100 must be a multiple of 128"),
    ((8, 128, 200), "tn=200 must be a multiple of 128"),
])
def test_gmm_tiling_errors_name_the_rule(bad, rule):
    with pytest.raises(ValueError, match=rule):
        _gmm_call(bad)


def test_sixteen_bit_rows_need_sixteen_row_tiles():
    with pytest.raises(ValueError, match="tm=8 must be a multiple of 16"):
        _gmm_call((8, 128, 128), dtype=jnp.bfloat16)


def test_tgmm_rows_lie_on_lanes():
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(normal(rng, (16, 300), jnp.float32))
    rhs = jnp.asarray(normal(rng, (300, 8), jnp.float32))
    tgmm = kernelhub.get(TGMM, platform="pallas")
    with pytest.raises(ValueError, match="tm=64 must be a multiple of 128 .*lanes"):
        tgmm(lhs, rhs, jnp.asarray(np.array([100, 200], np.int32)), tiling=(64, 8, 128))


def test_callable_tiling_is_asked_per_kernel_and_checked():
    asked = []

    def lookup(m, k, n):
        asked.append((m, k, n))
        return None if k == 300 else (8, 128, 128)

    assert _gmm_call(lookup).shape == (40, 260)  # None: the default
    assert asked[-1] == (40, 300, 260)
    with pytest.raises(ValueError, match=r"tiling\(40, 300, 260\)=\(12, 128, 128\)"):
        _gmm_call(lambda m, k, n: (12, 128, 128))


def test_tiles_larger_than_the_problem_are_cut_to_it():
    out = _gmm_call((4096, 4096, 4096))
    assert out.shape == (40, 260) and not np.isnan(np.asarray(out)).any()


@pytest.mark.parametrize("generation", sorted(ahead_of_time.TOPOLOGIES))
@pytest.mark.parametrize("shape", sorted(ahead_of_time.SHAPES))
def test_default_tiles_are_legal_and_fit_vmem(generation, shape):
    chip = hardware.chip_named(generation)
    s = ahead_of_time.SHAPES[shape]
    for kernel, (m, k, n) in ((Kernel.GMM, (s.m, s.k, s.n)),
                              (Kernel.GMM_TRANSPOSED_RHS, (s.m, s.n, s.k)),
                              (Kernel.TGMM, (s.m, s.k, s.n))):
        problem = Problem(kernel, m, k, n, s.experts, s.local_experts, jnp.bfloat16,
                                 jnp.bfloat16, jnp.float32, True)
        tiles = tiling.default_for_chip(problem, chip)
        assert tiling.check(tiles.as_tuple(), problem) == tiles
        assert tiling.vmem_bytes(tiles, problem) <= chip.tile_budget_bytes


@pytest.mark.skipif(jax.default_backend() == "tpu", reason="a TPU host knows its chip")
def test_without_a_tpu_in_context_tiles_fit_every_generation():
    assert hardware.target_chip() == hardware.PORTABLE
    assert hardware.PORTABLE.vmem_bytes <= min(
        hardware.chip_named(g).vmem_bytes for g in ahead_of_time.TOPOLOGIES)


# --- ahead-of-time compilation for real TPUs ------------------------------------------------

needs_libtpu = pytest.mark.skipif(not ahead_of_time.libtpu_available(),
                                  reason="libtpu not installed (pip install 'kernelhub[tpu]')")


def _assert_compiled(result: ahead_of_time.CompileResult) -> None:
    where = f"{result.generation} {result.shape.name}"
    assert result.compiled, f"{where}: {result.error}\n{result.details}"
    assert result.ok, result.error  # Mosaic kernels, not an XLA fallback
    assert set(result.tilings) == ({"gmm", "gmm_t", "tgmm"} if result.backward else {"gmm"})


# Each generation and each shape compiles at least once; all 25 pairs compiled (v7x's on 2026-11-29)
# (`kernelhub verify --tpu`, docs/tpu.md's table), and every pair's tiles are checked against
# that table: these from their compilation, the others from their lowering (the next test),
# which takes a second where a compilation takes 8 to 17 in CI. A compilation's time grows with its tiles: v4 takes Mixtral (11 of its 16 MiB)
# besides the odd shape, and each other generation a shape whose tiles need the scoped-VMEM
# limit the kernels raise: v5e at Qwen3 (26 MiB), v5p at Mixtral's down projection (34 MiB of
# its 40 MiB budget), v6e at DeepSeek-V3 (46 MiB). (v4 at Qwen3, v5e at DeepSeek-V3 and v6e at
# the odd shape also ran in CI until 2026-11-27; v5e at Mixtral, 67 MiB in 23 s, and v5p at
# Qwen3 until 2026-11-28.) v7x (jax's "7x", since 2026-11-29) at Mixtral: 36 of its 64 MiB, above
# the scoped-VMEM default, in 2 s.
COMPILED_PAIRS = [("v4", "mixtral"), ("v4", "odd"), ("v5e", "qwen3-moe"), ("v5p", "mixtral-down"),
                  ("v6e", "deepseek-v3"), ("7x", "mixtral")]


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize("generation, shape", COMPILED_PAIRS)
def test_forward_and_backward_compile_for_tpu(generation, shape):
    """Forward gmm and its VJP (gmm for d lhs, tgmm for d rhs), default tiling, bf16; the tiles
    they compiled with are the ones docs/tpu.md shows."""
    result = ahead_of_time.compile_for(generation, ahead_of_time.SHAPES[shape])
    _assert_compiled(result)
    _assert_documented(generation, shape, result.tilings)


@needs_libtpu
def test_every_generation_and_shape_lowers_with_the_documented_tiles():
    assert {g for g, _ in COMPILED_PAIRS} == set(ahead_of_time.TOPOLOGIES)
    assert {s for _, s in COMPILED_PAIRS} == set(ahead_of_time.SHAPES)
    for generation in sorted(ahead_of_time.TOPOLOGIES):
        for shape in sorted(ahead_of_time.SHAPES):
            if (generation, shape) in COMPILED_PAIRS:
                continue  # the same step, compiled, is checked against the table above
            _assert_documented(generation, shape, ahead_of_time.lowered_tiles(
                generation, ahead_of_time.SHAPES[shape]))


def _assert_documented(generation: str, shape: str, tilings: dict) -> None:
    documented = _documented_tiles()[(generation, shape)]
    found = ["/".join(map(str, tilings[k])) for k in ("gmm", "gmm_t", "tgmm")]
    assert found == documented, (
        f"docs/tpu.md says {documented} for {generation} {shape}, the kernels got {found}: "
        f"update the table from `kernelhub verify --tpu`")


@functools.cache
def _documented_tiles() -> dict[tuple[str, str], list[str]]:
    """The tiles docs/tpu.md's table shows, by (generation, shape)."""
    rows = {}
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "tpu.md").read_text()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in ahead_of_time.TOPOLOGIES and cells[1] in ahead_of_time.SHAPES:
            rows[(cells[0], cells[1])] = cells[2:5]
    return rows


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_other_dtypes_compile_for_tpu(dtype):
    _assert_compiled(ahead_of_time.compile_for("v5e", ahead_of_time.SHAPES["odd"], dtype))


@needs_libtpu
def test_fp8_tiles_multiply_as_stored_only_where_the_fp8_mxu_is_faster():
    """fp8 x fp8 of one kind reaches the MXU as stored on v7x (its fp8 rate twice bf16's) and
    in interpret mode (so the suites' float64 checks run that path); on v6e, whose fp8 rate is
    its bf16 rate, and for two kinds, the tiles are widened to bf16. Read from the kernel's
    traced dots, for a chip of each generation."""
    from jax.experimental import topologies

    from kernelhub._pallas.tpu import grouped_matmul, transposed_grouped_matmul

    def multiplied(lhs_dtype, rhs_dtype, device=None, tgmm=False):
        """The operand dtypes of the kernel's dots: compiled for `device`'s chip, or
        interpreted without one."""
        interpret = device is None
        if tgmm:  # lhs [k, m], rhs [m, n]
            shapes = (512, 256), (256, 128)

            def kernel(lhs, rhs, sizes, offset):
                return transposed_grouped_matmul.transposed_grouped_matmul(
                    lhs, rhs, sizes, jnp.bfloat16, None, offset, 4, None, interpret=interpret)
        else:
            shapes = (256, 512), (4, 512, 128)

            def kernel(lhs, rhs, sizes, offset):
                return grouped_matmul.grouped_matmul(lhs, rhs, sizes, jnp.bfloat16, None, offset,
                                                     None, False, interpret=interpret)
        args = (jax.ShapeDtypeStruct(shapes[0], lhs_dtype),
                jax.ShapeDtypeStruct(shapes[1], rhs_dtype),
                jax.ShapeDtypeStruct((4,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
        with contextlib.nullcontext() if interpret else jax.default_device(device):
            closed = jax.make_jaxpr(kernel)(*args)
        return {tuple(v.aval.dtype.name for v in eqn.invars) for eqn in equations(closed.jaxpr)
                if eqn.primitive.name == "dot_general"}

    e4m3, e5m2 = jnp.float8_e4m3fn, jnp.float8_e5m2
    chips = {g: topologies.get_topology_desc(topology_name=ahead_of_time.TOPOLOGIES[g],
                                             platform="tpu").devices[0] for g in ("v6e", "7x")}
    assert multiplied(e5m2, e5m2, chips["7x"]) == {("float8_e5m2", "float8_e5m2")}
    assert multiplied(e4m3, e4m3, chips["7x"], tgmm=True) == {("float8_e4m3fn", "float8_e4m3fn")}
    assert multiplied(e4m3, e5m2, chips["7x"]) == {("bfloat16", "bfloat16")}
    assert multiplied(e4m3, e4m3, chips["v6e"]) == {("bfloat16", "bfloat16")}
    assert multiplied(e4m3, e4m3) == {("float8_e4m3fn", "float8_e4m3fn")}  # interpreted


def test_the_cost_model_rates_tiles_at_the_unit_that_multiplies_them():
    """tiling.estimated_seconds counts a tile's products at the rate of what multiplies them
    (mxu.compute_dtype's choice for the chip). It once counted every tile but bf16 x bf16 as
    float32 products, a quarter of bf16's rate: int8 at Mixtral's shape on v5e got 64-row
    tiles, which read each expert's weights 16 times, where its int8 MXU is twice bf16's."""
    from kernelhub._pallas.tpu import mxu

    e4m3, rate = jnp.float8_e4m3fn, mxu.products_per_second
    v5e, v6e, v7x = (hardware.chip_named(g) for g in ("v5e", "v6e", "7x"))
    assert rate(jnp.int8, jnp.int8, v5e) == v5e.int8_flops == 2 * v5e.bf16_flops
    assert rate(jnp.int4, jnp.int4, v5e) == v5e.int4_flops
    assert rate(jnp.bfloat16, jnp.int8, v5e) == v5e.bf16_flops  # widened to bf16
    assert rate(e4m3, e4m3, v7x) == v7x.fp8_flops > 1.9 * v7x.bf16_flops
    assert rate(e4m3, e4m3, v6e) == v6e.bf16_flops  # widened: the same rate there
    assert rate(jnp.float32, jnp.bfloat16, v6e) == v6e.bf16_flops / 4
    # So two 8-bit operands, half bf16's bytes at bf16's rate or faster, are never estimated
    # slower than bf16 under their default tilings, on any generation, shape or kernel.
    for generation in ahead_of_time.TOPOLOGIES:
        chip = hardware.chip_named(generation)
        for s in ahead_of_time.SHAPES.values():
            for kernel, (m, k, n) in ((Kernel.GMM, (s.m, s.k, s.n)),
                                      (Kernel.GMM_TRANSPOSED_RHS, (s.m, s.n, s.k)),
                                      (Kernel.TGMM, (s.m, s.k, s.n))):
                def estimate(dtype):
                    problem = Problem(kernel, m, k, n, s.experts, s.local_experts, dtype, dtype,
                                      jnp.bfloat16, True)
                    tiles = tiling.default_for_chip(problem, chip)
                    return tiling.estimated_seconds(tiles, problem, chip)

                bf16 = estimate(jnp.bfloat16)
                where = (generation, s.name, kernel)
                assert estimate(jnp.int8) <= bf16 and estimate(e4m3) <= bf16, where


def test_int8_tiles_use_the_int8_mxu_only_where_there_is_one():
    from kernelhub._pallas.tpu import hardware, kernel_parts, mxu

    assert mxu.compute_dtype(jnp.int8, jnp.int8, int8_mxu=True) == jnp.int8
    assert kernel_parts.accumulator_dtype(jnp.int8) == jnp.int32
    assert mxu.compute_dtype(jnp.int8, jnp.int8, int8_mxu=False) == jnp.bfloat16
    assert mxu.compute_dtype(jnp.float8_e4m3fn, jnp.bfloat16) == jnp.bfloat16
    assert mxu.compute_dtype(jnp.float32, jnp.int8, int8_mxu=True) == jnp.float32
    assert hardware.chip_named("v4").int8_flops == 0
    assert all(hardware.chip_named(name).int8_flops > 0 for name in ("v5e", "v5p", "v6e"))


def test_four_bit_tiles_use_the_int4_mxu_only_where_there_is_one():
    from kernelhub._pallas.tpu import hardware, kernel_parts, mxu

    assert mxu.compute_dtype(jnp.int4, jnp.int4, int8_mxu=True, int4_mxu=True) == jnp.int4
    assert kernel_parts.accumulator_dtype(jnp.int4) == jnp.int32
    # int4 beside int8 multiplies as int8; without an int8 MXU, and beside bf16, as bf16.
    assert mxu.compute_dtype(jnp.int4, jnp.int8, int8_mxu=True) == jnp.int8
    assert mxu.compute_dtype(jnp.int4, jnp.int4, int8_mxu=True) == jnp.int8
    assert mxu.compute_dtype(jnp.int4, jnp.int4) == jnp.bfloat16
    assert mxu.compute_dtype(jnp.bfloat16, jnp.float4_e2m1fn) == jnp.bfloat16
    assert hardware.chip_named("v4").int4_flops == 0
    assert all(hardware.chip_named(name).int4_flops > 0 for name in ("v5e", "v5p", "v6e"))


def test_e2m1_codes_decode_to_their_values_in_the_kernels():
    """Mosaic has no e2m1 vectors: the kernels take e2m1 as its 4-bit codes and decode each
    tile (kernel_parts.tile_values); every code, its sign included."""
    from kernelhub._pallas.tpu import kernel_parts

    values = jax.lax.bitcast_convert_type(jnp.arange(16, dtype=jnp.uint8).astype(jnp.uint4),
                                          jnp.float4_e2m1fn)
    codes = kernel_parts.kernel_operand(values)
    assert codes.dtype == jnp.uint4
    decoded = np.asarray(kernel_parts.tile_values(codes, jnp.float4_e2m1fn, jnp.float32))
    expected = np.asarray(values.astype(jnp.float32))
    np.testing.assert_array_equal(decoded, expected)
    np.testing.assert_array_equal(np.signbit(decoded), np.signbit(expected))


@pytest.mark.slow
@needs_libtpu
# Also compiled, outside CI for its time budget: int8 and e4m3 per channel at DeepSeek-V3 on v5p
# and Qwen3 on v6e; int4, int4 weights in blocks of 128, MXFP8, MXFP4 weights and NVFP4 at
# Mixtral on v5e, DeepSeek-V3 on v5p and Qwen3 on v6e (2026-11-26, the #27 note); int8 per
# channel at Qwen3 on v5e, e5m2 at the odd shape on v4 and int8 in blocks of 128 at DeepSeek-V3
# on v5p (CI until 2026-11-26: the cases below cover the int8 MXU, its absence on v4, fp8 and
# scale blocks). e4m3 in blocks of 128 and NVFP4 also compiled at Qwen3 on v6e (24 s and 39 s
# in CI's run, 2026-11-26); CI compiles them at the odd shape (5 s), where no tile divides an
# axis, and keeps one model shape, int4's, for the 4-bit tiles' VMEM at a real size.
@pytest.mark.parametrize("generation, quantized, shape, block_size, quantized_lhs", [
    ("v4", jnp.int8, "odd", None, True),
    ("v6e", jnp.float8_e4m3fn, "odd", 128, True), ("v5e", jnp.int8, "odd", 128, True),
    # 4-bit and MX formats: int4 x int4 on v5e's int4 MXU; e2m1 decoded from its codes per
    # tile, with NVFP4's scale blocks of 16 along k inside the forward kernel.
    ("v5e", jnp.int4, "qwen3-moe", None, True), ("v6e", "nvfp4", "odd", None, True),
    # e5m2 x e5m2 on v7x's fp8 MXU, as stored (test_fp8_tiles_multiply_as_stored_...).
    ("7x", jnp.float8_e5m2, "odd", None, True)])
def test_quantized_operands_compile_for_tpu(generation, quantized, shape, block_size,
                                            quantized_lhs):
    """Quantized tiles in the Mosaic kernels, forward and VJP: int8 x int8 on the int8 MXU
    of v5e, v5p and v6e, widened to bf16 on v4, which has none (Mosaic rejects an int8 matmul
    there); fp8 x fp8 on v7x's fp8 MXU. One scale per row and column is applied around the
    kernels; 1x128 blocks along k inside the forward kernel (the odd shape's k=520 ends in a
    partial block). A 4-bit operand is read packed (64-row tiles) and widened per tile in VMEM
    where the MXU does not take it."""
    _assert_compiled(ahead_of_time.compile_for(generation, ahead_of_time.SHAPES[shape],
                                               quantized=quantized, block_size=block_size,
                                               quantized_lhs=quantized_lhs))


@pytest.mark.slow
@needs_libtpu
# GPT-OSS also compiled for v5e (29 s) and v6e (33 s), and Mixtral's SwiGLU with bias for v5e
# (22 s), on 2026-11-25 (the #26 note), and at its own shape for v5p (40 s in CI's run,
# 2026-11-26); CI keeps the cheapest of each kind for its time budget: GPT-OSS's epilogue at
# the odd shape, and its gated forward at its shape (test_the_gated_forward_is_one_mosaic_kernel).
# GPT-OSS's epilogue compiles for v4 (v5p until 2026-11-28): the smallest VMEM, so the
# tightest fit, and smaller tiles that compile in about half v5p's time.
@pytest.mark.parametrize("generation, shape, epilogue", [
    ("v4", "odd", ahead_of_time.GPT_OSS_EPILOGUE),
    ("v5p", "odd", {"activation": "gelu", "bias": True}),
    ("v5e", "odd", {"glu": "gelu_tanh", "glu_layout": "interleaved", "bias": True}),
])
def test_epilogues_compile_for_tpu(generation, shape, epilogue):
    """Fused epilogues in the Mosaic kernel, forward and VJP (three kernels: the backward
    takes the forward kernel's pre-activation): GPT-OSS-120B's interleaved swiglu_oai with a bias,
    bias and gelu (erf), and an interleaved glu with gelu_tanh, each at a shape no tile divides.
    (DeepSeek-V3's shape with group_offset compiled too, 11 s, and bias and gelu at Qwen3's,
    17 s: left out for CI's time.)"""
    moe = ahead_of_time.GATED_SHAPES.get(shape) or ahead_of_time.SHAPES[shape]
    result = ahead_of_time.compile_for(generation, moe, epilogue=epilogue)
    assert result.compiled, f"{generation} {shape}: {result.error}\n{result.details}"
    assert result.ok and result.mosaic_calls == 3, result.error


@pytest.mark.slow
@needs_libtpu
def test_the_gated_forward_is_one_mosaic_kernel():
    """Without a gradient, GPT-OSS's gated forward compiles to the Mosaic kernel alone: no XLA
    op applies the gate, the bias or the sigmoid outside it, and none writes the [m, 2n]
    pre-activation."""
    from jax.experimental import topologies

    moe = ahead_of_time.GATED_SHAPES["gpt-oss-120b"]
    epilogue = ahead_of_time.GPT_OSS_EPILOGUE
    # What fuses does not depend on the generation; v4's smaller tiles compile in 5 s where
    # v5e's took 12 (v5e until 2026-11-28).
    device = topologies.get_topology_desc(
        topology_name=ahead_of_time.TOPOLOGIES["v4"], platform="tpu").devices[0]
    with jax.default_device(device):
        lowered = ahead_of_time.step_function(moe, jnp.bfloat16, False, epilogue=epilogue).lower(
            *ahead_of_time.argument_specs(moe, jnp.bfloat16, False, device, epilogue))
    text = lowered.compile().as_text()
    assert text.count(f'custom_call_target="{ahead_of_time.MOSAIC_CALL}"') == 1
    assert " logistic(" not in text and " multiply(" not in text
    assert f"bf16[{moe.m},{2 * moe.n}]" not in text and f"f32[{moe.m},{2 * moe.n}]" not in text


@pytest.mark.slow
@needs_libtpu
def test_an_int8_operand_of_2_31_elements_compiles_for_tpu():
    """All 256 of DeepSeek-V3's experts in int8 (3.8e9 elements, past what 32-bit element
    offsets hold), forward and VJP. The kernels name blocks per dimension (BlockSpec block
    indices, each below its axis's length) and leave addresses to Mosaic, so no offset of
    kernelhub's own can wrap; the Triton kernels' offsets are checked in test_triton_gpu.py."""
    shape = ahead_of_time.MoeShape("deepseek-v3-all-experts", 16384, 7168, 2048, 256,
                                   note="every expert on one chip")
    _assert_compiled(ahead_of_time.compile_for("v5p", shape, quantized=jnp.int8))


@pytest.mark.slow
@needs_libtpu
# v6e's int8 MXU takes the same path as v5e's (compiled until 2026-11-28).
@pytest.mark.parametrize("generation", ["v4", "v5e"])
def test_raw_int8_with_int32_results_compiles_for_tpu(generation):
    """lax's int8 x int8 -> int32 (what qwix and AQT call), gmm and tgmm at the Qwen3-MoE shape:
    the int8 MXU of v5e (v5p and v6e have one too), bf16 tiles on v4 (which has none); Mosaic
    kernels either way."""
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    m, k, n, groups = 8192, 2048, 768, 128
    gmm = kernelhub.get("grouped_matmul", platform="pallas", backend="tpu")
    tgmm = kernelhub.get("transposed_grouped_matmul", platform="pallas", backend="tpu")

    def step(lhs, rhs, d_out, sizes):
        out = gmm(lhs, rhs, sizes, preferred_element_type=jnp.int32)
        return out, tgmm(lhs.T, d_out, sizes, preferred_element_type=jnp.int32)

    topology = topologies.get_topology_desc(
        topology_name=ahead_of_time.TOPOLOGIES[generation], platform="tpu")
    device = topology.devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    specs = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in (
        ((m, k), jnp.int8), ((groups, k, n), jnp.int8), ((m, n), jnp.int8),
        ((groups,), jnp.int32))]
    with jax.default_device(device):
        compiled = jax.jit(step).lower(*specs).compile()
    text = compiled.as_text()
    assert text.count(f'custom_call_target="{ahead_of_time.MOSAIC_CALL}"') == 2
    out_types = [str(o.dtype) for o in jax.tree.leaves(compiled.out_info)]
    assert out_types == ["int32", "int32"]


@pytest.mark.slow
@needs_libtpu
def test_existing_out_aliases_and_transposed_rhs_compile_for_tpu():
    """existing_out shares the output's buffer (no copy in the kernel) in both kernels."""
    from jax.experimental import topologies

    device = topologies.get_topology_desc(topology_name=ahead_of_time.TOPOLOGIES["v6e"],
                                          platform="tpu").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    m, k, n, groups = 1000, 520, 200, 7

    def spec(shape, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    gmm = kernelhub.get(GMM, platform="pallas", backend="tpu")
    tgmm = kernelhub.get(TGMM, platform="pallas", backend="tpu")

    def step(lhs, rhs_t, sizes, out, weights):
        y = gmm(lhs, rhs_t, sizes, preferred_element_type=jnp.bfloat16, existing_out=out,
                transpose_rhs=True)
        w = tgmm(lhs.T, y, sizes, preferred_element_type=jnp.bfloat16, existing_out=weights)
        return y, w

    with jax.default_device(device):
        lowered = jax.jit(step, donate_argnums=(3, 4)).lower(
            spec((m, k)), spec((groups, n, k)), spec((groups,), jnp.int32), spec((m, n)),
            spec((groups, k, n)))
    text = lowered.compile().as_text()
    assert text.count(f'custom_call_target="{ahead_of_time.MOSAIC_CALL}"') == 2
    assert "output_to_operand_aliasing" in text


@pytest.mark.slow
@needs_libtpu
def test_lowering_outside_a_tpu_context_uses_portable_tiles():
    """Without jax.default_device(tpu) the kernels cannot see the chip: the tiles they pick
    must still compile on the generation with the least VMEM."""
    from jax.experimental import topologies

    shape = ahead_of_time.SHAPES["mixtral"]
    device = topologies.get_topology_desc(topology_name=ahead_of_time.TOPOLOGIES["v4"],
                                          platform="tpu").devices[0]
    lowered = ahead_of_time.step_function(shape, jnp.bfloat16, False).lower(
        *ahead_of_time.argument_specs(shape, jnp.bfloat16, False, device))
    tiles = ahead_of_time.kernel_tiles(lowered.compile().as_text())
    problem = Problem(Kernel.GMM, shape.m, shape.k, shape.n, shape.experts,
                             shape.local_experts, jnp.bfloat16, jnp.bfloat16, jnp.bfloat16, False)
    assert tiles == {"gmm": tiling.default_for_chip(problem, hardware.PORTABLE).as_tuple()}


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="a CPU host's check: elsewhere the suites run compiled kernels")
def test_every_interpreted_kernel_call_is_lowered_for_tpu_after_its_test():
    """tests/lowered_twins.py, for the Pallas TPU kernels: a forward and its gradients
    interpreted here note three kernel calls, each lowered for tpu to a Mosaic kernel once
    however often it ran (its failure path: tests/test_mosaic_gpu.py's test of the same
    kind)."""
    import lowered_twins

    # forward, lhs gradient (gmm again), weight gradient
    assert lowered_twins.lowered_for_a_forward_with_gradients("pallas") == (3, [])


def test_moe_shapes_are_the_ones_documented():
    s = ahead_of_time.SHAPES
    mixtral = s["mixtral"]
    assert (mixtral.m, mixtral.k, mixtral.n, mixtral.experts) == (8192, 4096, 14336, 8)
    assert (s["deepseek-v3"].experts, s["deepseek-v3"].local_experts) == (256, 32)
    assert math.prod((s["odd"].m, s["odd"].k, s["odd"].n)) == 1000 * 520 * 200


@pytest.mark.slow
@needs_libtpu
def test_verify_command_compiles_and_reports(capsys, monkeypatch):
    from kernelhub import cli

    monkeypatch.setenv("COLUMNS", "200")  # xdist's workers say 80: a tiling would fold

    assert cli.main(["verify", "--tpu", "--topologies", "v5e", "--shapes", "odd",
                     "--forward-only"]) == 0
    printed = capsys.readouterr().out
    assert "256/520/200" in printed and "ok" in printed


def test_verify_command_names_what_it_does_not_know(capsys):
    from kernelhub import cli

    assert cli.main(["verify", "--tpu", "--shapes", "mixtral,llama"]) == 2
    assert "llama" in capsys.readouterr().out


def test_int32_totals_of_bf16_carried_int8_sum_float32_only_where_exact():
    """A chip without an int8 MXU (v4) multiplies int8 values as bf16 and sums in float32,
    exact for at most 1024 products of two int8 values: a longer tile is cut into such runs,
    added in int32. 2048 products of 127 x 127 (odd, 33032192 in all) stay exact."""
    from kernelhub._pallas.tpu import kernel_parts

    lengths = []

    def dot(lhs, rhs, dtype):
        lengths.append(lhs.shape[1])
        # a float32 sum one term at a time, as a tensor core's accumulator may round (in numpy:
        # 2048 jax additions, op by op, took seconds)
        lhs, rhs = np.asarray(lhs, np.float32), np.asarray(rhs, np.float32)
        products = lhs[:, :, None] * rhs[None, :, :]
        total = np.zeros(products.shape[::2], np.float32)
        for term in np.moveaxis(products, 1, 0):
            total = total + term
        return jnp.asarray(total, dtype)

    lhs = jnp.full((2, 2048), 127, jnp.bfloat16)
    rhs = jnp.full((2048, 3), 127, jnp.bfloat16)
    total = kernel_parts.tile_product(dot, lhs, rhs, 1, 0, jnp.bfloat16, jnp.int32)
    assert lengths == [1024, 1024]
    np.testing.assert_array_equal(np.asarray(total), 2048 * 127 * 127)
    # the float32 tile's own sum would not be
    assert int(dot(lhs, rhs, jnp.float32)[0, 0]) != 2048 * 127 * 127
    # int8 tiles (an int8 MXU) and float totals are one dot, as before
    lengths.clear()
    kernel_parts.tile_product(dot, lhs, rhs, 1, 0, jnp.bfloat16, jnp.float32)
    assert lengths == [2048]
