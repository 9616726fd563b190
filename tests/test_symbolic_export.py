"""Shape-polymorphic export: every op exported with a symbolic m, serialized, and run at two m.

m is the rows of lhs: the tokens of grouped_matmul and ragged_dot, the contraction of
transposed_grouped_matmul and of ragged_dot_general's mode 2, a free lhs dim in mode 3. Each
artifact is exported once (jax.export for 'cpu', which runs kernelhub's XLA implementation;
kernelhub.export for 'cpu' and 'tpu', whose TPU branch holds the Mosaic kernels), serialized,
deserialized, and called on this CPU at two different m; results and gradients are checked
against the float64 references and against jax.lax where lax supports the case. Sizes that the
kernels need static (the group count; in mode 3 the ragged batch dim) raise one clear error, as
does the CUDA target, whose Pallas Triton lowering takes no symbolic size.
"""

from __future__ import annotations

import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import kernelhub
import kernelhub.export
import kernelhub.tuning
import ragged_reference
import reference
from conftest import assert_close
from kernelhub._grouped_matmul import tables
from kernelhub._verify import tpu_ahead_of_time
from strategies import normal

# One scope for every symbolic size of this file: jax compares only sizes of one scope.
M, G = jax.export.symbolic_shape("m, g")
F32 = jnp.float32
INT32 = jnp.int32
K, N = 16, 8
# Kernel launches of a forward pass and its VJP: the forward kernel, then d lhs and d rhs.
KERNELS_WITH_VJP = 3


def spec(shape, dtype=F32, **where) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, **where)


def round_trip(exported: jax.export.Exported) -> jax.export.Exported:
    return jax.export.deserialize(exported.serialize())


def exported_for_cpu(fn, *specs) -> jax.export.Exported:
    """Plain jax.export for 'cpu', as a user of lax would write it, serialized and back."""
    return round_trip(jax.export.export(jax.jit(fn), platforms=["cpu"])(*specs))


def sizes_for(m: int, groups: int, rng: np.random.Generator) -> np.ndarray:
    """int32 sizes summing to at most m, one of them 0."""
    cuts = np.sort(rng.integers(0, m + 1, groups))
    sizes = np.diff(np.concatenate([[0], cuts])).astype(np.int32)
    sizes[1] = 0
    return sizes


def with_vjp(op):
    """(lhs, rhs, d_out, *rest) -> (out, d_lhs, d_rhs) of op(lhs, rhs, *rest)."""

    def forward_and_vjp(lhs, rhs, d_out, *rest):
        out, pullback = jax.vjp(lambda a, b: op(a, b, *rest), lhs, rhs)
        return (out, *pullback(d_out))

    return forward_and_vjp


def reference_with_vjp(lhs, rhs, d_out, group_sizes, numbers):
    """The float64 ragged_dot_general reference (tests/ragged_reference.py) and its VJP."""
    with jax.enable_x64(True):
        out, pullback = jax.vjp(
            lambda a, b: ragged_reference.ragged_dot_general(a, b, group_sizes, numbers),
            jnp.asarray(lhs, jnp.float64), jnp.asarray(rhs, jnp.float64))
        d_lhs, d_rhs = pullback(jnp.asarray(d_out, jnp.float64))
        return np.asarray(out), np.asarray(d_lhs), np.asarray(d_rhs)


# --- grouped_matmul and transposed_grouped_matmul, through kernelhub.export ----------------------


def test_grouped_matmul_with_vjp_exported_for_cpu_and_tpu_runs_at_two_m():
    local, groups = 3, 4

    def op(lhs, rhs, group_sizes):
        return kernelhub.grouped_matmul(lhs, rhs, group_sizes, group_offset=1)

    exported = kernelhub.export.export(
        with_vjp(op), spec((M, K)), spec((local, K, N)), spec((M, N)), spec((groups,), INT32),
        platforms=("cpu", "tpu"))
    assert kernelhub.export.kernels_by_platform(exported) == {
        "cpu": {}, "tpu": {"mosaic": KERNELS_WITH_VJP}}
    runnable = round_trip(exported)
    rng = np.random.default_rng(0)
    for m in (37, 150):
        lhs, rhs = normal(rng, (m, K), F32), normal(rng, (local, K, N), F32)
        d_out, sizes = normal(rng, (m, N), F32), sizes_for(m, groups, rng)
        out, d_lhs, d_rhs = runnable.call(lhs, rhs, d_out, sizes)
        assert_close(out, reference.gmm(lhs, rhs, sizes, group_offset=1), F32, F32, contraction=K)
        want_lhs, want_rhs, _ = reference.gmm_vjp(lhs, rhs, sizes, d_out, group_offset=1)
        assert_close(d_lhs, want_lhs, F32, F32, contraction=N)
        assert_close(d_rhs, want_rhs, F32, F32, contraction=m)


def test_transposed_grouped_matmul_with_vjp_exported_for_cpu_and_tpu_runs_at_two_m():
    groups = 4

    def op(lhs, rhs, group_sizes):
        return kernelhub.transposed_grouped_matmul(lhs, rhs, group_sizes)

    exported = kernelhub.export.export(
        with_vjp(op), spec((K, M), jnp.bfloat16), spec((M, N), jnp.bfloat16),
        spec((groups, K, N)), spec((groups,), INT32), platforms=("cpu", "tpu"))
    assert kernelhub.export.kernels_by_platform(exported) == {
        "cpu": {}, "tpu": {"mosaic": KERNELS_WITH_VJP}}
    runnable = round_trip(exported)
    rng = np.random.default_rng(1)
    for m in (5, 130):
        lhs, rhs = normal(rng, (K, m), jnp.bfloat16), normal(rng, (m, N), jnp.bfloat16)
        d_out, sizes = normal(rng, (groups, K, N), F32), sizes_for(m, groups, rng)
        out, d_lhs, d_rhs = runnable.call(lhs, rhs, d_out, sizes)
        assert_close(out, reference.tgmm(lhs, rhs, sizes), F32, jnp.bfloat16, contraction=m)
        want_lhs, want_rhs, _ = reference.tgmm_vjp(lhs, rhs, sizes, d_out)
        assert_close(d_lhs, want_lhs, jnp.bfloat16, F32, contraction=N)
        assert_close(d_rhs, want_rhs, jnp.bfloat16, F32, contraction=K)


# --- ragged_dot and ragged_dot_general, through plain jax.export ---------------------------------


def test_ragged_dot_exported_like_lax_matches_lax_and_the_reference_with_vjp():
    groups = 3
    specs = (spec((M, K)), spec((groups, K, N)), spec((M, N)), spec((groups,), INT32))
    ours = exported_for_cpu(with_vjp(kernelhub.ragged_dot), *specs)
    lax_export = exported_for_cpu(with_vjp(lax.ragged_dot), *specs)
    numbers = MODES[1][3]  # lax.ragged_dot's
    rng = np.random.default_rng(2)
    for m in (9, 70):
        lhs, rhs = normal(rng, (m, K), F32), normal(rng, (groups, K, N), F32)
        d_out = normal(rng, (m, N), F32)
        sizes = np.array([m // 3, 0, m - m // 3], np.int32)  # lax computes every row: sum m
        got = ours.call(lhs, rhs, d_out, sizes)
        wanted = reference_with_vjp(lhs, rhs, d_out, sizes, numbers)
        for actual, want, contraction in zip(got, wanted, (K, N, m)):
            assert_close(actual, want, F32, F32, contraction=contraction)
        for actual, peer in zip(got, lax_export.call(lhs, rhs, d_out, sizes)):
            np.testing.assert_allclose(actual, peer, rtol=1e-5, atol=1e-5)


def _numbers(contracting, batch, ragged, group):
    return lax.RaggedDotDimensionNumbers((contracting, batch), ragged, group)


# (mode, lhs shape, rhs shape, output cotangent shape, dimension numbers) with m symbolic;
# mode 3's ragged dim is its batch dim of B entries (static), m a free lhs dim.
B = 5
MODES = {
    1: (lambda m: (m, K), lambda m: (3, K, N), lambda m: (m, N),
        _numbers(([1], [1]), ([], []), [0], [0])),
    2: (lambda m: (m, K), lambda m: (m, N), lambda m: (3, K, N),
        _numbers(([0], [0]), ([], []), [0], [])),
    3: (lambda m: (B, m, K), lambda m: (B, K, N), lambda m: (B, m, N),
        _numbers(([2], [1]), ([0], [0]), [0], [])),
}


# Mode 1 is kernelhub.ragged_dot's (the same implementation, given lax.ragged_dot's dimension
# numbers): exported, with its gradients against lax's too, in the test above.
@pytest.mark.parametrize("mode", [2, 3])
def test_ragged_dot_general_modes_2_and_3_exported_like_lax_run_at_two_m(mode):
    lhs_shape, rhs_shape, out_shape, numbers = MODES[mode]
    groups = 3

    def op(lhs, rhs, group_sizes):
        return kernelhub.ragged_dot_general(lhs, rhs, group_sizes, numbers)

    def lax_op(lhs, rhs, group_sizes):
        return lax.ragged_dot_general(lhs, rhs, group_sizes, numbers)

    specs = (spec(lhs_shape(M)), spec(rhs_shape(M)), spec(out_shape(M)), spec((groups,), INT32))
    ours = exported_for_cpu(with_vjp(op), *specs)
    lax_export = exported_for_cpu(lambda a, b, d, s: lax_op(a, b, s), *specs)
    rng = np.random.default_rng(3 + mode)
    for m in (6, 41):
        lhs, rhs = normal(rng, lhs_shape(m), F32), normal(rng, rhs_shape(m), F32)
        d_out = normal(rng, out_shape(m), F32)
        # Sizes summing to the ragged dim's length: lax then computes what kernelhub does.
        extent = B if mode == 3 else m
        sizes = np.array([extent // 2, 0, extent - extent // 2], np.int32)
        out, d_lhs, d_rhs = ours.call(lhs, rhs, d_out, sizes)
        want, want_lhs, want_rhs = reference_with_vjp(lhs, rhs, d_out, sizes, numbers)
        contraction = m if mode == 2 else K
        assert_close(out, want, F32, F32, contraction=contraction)
        assert_close(d_lhs, want_lhs, F32, F32, contraction=N * (groups if mode == 2 else 1))
        assert_close(d_rhs, want_rhs, F32, F32, contraction=m)
        np.testing.assert_allclose(out, lax_export.call(lhs, rhs, d_out, sizes),
                                   rtol=1e-5, atol=1e-5)


# --- what cannot be symbolic, and targets that cannot take it -------------------------------------


@pytest.mark.parametrize("name, fn, specs", [
    ("grouped_matmul", lambda a, b, s: kernelhub.grouped_matmul(a, b, s),
     (spec((M, K)), spec((G, K, N)), spec((G,), INT32))),
    ("ragged_dot", lambda a, b, s: kernelhub.ragged_dot(a, b, s),
     (spec((M, K)), spec((G, K, N)), spec((G,), INT32))),
    ("ragged_dot_general mode 2", lambda a, b, s: kernelhub.ragged_dot_general(a, b, s, MODES[2][3]),
     (spec((M, K)), spec((M, N)), spec((G,), INT32))),
    ("transposed_grouped_matmul", lambda a, b, s: kernelhub.transposed_grouped_matmul(a, b, s),
     (spec((K, M)), spec((M, N)), spec((G,), INT32))),
])
def test_a_symbolic_group_count_is_one_clear_error(name, fn, specs):
    del name
    # lax raises a TypeError here too ("requires the group count ... to be static").
    with pytest.raises(TypeError, match=r"group count \(group_sizes' last dimension\) must be "
                                        r"static in exported functions.*symbolic dimension g"):
        jax.export.export(jax.jit(fn), platforms=["cpu"])(*specs)


def test_a_symbolic_ragged_batch_dim_is_one_clear_error():
    numbers = MODES[3][3]

    def fn(lhs, rhs, group_sizes):
        return kernelhub.ragged_dot_general(lhs, rhs, group_sizes, numbers)

    with pytest.raises(TypeError, match=r"lhs's ragged batch dim 0 \(mode 3\) must be static"):
        jax.export.export(jax.jit(fn), platforms=["cpu"])(
            spec((M, 4, K)), spec((M, K, N)), spec((3,), INT32))


def _gmm(lhs, rhs, group_sizes):
    return kernelhub.grouped_matmul(lhs, rhs, group_sizes)


GMM_SPECS = (spec((M, K)), spec((3, K, N)), spec((3,), INT32))


def test_a_symbolic_m_exported_for_cuda_runs_the_xla_loops_there():
    """jax's Pallas Triton lowering takes no symbolic size (an operand's shape or the grid):
    the Triton kernels lack the symbolic_shapes feature, so an unforced call lowers the XLA
    implementation for cuda (and the Mosaic kernels for tpu), with gradients; forcing Triton
    is an error naming the feature, never a silent fallback."""
    def step(lhs, rhs, sizes):
        out, vjp = jax.vjp(lambda a, b: _gmm(a, b, sizes), lhs, rhs)
        return out, vjp(out)

    # The forward and both gradients: a forward alone lowers the first of these kernels.
    exported = kernelhub.export.export(step, *GMM_SPECS, platforms=("cpu", "tpu", "cuda"))
    assert kernelhub.export.kernels_by_platform(exported) == {
        "cpu": {}, "tpu": {"mosaic": 3}, "cuda": {}}
    triton = kernelhub.get("grouped_matmul", platform="triton", backend="gpu")
    with pytest.raises(kernelhub.NoImplementationError, match="symbolic_shapes"):
        kernelhub.export.export(lambda a, b, s: triton(a, b, s), *GMM_SPECS,
                                platforms=("cuda",))
    # the Triton kernel itself still names the way out, for whoever reaches it directly
    from kernelhub._pallas.gpu import config

    with pytest.raises(ValueError, match=r"Triton kernels \(the 'cuda' target\) cannot lower a "
                                         r"symbolic m \(m\).*platform='xla'.*'cpu' and 'tpu'"):
        config.check_static(types.SimpleNamespace(m=M, k=K, n=N))


def test_xla_pinned_lowers_a_symbolic_m_for_cuda_too():
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    exported = kernelhub.export.export(lambda a, b, s: gmm(a, b, s), *GMM_SPECS,
                                       platforms=("cpu", "tpu", "cuda"))
    assert kernelhub.export.kernels_by_platform(exported) == {"cpu": {}, "tpu": {}, "cuda": {}}


@pytest.mark.parametrize("exported_before", [False, True])
def test_plain_jax_export_for_tpu_says_to_use_kernelhub_export(exported_before):
    # Mosaic takes a symbolic m only in Pallas's dynamic-shape mode, which kernelhub.export sets.
    # Its traces are not reused outside that mode (jax.jit's caches key on it), so a plain
    # jax.export after a kernelhub.export of the same function still says so.
    if exported_before:
        kernelhub.export.export(_gmm, *GMM_SPECS, platforms=("cpu", "tpu"))
    with pytest.raises(ValueError, match=r"Pallas TPU kernels lower a symbolic m \(m, the rows "
                                         r"of lhs\) only .* kernelhub.export"):
        jax.export.export(jax.jit(_gmm), platforms=["tpu"])(*GMM_SPECS)


def test_tuning_tables_are_not_consulted_for_a_symbolic_m():
    # A tuning key buckets m, which a symbolic m cannot be: the heuristic decides, silently.
    problem = types.SimpleNamespace(static=False)

    def no_key():
        raise AssertionError("a symbolic problem was looked up in a table")

    call = types.SimpleNamespace(problem=problem, key=no_key)
    assert tables.choose(None, kernelhub.tuning.Tuning(), call) is None
    assert tables.choose(None, None, call) is None
    assert tables.choose((8, 8, 8), None, call) == (8, 8, 8)
    with kernelhub.tuning.Tuning():
        exported_for_cpu(_gmm, *GMM_SPECS)
    with pytest.raises(ValueError, match="autotune times kernels on concrete shapes"):
        kernelhub.tuning.autotune(_gmm, *GMM_SPECS, progress=False)


# --- the TPU artifact, compiled by libtpu for a chip that is not here -----------------------------


@pytest.mark.slow
@pytest.mark.skipif(not tpu_ahead_of_time.libtpu_available(),
                    reason="libtpu not installed (pip install 'kernelhub[tpu]')")
def test_tpu_artifact_compiles_at_two_m_with_mosaic():
    from jax.experimental import topologies

    # libtpu locks the machine unless told otherwise; compiling for a topology touches no chip.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    groups, k, n = 4, 256, 256

    def specs(m, **where):
        return (spec((m, k), jnp.bfloat16, **where), spec((groups, k, n), jnp.bfloat16, **where),
                spec((m, n), F32, **where), spec((groups,), INT32, **where))

    exported = round_trip(kernelhub.export.export(with_vjp(_gmm), *specs(M), platforms=("tpu",)))
    device = topologies.get_topology_desc(topology_name=tpu_ahead_of_time.TOPOLOGIES["v5e"],
                                          platform="tpu").devices[0]
    where = dict(sharding=jax.sharding.SingleDeviceSharding(device))
    for m in (1000, 37):
        compiled = jax.jit(exported.call).lower(*specs(m, **where)).compile()
        assert compiled.as_text().count(f'"{tpu_ahead_of_time.MOSAIC_CALL}"') == KERNELS_WITH_VJP
