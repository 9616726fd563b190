"""Every grouped-matmul implementation inside shard_map, experts sharded along a mesh axis.

Run with 8 simulated CPU devices (tests/test_parallel.py launches this folder so):
    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu pytest tests/multidevice

Each device holds E/D experts and passes group_offset = axis_index * E/D; the psum of the
devices' outputs (and of the gradients) must be the single-device result. shard_map runs with
its default checks (check_vma=True) for every implementation, the interpret-mode kernels
included, and for the op as users call it (one implementation per platform, chosen at lowering).
"""

from __future__ import annotations

import jax
import pytest

if jax.device_count() < 8:
    pytest.skip("needs 8 devices: tests/test_parallel.py runs this in a subprocess",
                allow_module_level=True)

import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import kernelhub
import reference
from conftest import assert_close, call, runnable_implementations

AXIS = "experts"
EXPERTS = 16  # two per device
GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"


def cases(op: str, interpreter: str | None = None) -> list:
    """Every runnable implementation of `op`, forced, and the unforced op (spec None); with
    `interpreter`, of the interpret-mode kernels only that platform's (the suite runs in one
    process on 2 cores: the variants of a test turn between the interpreters, each of which
    runs every test's base case)."""
    params = [pytest.param(spec, id=f"{spec.platform.value}-{spec.backend.value}")
              for spec in runnable_implementations(op)
              if interpreter is None or not spec.interpret_only
              or spec.platform.value == interpreter]
    return params + [pytest.param(None, id="unforced")]


def _op(op: str, spec):
    return kernelhub.get(op) if spec is None else call(spec)


def _mesh():
    return jax.make_mesh((8,), (AXIS,))


def _group_sizes(rng, rows: int) -> jnp.ndarray:
    # Some empty groups, and rows past the last group that no device may touch.
    sizes = rng.multinomial(rows - 5, rng.dirichlet(np.full(EXPERTS, 0.5)))
    return jnp.asarray(sizes, jnp.int32)


def _normal(rng, shape):
    return jnp.asarray(rng.normal(size=shape), jnp.float32)


def _sizes(spec):
    # Interpret-mode kernels emulate every grid step in Python: keep their problems tiny.
    return (24, 8, 16) if spec is not None and spec.interpret_only else (40, 16, 24)


def _out_and_grads(f, lhs, rhs, group_sizes, d_out):
    out, pullback = jax.vjp(lambda a, b: f(a, b, group_sizes), lhs, rhs)
    return (out, *pullback(d_out))


def _assert_all_close(got, want, contraction):
    for name, g, w in zip(("out", "d_lhs", "d_rhs"), got, want):
        assert g.shape == w.shape, name
        assert_close(g, w, jnp.float32, jnp.float32, contraction=contraction)


def _check_gmm(spec, transpose_rhs: bool) -> None:
    m, k, n = _sizes(spec)
    rng = np.random.default_rng(0)
    lhs = _normal(rng, (m, k))
    rhs = _normal(rng, (EXPERTS, n, k) if transpose_rhs else (EXPERTS, k, n))
    group_sizes = _group_sizes(rng, m)
    d_out = _normal(rng, (m, n))
    gmm = _op(GMM, spec)
    mesh = _mesh()

    def on_device(lhs, rhs, group_sizes):
        first = jax.lax.axis_index(AXIS) * rhs.shape[0]
        local = gmm(lhs, rhs, group_sizes, group_offset=first, transpose_rhs=transpose_rhs)
        return jax.lax.psum(local, AXIS)

    sharded = jax.shard_map(on_device, mesh=mesh, in_specs=(P(), P(AXIS), P()), out_specs=P())

    rhs_sharded = jax.device_put(rhs, NamedSharding(mesh, P(AXIS)))
    got = jax.jit(lambda a, b: _out_and_grads(sharded, a, b, group_sizes, d_out))(lhs, rhs_sharded)
    # The float64 reference of the unsharded op (all experts on one device).
    sizes = np.asarray(group_sizes)
    want = (reference.gmm(lhs, rhs, sizes, transpose_rhs=transpose_rhs),
            *reference.gmm_vjp(lhs, rhs, sizes, d_out, transpose_rhs=transpose_rhs)[:2])
    _assert_all_close(got, want, max(m, k, n))


@pytest.mark.parametrize("spec", cases(GMM))
def test_gmm_with_sharded_experts_matches_one_device(spec):
    _check_gmm(spec, transpose_rhs=False)


@pytest.mark.parametrize("spec", cases(GMM, interpreter="triton"))
def test_gmm_transposed_rhs_with_sharded_experts(spec):
    _check_gmm(spec, transpose_rhs=True)


@pytest.mark.parametrize("spec", cases(GMM, interpreter="pallas"))
def test_gated_gmm_with_sharded_experts_and_biases(spec):
    """A fused SwiGLU with per-expert biases, experts and their biases sharded: each device's
    rows of other experts stay 0 (the gate is not applied to them), so the psum is the
    single-device result; gradients for lhs, rhs and bias too."""
    m, k, n = _sizes(spec)
    rng = np.random.default_rng(2)
    lhs, rhs = _normal(rng, (m, k)), _normal(rng, (EXPERTS, k, 2 * n))
    bias = _normal(rng, (EXPERTS, 2 * n))
    group_sizes = _group_sizes(rng, m)
    d_out = _normal(rng, (m, n))
    gmm = _op(GMM, spec)
    mesh = _mesh()

    def on_device(lhs, rhs, bias, group_sizes):
        first = jax.lax.axis_index(AXIS) * rhs.shape[0]
        local = gmm(lhs, rhs, group_sizes, group_offset=first, bias=bias, glu="silu")
        return jax.lax.psum(local, AXIS)

    sharded = jax.shard_map(on_device, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P()),
                            out_specs=P())
    by_expert = NamedSharding(mesh, P(AXIS))

    def out_and_grads(a, b, c):
        out, pullback = jax.vjp(lambda a, b, c: sharded(a, b, c, group_sizes), a, b, c)
        return (out, *pullback(d_out))

    got = jax.jit(out_and_grads)(lhs, jax.device_put(rhs, by_expert),
                                 jax.device_put(bias, by_expert))
    sizes = np.asarray(group_sizes)
    grads = reference.gmm_epilogue_vjp(lhs, rhs, sizes, d_out, bias=bias, glu="silu")
    want = (reference.gmm(lhs, rhs, sizes, bias=bias, glu="silu"), grads["lhs"], grads["rhs"],
            grads["bias"])
    for name, g, w in zip(("out", "d_lhs", "d_rhs", "d_bias"), got, want):
        assert g.shape == w.shape, name
        assert_close(g, w, jnp.float32, jnp.float32, contraction=max(m, k, n))


@pytest.mark.parametrize("spec", cases(TGMM))
def test_tgmm_with_sharded_groups_matches_one_device(spec):
    m, k, n = _sizes(spec)
    rng = np.random.default_rng(1)
    lhs = _normal(rng, (k, m))
    rhs = _normal(rng, (m, n))
    group_sizes = _group_sizes(rng, m)
    d_out = _normal(rng, (EXPERTS, k, n))
    tgmm = _op(TGMM, spec)
    local_groups = EXPERTS // 8

    def on_device(lhs, rhs, group_sizes):
        first = jax.lax.axis_index(AXIS) * local_groups
        return tgmm(lhs, rhs, group_sizes, group_offset=first, num_actual_groups=local_groups)

    # Each device computes its own groups' products: the output is sharded, not summed.
    sharded = jax.shard_map(on_device, mesh=_mesh(), in_specs=(P(), P(), P()), out_specs=P(AXIS))
    got = jax.jit(lambda a, b: _out_and_grads(sharded, a, b, group_sizes, d_out))(lhs, rhs)
    sizes = np.asarray(group_sizes)
    want = (reference.tgmm(lhs, rhs, sizes), *reference.tgmm_vjp(lhs, rhs, sizes, d_out)[:2])
    _assert_all_close(got, want, max(m, k, n))


# Kernels for hardware that is not here: lowered (not run) inside shard_map with the checks on.
_EXPORT_PLATFORM = {"tpu": "tpu", "gpu": "cuda"}
_KERNEL_CALLS = [jax.export.DisabledSafetyCheck.custom_call(name)
                 for name in ("tpu_custom_call", "__gpu$xla.gpu.triton")]


def accelerator_kernels() -> list:
    return [pytest.param(spec, id=f"{spec.op}-{spec.platform.value}-{spec.backend.value}")
            for op in (GMM, TGMM) for spec in kernelhub.implementations(op)
            if spec.backend.value in _EXPORT_PLATFORM and not spec.interpret_only]


@pytest.mark.parametrize("spec", accelerator_kernels())
def test_accelerator_kernels_lower_inside_shard_map_with_gradients(spec):
    op = kernelhub.get(spec.op, platform=spec.platform, backend=spec.backend)
    assert op.resolve() == spec
    mesh = _mesh()
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))
    m, k, n = 512, 256, 256
    if spec.op == GMM:
        shapes = [((m, k), replicated), ((EXPERTS, k, n), sharded)]
        out_spec = P()

        def on_device(lhs, rhs, group_sizes):
            first = jax.lax.axis_index(AXIS) * rhs.shape[0]
            return jax.lax.psum(op(lhs, rhs, group_sizes, group_offset=first), AXIS)
    else:
        shapes = [((k, m), replicated), ((m, n), replicated)]
        out_spec = P(AXIS)

        def on_device(lhs, rhs, group_sizes):
            local = EXPERTS // 8
            return op(lhs, rhs, group_sizes, group_offset=jax.lax.axis_index(AXIS) * local,
                      num_actual_groups=local)

    sharded_op = jax.shard_map(on_device, mesh=mesh, in_specs=(P(), shapes[1][1].spec, P()),
                               out_specs=out_spec)
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=where) for shape, where in shapes]
    args.append(jax.ShapeDtypeStruct((EXPERTS,), jnp.int32, sharding=replicated))

    def loss(lhs, rhs, group_sizes):
        return jnp.sum(sharded_op(lhs, rhs, group_sizes).astype(jnp.float32))

    exported = jax.export.export(
        jax.jit(jax.value_and_grad(loss, argnums=(0, 1))),
        platforms=[_EXPORT_PLATFORM[spec.backend.value]], disabled_checks=_KERNEL_CALLS)(*args)
    assert exported.nr_devices == 8
