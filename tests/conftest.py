"""Shared fixtures: the implementations that can run on this host, and how closely they match."""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
from kernelhub import testing

# Interpret-mode kernels run a Python-level emulation of every grid step: far fewer examples.
EXAMPLES = {"xla": 25, "interpret": 6}


runnable_implementations = testing.runnable_implementations


def implementation_params(op: str) -> list:
    return [pytest.param(spec, id=f"{spec.platform.value}-{spec.backend.value}")
            for spec in runnable_implementations(op)]


def call(spec: kernelhub.KernelSpec):
    """The op as a user forcing this implementation's platform gets it."""
    return kernelhub.get(spec.op, platform=spec.platform)


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
    atol = rtol * math.sqrt(max(contraction, 1)) * max(1.0, float(np.max(np.abs(expected), initial=0)) ** 0.5)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


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
            f"KERNELHUB_PLATFORM={os.environ.get('KERNELHUB_PLATFORM', '')!r}"]
