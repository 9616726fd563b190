"""One exported artifact carries every platform's kernel, and runs here after a round trip.

Exported on this CPU host for cpu, tpu and cuda: the TPU lowering must hold the Mosaic kernels,
the CUDA lowering the Triton kernels and the CPU lowering neither (the XLA loops), forward and
VJP; deserialized, the artifact runs on the CPU and matches the float64 reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import kernelhub.export
import reference
from conftest import assert_close, equations
from kernelhub._core import lowering
from kernelhub._core import registry as _registry
from strategies import normal

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"
# Kernel launches of a forward pass and its VJP: gmm, then gmm (d lhs) and tgmm (d rhs).
KERNELS_WITH_VJP = 3


def _round_trip(exported):
    return jax.export.deserialize(exported.serialize())


def test_a_gated_artifact_holds_each_platforms_fused_kernel_and_runs_on_cpu():
    """GPT-OSS's gate (interleaved swiglu_oai with a bias) with group_offset, forward and VJP in
    lhs, rhs and bias: the forward kernel writes the pre-activation the backward pass takes, so
    each accelerator lowering holds the three kernel launches of any forward and VJP, and no
    other. (grouped_matmul's artifact without an epilogue: this one's way, through the same
    export; its TPU branch at a symbolic m is tests/test_symbolic_export.py's, its CUDA lowering
    tests/test_triton_gpu.py's.)"""
    rng = np.random.default_rng(2)
    m, k, n = 120, 40, 24
    sizes = np.array([20, 0, 41, 30, 19], np.int32)
    lhs, rhs = normal(rng, (m, k), jnp.float32), normal(rng, (3, k, 2 * n), jnp.float32)
    bias, d_out = normal(rng, (3, 2 * n), jnp.float32), normal(rng, (m, n), jnp.float32)
    epilogue = dict(glu="swiglu_oai", glu_layout="interleaved")

    def forward_and_vjp(lhs, rhs, bias, sizes, d_out):
        out, pullback = jax.vjp(lambda a, b, c: kernelhub.grouped_matmul(
            a, b, sizes, group_offset=1, bias=c, **epilogue), lhs, rhs, bias)
        return (out, *pullback(d_out))

    exported = kernelhub.export.export(forward_and_vjp, lhs, rhs, bias, sizes, d_out)
    assert tuple(exported.platforms) == ("cpu", "tpu", "cuda")
    assert kernelhub.export.kernels_by_platform(exported) == {
        "cpu": {}, "tpu": {"mosaic": KERNELS_WITH_VJP}, "cuda": {"triton": KERNELS_WITH_VJP}}

    got = _round_trip(exported).call(lhs, rhs, bias, sizes, d_out)
    want = reference.gmm_epilogue_vjp(lhs, rhs, sizes, d_out, group_offset=1, bias=bias,
                                      **epilogue)
    assert_close(got[0], reference.gmm(lhs, rhs, sizes, group_offset=1, bias=bias, **epilogue),
                 jnp.float32, jnp.float32, contraction=k)
    for value, name, contraction in zip(got[1:], ("lhs", "rhs", "bias"), (2 * n, m, m)):
        assert_close(value, want[name], jnp.float32, jnp.float32, contraction=contraction)


def test_tgmm_artifact_holds_each_platforms_kernel_and_runs_on_cpu():
    rng = np.random.default_rng(1)
    k, m, n = 40, 150, 24
    sizes = np.array([17, 0, 90, 33], np.int32)
    lhs, rhs = normal(rng, (k, m), jnp.bfloat16), normal(rng, (m, n), jnp.bfloat16)
    d_out = normal(rng, (4, k, n), jnp.float32)

    def forward_and_vjp(lhs, rhs, sizes, d_out):
        out, pullback = jax.vjp(lambda a, b: kernelhub.transposed_grouped_matmul(a, b, sizes),
                                lhs, rhs)
        return (out, *pullback(d_out))

    exported = kernelhub.export.export(forward_and_vjp, lhs, rhs, sizes, d_out)
    assert kernelhub.export.kernels_by_platform(exported) == {
        "cpu": {}, "tpu": {"mosaic": KERNELS_WITH_VJP}, "cuda": {"triton": KERNELS_WITH_VJP}}

    out, d_lhs, d_rhs = _round_trip(exported).call(lhs, rhs, sizes, d_out)
    assert_close(out, reference.tgmm(lhs, rhs, sizes), jnp.float32, jnp.bfloat16, contraction=m)
    want_lhs, want_rhs, _ = reference.tgmm_vjp(lhs, rhs, sizes, d_out)
    assert_close(d_lhs, want_lhs, jnp.bfloat16, jnp.float32, contraction=n)
    assert_close(d_rhs, want_rhs, jnp.bfloat16, jnp.float32, contraction=k)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_forced_platform_pins_one_implementation_in_every_lowering(how, platform_variable):
    args = [jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((2, 32, 16), jnp.float32),
            jax.ShapeDtypeStruct((2,), jnp.int32)]
    if how == "argument":
        gmm = kernelhub.get(GMM, platform="xla")
    else:
        platform_variable("xla")
        gmm = kernelhub.grouped_matmul
    # A new function each time: jax.jit keeps the trace of a function it has seen, and the
    # environment is read when a call is traced.
    exported = kernelhub.export.export(lambda *a: gmm(*a), *args)
    assert kernelhub.export.kernels_by_platform(exported) == {"cpu": {}, "tpu": {}, "cuda": {}}


@pytest.mark.parametrize("op", [GMM, TGMM])
def test_resolve_names_what_each_platforms_lowering_uses(op):
    """The choices a traced call carries are what resolve() says for each platform."""
    if op == GMM:
        args = (jnp.ones((8, 4)), jnp.ones((2, 4, 3)), jnp.array([3, 5], jnp.int32))
    else:
        args = (jnp.ones((4, 8)), jnp.ones((8, 3)), jnp.array([3, 5], jnp.int32))
    jaxpr = jax.make_jaxpr(kernelhub.get(op))(*args)
    calls = [eqn for eqn in equations(jaxpr.jaxpr)
             if eqn.primitive is lowering.kernelhub_call_p]
    assert calls
    for platform in lowering.TARGETS:
        expected = kernelhub.resolve(op, backend=_registry.backend_of_target(platform))
        assert all(eqn.params["choices"].of(platform) == expected for eqn in calls), platform
    assert calls[0].params["choices"].of("tpu").platform is kernelhub.Platform.PALLAS
    assert calls[0].params["choices"].of("cuda").platform is kernelhub.Platform.TRITON
    assert calls[0].params["choices"].of("cpu") == kernelhub.resolve(op)


def test_a_platform_without_its_kernel_lowers_what_resolve_names():
    saved = _registry.unregister(GMM, "pallas", "tpu")
    try:
        args = [jax.ShapeDtypeStruct((64, 32), jnp.float32),
                jax.ShapeDtypeStruct((2, 32, 16), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.int32)]
        exported = kernelhub.export.export(lambda *a: kernelhub.grouped_matmul(*a), *args,
                                           platforms=("cpu", "cuda"))
        assert kernelhub.export.kernels_by_platform(exported)["cuda"] == {"triton": 1}
        # The xla implementation runs anywhere, so the TPU lowering falls to it, as resolve says.
        assert kernelhub.resolve(GMM, backend="tpu").platform is kernelhub.Platform.XLA
        exported = kernelhub.export.export(lambda *a: kernelhub.grouped_matmul(*a), *args,
                                           platforms=("tpu",))
        assert kernelhub.export.kernels_by_platform(exported) == {"tpu": {}}
    finally:
        _registry.restore(saved)
