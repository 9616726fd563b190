"""Selection: explicit choice > KERNELHUB_PLATFORM > best available; never a silent fallback."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
from kernelhub._core import registry as _registry
from kernelhub._core.registry import Backend, Platform

LHS, RHS, SIZES = jnp.ones((8, 4)), jnp.ones((2, 4, 3)), jnp.array([3, 5], jnp.int32)


def test_default_on_cpu_is_the_xla_implementation():
    for op in kernelhub.op_names():
        spec = kernelhub.resolve(op)
        assert (spec.platform, spec.backend) == (Platform.XLA, Backend.ANY)


def test_interpret_kernels_are_never_the_default():
    assert not any(kernelhub.resolve(op).interpret_only for op in kernelhub.op_names())


def test_environment_variable_forces_the_platform(platform_variable):
    gmm = kernelhub.get("grouped_matmul")
    platform_variable("xla")
    assert kernelhub.resolve("grouped_matmul").platform is Platform.XLA
    np.testing.assert_array_equal(np.asarray(gmm(LHS, RHS, SIZES)), np.full((8, 3), 4.0))


def test_a_variable_changed_after_kernelhub_read_it_is_an_error_not_stale(monkeypatch):
    """Read once: a jitted function cannot keep a platform the variable no longer says."""
    jitted = jax.jit(kernelhub.grouped_matmul)
    np.testing.assert_array_equal(np.asarray(jitted(LHS, RHS, SIZES)), np.full((8, 3), 4.0))
    monkeypatch.setenv("KERNELHUB_PLATFORM", "pallas")
    with pytest.raises(ValueError, match="KERNELHUB_PLATFORM changed from '' to 'pallas' after "
                                         "kernelhub read it"):
        kernelhub.grouped_matmul(LHS, RHS, SIZES)


def test_bad_environment_value_names_the_variable(platform_variable):
    platform_variable("cuda")
    with pytest.raises(ValueError, match=r"KERNELHUB_PLATFORM='cuda' is not one of: pallas, triton, xla"):
        kernelhub.grouped_matmul(LHS, RHS, SIZES)


def test_forced_platform_without_implementation_is_an_error_not_a_fallback(platform_variable):
    saved = [_registry.unregister("grouped_matmul", spec.platform, spec.backend)
             for spec in kernelhub.implementations("grouped_matmul") if spec.platform is Platform.TRITON]
    try:
        platform_variable("triton")
        with pytest.raises(kernelhub.NoImplementationError, match="platform=triton .from KERNELHUB_PLATFORM=triton"):
            kernelhub.grouped_matmul(LHS, RHS, SIZES)
        with pytest.raises(kernelhub.NoImplementationError, match="backend=cpu, platform=triton"):
            kernelhub.get("grouped_matmul", platform="triton")(LHS, RHS, SIZES)
    finally:
        for spec in saved:
            _registry.restore(spec)


def test_explicit_argument_beats_environment(platform_variable):
    platform_variable("pallas")
    assert kernelhub.resolve("grouped_matmul", platform="xla").platform is Platform.XLA


def test_priority_and_backend_specific_implementations_win():
    calls = []

    def fake(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=None,
             group_offset=None, existing_out=None, transpose_rhs=False):
        calls.append(lhs.shape)
        return jnp.zeros((lhs.shape[0], rhs.shape[2]))

    saved = _registry.unregister("grouped_matmul", "pallas", "cpu")
    kernelhub.register("grouped_matmul", "pallas", "cpu", priority=5)(fake)
    try:
        assert kernelhub.resolve("grouped_matmul").platform is Platform.PALLAS
        kernelhub.grouped_matmul(LHS, RHS, SIZES)
        # Traced for the output's shape, then lowered: never the xla implementation.
        assert calls and set(calls) == {(8, 4)}
    finally:
        _registry.unregister("grouped_matmul", "pallas", "cpu")
        if saved is not None:
            _registry.restore(saved)
    assert kernelhub.resolve("grouped_matmul").platform is Platform.XLA


def test_forced_backend_selects_without_the_hardware():
    """Ahead-of-time work: backend='tpu' gives the TPU kernel on a host with no TPU."""
    tpu_specs = [s for s in kernelhub.implementations("grouped_matmul") if s.backend is Backend.TPU]
    if not tpu_specs:
        pytest.skip("no TPU implementation registered")
    assert kernelhub.resolve("grouped_matmul", backend="tpu").backend is Backend.TPU


def test_committed_inputs_choose_their_devices_backend():
    lhs = jax.device_put(LHS, jax.devices("cpu")[0])
    spec = kernelhub.get("grouped_matmul").resolve(lhs, RHS, SIZES)
    assert spec.backend in (Backend.CPU, Backend.ANY)


def test_get_returns_a_callable_with_the_contract():
    import inspect

    gmm = kernelhub.get("grouped_matmul", platform="xla")
    assert "transpose_rhs" in inspect.signature(gmm).parameters
    assert "existing_out" in gmm.__doc__
    assert "platform=xla" in repr(gmm)


def test_backend_any_is_not_a_target():
    with pytest.raises(ValueError, match="backend='any'"):
        kernelhub.resolve("grouped_matmul", backend="any")


def test_the_environment_never_leaks_into_the_unforced_per_target_choice(platform_variable):
    """`kernelhub list` asks for the per-platform choices while KERNELHUB_PLATFORM may be set;
    a later unforced call must still see each platform's own best."""
    platform_variable("pallas")
    forced = kernelhub._core.dispatch.per_target("grouped_matmul", _registry.version())
    platform_variable(None)
    unforced = kernelhub._core.dispatch.choices("grouped_matmul", None, None)
    assert forced == unforced
    assert unforced.of("cpu").platform is Platform.XLA
    assert unforced.of("tpu").platform is Platform.PALLAS
