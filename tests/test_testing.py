"""kernelhub.testing: the harness must pass agreeing implementations and catch each kind of fault."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from jaxtyping import Array, Float, Int

import kernelhub
from kernelhub import testing
from kernelhub._core import registry as _registry

_names = itertools.count()


def cube(x: Float[Array, "n"], y: Float[Array, "n"]) -> Float[Array, "n"]:
    """x**3 * y."""


def right(x, y):
    return x**3 * y


def reference(x, y):
    return x**3 * y


@pytest.fixture
def op():
    """A fresh op with a correct portable implementation; forgotten after the test."""
    declared = kernelhub.define_op(cube, name=f"cube_{next(_names)}")
    kernelhub.register(declared, "xla", "any")(right)
    yield declared
    _registry.remove_op(declared)


def _case(rng: np.random.Generator) -> testing.Case:
    n = int(rng.integers(1, 9))
    return testing.Case(jnp.asarray(rng.normal(size=n), jnp.float32),
                        jnp.asarray(rng.normal(size=n), jnp.float32))


def _report_row(report: testing.Report, implementation: str) -> testing.ImplementationReport:
    return next(i for i in report.implementations if i.name.startswith(implementation))


def test_agreeing_implementations_pass_with_every_kind_of_problems(op):
    kernelhub.register(op, "pallas", "cpu", interpret_only=True)(lambda x, y: y * x * x * x)
    cases = [_case(np.random.default_rng(s)) for s in range(3)]
    strategy = st.integers(0, 2**16).map(lambda seed: _case(np.random.default_rng(seed)))
    for problems in (cases, _case, strategy):
        report = testing.check_implementations(op, reference, problems, examples=4)
        report.assert_ok()
        assert {i.name for i in report.implementations} == {"xla/any", "pallas/cpu (interpret)"}
        assert all(i.cases == (3 if problems is cases else 4) for i in report.implementations)
        assert set(report.implementations[0].results) == {"output", "gradient of x", "gradient of y"}


def test_a_wrong_output_is_caught_and_named(op):
    # Off by one ulp-scale factor would pass; off by 1e-3 must not.
    kernelhub.register(op, "pallas", "cpu", interpret_only=True)(lambda x, y: x**3 * y * 1.001)
    report = testing.check_implementations(op, reference, _case, examples=3)
    assert not report.ok
    assert _report_row(report, "xla").ok
    wrong = _report_row(report, "pallas")
    assert not wrong.results["output"].ok and wrong.results["output"].worst_error > 5e-4
    with pytest.raises(AssertionError, match="pallas/cpu"):
        report.assert_ok()


def test_a_wrong_gradient_is_caught(op):
    @jax.custom_vjp
    def wrong_vjp(x, y):
        return x**3 * y

    wrong_vjp.defvjp(lambda x, y: (x**3 * y, (x, y)),
                     lambda res, d: (2 * res[0] ** 2 * res[1] * d, res[0] ** 3 * d))
    kernelhub.register(op, "pallas", "cpu", interpret_only=True)(lambda x, y: wrong_vjp(x, y))
    wrong = _report_row(testing.check_implementations(op, reference, _case, examples=3), "pallas")
    assert wrong.results["output"].ok and wrong.results["gradient of y"].ok
    assert not wrong.results["gradient of x"].ok


def test_an_implementation_that_raises_is_reported_not_fatal(op):
    def broken(x, y):
        raise RuntimeError("kernel exploded")

    kernelhub.register(op, "pallas", "cpu", interpret_only=True)(broken)
    report = testing.check_implementations(op, reference, _case, examples=2)
    assert _report_row(report, "xla").ok
    assert any("kernel exploded" in f for f in _report_row(report, "pallas").failures)
    assert "kernel exploded" in str(report)


def test_a_nan_in_the_wrong_place_fails_even_where_the_values_agree(op):
    kernelhub.register(op, "pallas", "cpu", interpret_only=True)(
        lambda x, y: jnp.where(jnp.arange(x.shape[0]) == 0, jnp.nan, x**3 * y))
    report = testing.check_implementations(op, reference, _case, examples=2, gradients=False)
    assert math.isinf(_report_row(report, "pallas").results["output"].worst_error)


def test_a_numpy_reference_needs_a_reference_vjp_for_gradients(op):
    def numpy_reference(x, y):
        return np.power(np.asarray(x), 3) * np.asarray(y)

    report = testing.check_implementations(op, numpy_reference, _case, examples=1)
    assert any("reference_vjp" in f for f in report.implementations[0].failures)

    def numpy_vjp(d_out, /, x, y):
        return {"x": 3 * x**2 * y * d_out, "y": x**3 * d_out}

    testing.check_implementations(op, numpy_reference, _case, examples=2,
                                  reference_vjp=numpy_vjp).assert_ok()


def test_the_check_hook_and_tolerances(op):
    def same_dtype(arguments, out):
        assert out.dtype == arguments["x"].dtype, "dtype changed"

    def float32_out(arguments, out):
        assert out.dtype == jnp.float32, "not float32"

    cases = [testing.Case(jnp.ones(3, jnp.bfloat16), jnp.ones(3, jnp.bfloat16))]
    report = testing.check_implementations(op, reference, cases, check=same_dtype)
    assert report.ok
    failed = testing.check_implementations(op, reference, cases, check=float32_out)
    assert any("not float32" in f for f in failed.implementations[0].failures)
    assert report.implementations[0].results["output"].tolerance == pytest.approx(2 * 2**-7)
    strict = testing.check_implementations(op, reference, cases, tolerance={jnp.bfloat16: -1.0})
    assert not strict.ok


def test_relative_error_and_default_tolerances():
    e = np.array([1e3, 1.0, -2.0, 0.0])
    assert testing.relative_error(e, e) == 0.0
    # An error near a zero entry is measured against the result's typical size (rms).
    rms = math.sqrt(np.mean(e**2))
    assert testing.relative_error(e + [0, 0, 0, 1.0], e) == pytest.approx(1.0 / rms)
    assert testing.relative_error(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])) == 0.0
    assert math.isinf(testing.relative_error(np.array([1.0, 1.0]), np.array([np.nan, 1.0])))
    assert math.isinf(testing.relative_error(np.array([1, 2]), np.array([1, 3])))
    assert math.isinf(testing.relative_error(np.ones(3), np.ones(4)))
    assert testing.default_tolerance(jnp.bfloat16) == 2 * 2**-7
    assert testing.default_tolerance(jnp.float32) == 2e-5
    assert testing.default_tolerance(jnp.int32) == 0.0


def test_importable_without_pytest_or_hypothesis():
    code = ("import sys; sys.modules['pytest'] = None; sys.modules['hypothesis'] = None\n"
            "from kernelhub import testing\n"
            "print(testing.default_tolerance('float32'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_reference_reading_its_integer_arguments_on_the_host_is_differentiated_too():
    """The harness differentiates a jax.numpy reference jitted; one that reads a value on the
    host (here an int() of a jnp sum of its integer argument) cannot be jitted, and is
    differentiated op by op instead."""
    def repeat_sum(x: Float[Array, "n"], times: Int[Array, "r"]) -> Float[Array, "n"]:
        """x * sum(times)."""

    declared = kernelhub.define_op(repeat_sum, name=f"repeat_sum_{next(_names)}")
    try:
        kernelhub.register(declared, "xla", "any")(lambda x, times: x * jnp.sum(times).astype(x.dtype))

        def host_reference(x, times):
            return x * int(jnp.sum(times))

        def case(rng):
            return testing.Case(jnp.asarray(rng.normal(size=5), jnp.float32),
                                jnp.asarray(rng.integers(0, 4, size=3), jnp.int32))

        report = testing.check_implementations(declared, host_reference, case, examples=2)
        report.assert_ok()
        assert "gradient of x" in report.implementations[0].results
    finally:
        _registry.remove_op(declared)


def test_cases_of_one_shape_share_one_compiled_gradient(op):
    """Gradients are pulled back through one jitted program per implementation, shapes and
    static arguments: cases that differ only in their values compile it once."""
    def same_shape(rng):
        return testing.Case(jnp.asarray(rng.normal(size=6), jnp.float32),
                            jnp.asarray(rng.normal(size=6), jnp.float32))

    before = testing._shared_pullback._cache_size()
    testing.check_implementations(op, reference, same_shape, examples=4).assert_ok()
    assert testing._shared_pullback._cache_size() == before + 1
