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
    with pytest.raises(ValueError, match=r"KERNELHUB_PLATFORM='cuda' is not one of: pallas, triton, mosaic, xla"):
        kernelhub.grouped_matmul(LHS, RHS, SIZES)


@pytest.mark.parametrize("value", ["XLA", " xla", "xla\n", "Xla "])
def test_platform_names_ignore_case_and_surrounding_spaces(platform_variable, value):
    """The one rule of docs/dispatch.md, for the variable as for arguments."""
    platform_variable(value)
    assert kernelhub.resolve("grouped_matmul").platform is Platform.XLA
    np.testing.assert_array_equal(np.asarray(kernelhub.grouped_matmul(LHS, RHS, SIZES)),
                                  np.full((8, 3), 4.0))
    assert kernelhub.resolve("grouped_matmul", platform=value).platform is Platform.XLA


@pytest.mark.parametrize("name", ["cuda", "rocm", "GPU", " gpu"])
def test_jax_target_names_mean_the_gpu_backend(name):
    """`kernelhub list` and kernelhub.export name targets (cuda); resolve takes them too."""
    spec = kernelhub.resolve("grouped_matmul", backend=name)
    assert (spec.platform, spec.backend) == (Platform.TRITON, kernelhub.Backend.GPU)


def test_a_backend_given_as_platform_says_which_word_it_is(platform_variable):
    with pytest.raises(ValueError, match="backend='metal' is not one of: tpu, gpu, cpu, any "
                                         "\\(or cuda for gpu, rocm for gpu\\)"):
        kernelhub.resolve("grouped_matmul", backend="metal")
    platform_variable("gpu")
    with pytest.raises(ValueError, match="names hardware .a backend.*backend="):
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


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU host's view of other targets")
@pytest.mark.parametrize("platform, target, kernel, lacking", [
    ("triton", "cuda", "triton", "tpu"), ("pallas", "tpu", "mosaic", "cuda")])
@pytest.mark.parametrize("through", ["argument", "variable"])
def test_a_forced_platform_lowers_its_own_kernel_for_each_target(platform, target, kernel, lacking,
                                                                 through, platform_variable):
    """Forced to Triton (or Pallas) on a CPU host, no backend forced: the cuda (tpu) lowering
    holds the real kernel, not its interpreter; the cpu lowering runs the interpreter against
    float64; the target the platform has no kernel for is refused by name rather than given
    the interpreter."""
    if through == "argument":
        dispatched = kernelhub.get("grouped_matmul", platform=platform)
    else:
        platform_variable(platform)
        dispatched = kernelhub.get("grouped_matmul")

    def gmm(*arrays):  # a function of this test's own: jax.jit keeps traces per function
        return dispatched(*arrays)

    rng = np.random.default_rng(3)
    lhs = jnp.asarray(rng.standard_normal((8, 4)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((2, 4, 3)), jnp.float32)
    exported = kernelhub.export.export(gmm, lhs, rhs, SIZES, platforms=("cpu", target))
    assert kernelhub.export.kernels_by_platform(exported) == {"cpu": {}, target: {kernel: 1}}
    want = np.concatenate([np.asarray(lhs[:3], np.float64) @ np.asarray(rhs[0], np.float64),
                           np.asarray(lhs[3:], np.float64) @ np.asarray(rhs[1], np.float64)])
    np.testing.assert_allclose(np.asarray(exported.call(lhs, rhs, SIZES)), want, rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(kernelhub.NoImplementationError,
                       match=f"cannot lower for {lacking}: .*platform={platform}"):
        jax.jit(gmm).trace(lhs, rhs, SIZES).lower(lowering_platforms=(lacking,))


def test_a_pinned_cpu_backend_lowers_only_for_cpu():
    """backend="cpu" pins the Triton kernels' interpreter: it runs on the CPU, against float64,
    and lowering it for cuda is refused by name instead of putting the interpreter there."""
    dispatched = kernelhub.get("grouped_matmul", platform="triton", backend="cpu")

    def gmm(*arrays):
        return dispatched(*arrays)

    rng = np.random.default_rng(4)
    lhs = jnp.asarray(rng.standard_normal((8, 4)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((2, 4, 3)), jnp.float32)
    want = np.concatenate([np.asarray(lhs[:3], np.float64) @ np.asarray(rhs[0], np.float64),
                           np.asarray(lhs[3:], np.float64) @ np.asarray(rhs[1], np.float64)])
    np.testing.assert_allclose(np.asarray(jax.jit(gmm)(lhs, rhs, SIZES)), want, rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(kernelhub.NoImplementationError,
                       match="cannot lower for cuda: triton/cpu lowers only for cpu"):
        jax.jit(gmm).trace(lhs, rhs, SIZES).lower(lowering_platforms=("cuda",))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the pins name hardware this host lacks")
@pytest.mark.parametrize("platform, backend, runs_here", [
    ("pallas", "tpu", "platform='pallas'"), ("triton", "gpu", "platform='triton'"),
    (None, "tpu", "platform='xla'")])
def test_an_eager_call_pinned_to_absent_hardware_says_what_runs_here(platform, backend, runs_here):
    """backend="tpu" on a CPU host is for lowering and export: an eager call says so (and what
    runs here) instead of Pallas's "Only interpret mode is supported on CPU backend"."""
    gmm = kernelhub.get("grouped_matmul", platform=platform, backend=backend)
    with pytest.raises(ValueError, match=f"is for lowering and export on a host without a "
                                         f"{backend}.*{runs_here}"):
        gmm(LHS, RHS, SIZES)
    jitted = jax.jit(gmm)
    with pytest.raises(kernelhub.NoImplementationError, match="cannot lower for cpu: .* lowers "
                                                              "only for .*lowering_platforms"):
        jitted.lower(LHS, RHS, SIZES)
    # What the pin is for: lowering for its hardware works here.
    target = "tpu" if backend == "tpu" else "cuda"
    assert jitted.trace(LHS, RHS, SIZES).lower(lowering_platforms=(target,)) is not None
