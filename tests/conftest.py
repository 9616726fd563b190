"""Shared fixtures: the implementations that can run on this host, and how closely they match."""

from __future__ import annotations

import functools
import importlib.metadata
import math
import os

# On a CPU, compiling is most of this suite's time and its arrays are small. XLA:CPU's LLVM
# backend at its lowest optimisation level compiles the same programs (the same HLO, no fast
# math) about a sixth faster; its older elemental emitter for fusions (instead of the MLIR
# fusion emitters) takes about 40% off what is left, and half of the suite's CPU time in the
# compile-heavy files. Set before jax makes its CPU client; subprocesses inherit it. Only for
# CPU runs (the README's command): a GPU run tests what users compile. The benchmarks never
# run with it. jaxlib 0.11 has only the fusion emitters, and an unknown flag aborts the process.
if os.environ.get("JAX_PLATFORMS", "").strip() == "cpu":
    _jaxlib_release = tuple(int(part) for part in
                            importlib.metadata.version("jaxlib").split(".")[:2])
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [
        os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true",
        "--xla_cpu_use_fusion_emitters=false" if _jaxlib_release < (0, 11) else ""]))

# Interpreted, a warp-specialized Mosaic GPU kernel runs each of a program's warpgroups as a
# computation of its own on XLA's CPU client, all at once; the client has as many threads as
# cores (2 on CI) unless NPROC says otherwise, too few for them (config.check_interpretable).
# Set before jax makes its CPU client.
os.environ.setdefault("NPROC", str(max(os.cpu_count() or 1, 6)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import lowered_twins  # noqa: E402
import kernelhub  # noqa: E402
from kernelhub import testing  # noqa: E402

# Interpret-mode kernels run a Python-level emulation of every grid step: fewer examples. The
# contract tests cycle through the size patterns of tests/strategies.py: each pattern once on
# each implementation, and the first two (random sizes, some groups empty) again on XLA.
EXAMPLES = {"xla": 8, "interpret": 6}
# `pytest --quick`: every implementation's contract (the files below: forward and gradients
# against the float64 reference, lax's ragged_dot, every dtype, bad input, selection), with
# fewer drawn examples and without ahead-of-time compilations (`slow`) or the 8-device
# subprocess (`multidevice`). About 2.5 minutes on 2 cores; CI runs everything.
QUICK_EXAMPLES = {"xla": 6, "interpret": 3}
QUICK_FILES = frozenset({
    "test_contract.py", "test_ragged_dot.py", "test_ragged_dot_dtypes.py", "test_validation.py",
    "test_dispatch.py", "test_registry.py", "test_define.py", "test_groups.py", "test_eager.py",
    "test_runtime_checks.py", "test_architecture.py", "test_import.py",
    "test_transformations.py", "test_epilogue.py"})


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="kernelhub's quick loop: every implementation's contract, fewer drawn "
                          "examples, no slow or multidevice tests (README: Tests)")


def pytest_collection_modifyitems(config, items):
    # The longest tests first (stable otherwise): pytest-xdist hands tests out in this order,
    # and the 8-device subprocess (minutes) or a compilation handed out last would leave the
    # other worker idle at the end.
    items.sort(key=lambda item: 0 if item.get_closest_marker("multidevice")
               else 1 if item.get_closest_marker("slow") else 2)
    if not config.getoption("--quick"):
        return
    kept, left_out = [], []
    for item in items:
        slow = item.get_closest_marker("slow") or item.get_closest_marker("multidevice")
        (left_out if slow or item.path.name not in QUICK_FILES else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


# Mosaic GPU's interpreter simulates every warpgroup, barrier and TMA copy on this host: a call
# takes a fraction of a second to a few seconds, though kernels that trace alike share one
# compiled interpreter program (kernelhub/_pallas/mosaic_gpu/interpreter_programs.py). The shared
# suites run it as every other implementation here, but for the few cases a test leaves out
# (`slow_interpreters=False`), each saying why and where what it checks runs instead. On a
# Hopper GPU (mosaic, gpu) is runnable and every shared suite runs it in full.
SLOW_INTERPRETERS = frozenset({("mosaic", "cpu")})


def runnable_implementations(op, slow_interpreters: bool = True,
                             features: frozenset[str] = frozenset()) -> list:
    """kernelhub.testing's runnable implementations of `op` that have `features`, and, unless
    asked to leave them out, the SLOW_INTERPRETERS."""
    return [spec for spec in testing.runnable_implementations(op)
            if features <= spec.features and (
                slow_interpreters
                or (spec.platform.value, spec.backend.value) not in SLOW_INTERPRETERS)]


def implementation_params(op: str, slow_interpreters: bool = True,
                          features: frozenset[str] = frozenset()) -> list:
    return [pytest.param(spec, id=f"{spec.platform.value}-{spec.backend.value}")
            for spec in runnable_implementations(op, slow_interpreters, features)]


def quantized_implementations(op: str, slow_interpreters: bool = True) -> list:
    """implementation_params(op) of the implementations that take quantized operands."""
    return implementation_params(op, slow_interpreters, frozenset({"quantized"}))


def equations(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs inside its equations' parameters (a call's,
    a kernel's, each branch of a cond), depth first."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's, or a Jaxpr itself
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def call(spec: kernelhub.KernelSpec):
    """The op as a user forcing this implementation's platform gets it."""
    return kernelhub.get(spec.op, platform=spec.platform)


def jitted_vjp(f, primals: tuple, cotangent):
    """`f(*primals)` and its cotangents of `primals` pulled back from `cotangent`, as one jitted
    program: run eagerly, jax.vjp of a composite (quantization's scales, say) compiles each of
    its jax.numpy operations apart, a few hundred small programs. (Eager calls have tests of
    their own: tests/test_eager.py.)"""

    def run(primals, cotangent):
        out, pullback = jax.vjp(f, *primals)
        return out, pullback(cotangent)

    return jax.jit(run)(tuple(primals), cotangent)


@functools.partial(jax.jit, static_argnames=("dtype", "axis", "block_size"))
def quantized_operand(x, dtype, *, axis: int, block_size: int | None = None):
    """kernelhub.quantize(x, dtype, axis=axis, block_size=block_size) (dtype: a jnp dtype or a
    named format) as one compiled program, for the ops' operands and the references' inputs:
    run eagerly, each of its jax.numpy operations compiles apart, a few dozen programs for each
    shape and dtype (the tests of quantize itself, and of what users write, call it eagerly).
    Without a float source: nothing to differentiate into."""
    return kernelhub.quantize(x, dtype, axis=axis, block_size=block_size).without_source()


def dequantized(q: kernelhub.QuantizedArray) -> np.ndarray:
    """float64 values * block scale (* tensor scale), each scale repeated over its block by
    numpy from the stored parts: independent of QuantizedArray.dequantize."""
    values = np.asarray(jnp.asarray(q.values, jnp.float32), np.float64)
    scale = np.asarray(jnp.asarray(q.scale, jnp.float32), np.float64)
    size = values.shape[q.axis]
    block = size if q.block_size is None else q.block_size
    out = values * np.repeat(scale, block, axis=q.axis).take(np.arange(size), axis=q.axis)
    if q.tensor_scale is not None:
        out = out * float(q.tensor_scale)
    return out


def as_float64(x) -> np.ndarray:
    """A quantized operand dequantized (`dequantized`), any other as float64."""
    if isinstance(x, kernelhub.QuantizedArray):
        return dequantized(x)
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def max_examples(spec: kernelhub.KernelSpec) -> int:
    return EXAMPLES["interpret" if spec.interpret_only else "xla"]


def tolerance(out_dtype, *input_dtypes) -> float:
    """Relative error allowed against the float64 reference: kernelhub.testing's rule for the
    output's dtype (inputs are drawn already rounded to theirs, so they add no error)."""
    del input_dtypes
    return testing.default_tolerance(out_dtype)


def assert_close(actual, expected, out_dtype, *input_dtypes, contraction: int = 1) -> None:
    actual = np.asarray(jnp.asarray(actual, jnp.float32), np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    rtol = tolerance(out_dtype, *input_dtypes)
    # Sums of `contraction` terms of size ~1: absolute error grows like sqrt(contraction).
    largest = float(np.max(np.abs(expected), initial=0))
    atol = rtol * math.sqrt(max(contraction, 1)) * max(1.0, largest ** 0.5)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


# The whole suite runs under jax's strict dtype promotion, as many users' code and jax's own tests
# do: a kernel that mixes dtypes implicitly fails here rather than in their code. Strict only
# refuses implicit promotions, so whatever passes here computes the same under the standard
# rule. KERNELHUB_TEST_PROMOTION=standard runs the suite under jax's default instead.
PROMOTION = os.environ.get("KERNELHUB_TEST_PROMOTION", "strict")


def pytest_configure(config):
    if config.getoption("--quick"):
        EXAMPLES.update(QUICK_EXAMPLES)
    config.addinivalue_line("markers", "standard_promotion(reason): runs under jax's standard "
                                       "dtype promotion (code outside kernelhub needs it)")
    # Global (not a per-test context), so threads the tests start and subprocesses inherit it.
    jax.config.update("jax_numpy_dtype_promotion", PROMOTION)
    os.environ["JAX_NUMPY_DTYPE_PROMOTION"] = PROMOTION
    if jax.default_backend() == "cpu":  # elsewhere the suites run the compiled kernels
        lowered_twins.install()


@pytest.fixture(autouse=True)
def _promotion_of_the_test(request):
    if request.node.get_closest_marker("standard_promotion") is None:
        yield
        return
    with jax.numpy_dtype_promotion("standard"):
        yield


@pytest.fixture(autouse=True)
def _interpreted_kernels_lower_for_their_chips():
    """After each test, the Pallas kernels (Mosaic GPU, Triton, TPU) it interpreted, lowered for
    cuda or tpu (tests/lowered_twins.py; installed on a CPU host only)."""
    yield
    failures = lowered_twins.TWINS.lower()
    if failures:
        pytest.fail("interpreted here, these kernel calls do not lower for their chips:\n"
                    + "\n".join(failures), pytrace=False)


@pytest.fixture(autouse=True)
def _no_forced_platform(monkeypatch):
    """Tests choose implementations explicitly; an outer KERNELHUB_PLATFORM must not leak in."""
    monkeypatch.delenv("KERNELHUB_PLATFORM", raising=False)
    monkeypatch.delenv("KERNELHUB_RUNTIME_CHECKS", raising=False)
    kernelhub._core.dispatch.reread_environment()
    yield
    kernelhub._core.dispatch.reread_environment()


@pytest.fixture
def platform_variable(monkeypatch):
    """Sets (or, with None, unsets) KERNELHUB_PLATFORM as if the program had started with it."""

    def set_variable(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("KERNELHUB_PLATFORM", raising=False)
        else:
            monkeypatch.setenv("KERNELHUB_PLATFORM", value)
        kernelhub._core.dispatch.reread_environment()

    return set_variable


def pytest_report_header(config):
    names = ", ".join(f"{s.op}:{s.platform.value}-{s.backend.value}"
                      for op in kernelhub.op_names() for s in runnable_implementations(op))
    return [f"jax {jax.__version__} on {jax.default_backend()}; runnable here: {names}",
            f"KERNELHUB_PLATFORM={os.environ.get('KERNELHUB_PLATFORM', '')!r}; dtype promotion: "
            f"{PROMOTION}"]
