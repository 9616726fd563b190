"""The opt-in check of group sizes under jit, and in-bounds behaviour without it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
from conftest import call, implementation_params

LHS, RHS = jnp.ones((8, 4)), jnp.ones((2, 4, 3))


@pytest.mark.parametrize("bad_sizes,message", [
    ([3, 9], "group_sizes sum to 12, more than the 8 rows"),
    ([-2, 5], "group_sizes must be >= 0"),
])
def test_runtime_check_raises_its_own_error_with_the_problem_first(bad_sizes, message):
    traced = jax.jit(lambda sizes: kernelhub.grouped_matmul(LHS, RHS, sizes))
    with pytest.raises(kernelhub.RuntimeCheckError, match=f"^{message}") as raised:
        with kernelhub.runtime_checks():
            jax.block_until_ready(traced(jnp.array(bad_sizes, jnp.int32)))
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value.__cause__, jax.errors.JaxRuntimeError)  # jax's own report


@pytest.mark.parametrize("op", ["ragged_dot", "grouped_matmul"])
def test_runtime_check_names_the_op_called(op):
    """ragged_dot runs ragged_dot_general's checks; its failure still names ragged_dot."""
    traced = jax.jit(lambda sizes: getattr(kernelhub, op)(LHS, RHS, sizes))
    with pytest.raises(kernelhub.RuntimeCheckError, match=f"sum to 12.*\\({op}\\)"):
        with kernelhub.runtime_checks():
            jax.block_until_ready(traced(jnp.array([3, 9], jnp.int32)))


def test_turning_checks_on_reaches_functions_jitted_and_run_before():
    """The switch is part of what jax.jit caches on: no stale trace runs unchecked."""
    f = jax.jit(lambda sizes: kernelhub.grouped_matmul(LHS, RHS, sizes))
    bad = jnp.array([3, 9], jnp.int32)
    out = np.asarray(f(bad))  # traced and run without checks: clamped, no error
    assert out.shape == (8, 3) and np.isfinite(out).all()
    with pytest.raises(kernelhub.RuntimeCheckError, match="sum to 12"):
        with kernelhub.runtime_checks():
            jax.block_until_ready(f(bad))
    assert np.isfinite(np.asarray(f(bad))).all()  # off again outside the block


def test_a_failed_check_is_reported_even_if_not_waited_for_in_the_block():
    f = jax.jit(lambda sizes: kernelhub.grouped_matmul(LHS, RHS, sizes))
    with pytest.raises(kernelhub.RuntimeCheckError, match="sum to 12"):
        with kernelhub.runtime_checks():
            f(jnp.array([3, 9], jnp.int32))  # not waited for: the block's end waits


def test_runtime_check_from_environment():
    """KERNELHUB_RUNTIME_CHECKS=1 is read when kernelhub is first used: a fresh process."""
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, kernelhub
        f = jax.jit(lambda offset: kernelhub.grouped_matmul(
            jnp.ones((8, 4)), jnp.ones((1, 4, 3)), jnp.array([3, 5]), group_offset=offset))
        try:
            jax.block_until_ready(f(2))
        except jax.errors.JaxRuntimeError as error:
            print("CAUGHT", kernelhub._core.runtime_checks.problem_in(error))
    """)
    env = {**os.environ, "KERNELHUB_RUNTIME_CHECKS": "1", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env=env)
    assert "CAUGHT group_offset=2 with 1 local groups" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("spec", implementation_params("grouped_matmul"))
def test_out_of_range_sizes_under_jit_stay_in_bounds(spec):
    """Without the check, bad sizes clamp: finite values, exactly the right shape, no crash."""
    gmm = call(spec)
    f = jax.jit(lambda sizes, offset: gmm(LHS, RHS, sizes, group_offset=offset))
    for sizes, offset in (([100, 100, 7], 0), ([-50, 70, 1], 1), ([2, 2, 2], 5)):
        out = np.asarray(f(jnp.array(sizes, jnp.int32), offset))
        assert out.shape == (8, 3) and np.isfinite(out).all()


@pytest.mark.parametrize("spec", implementation_params("transposed_grouped_matmul"))
def test_tgmm_out_of_range_sizes_under_jit_stay_in_bounds(spec):
    tgmm = call(spec)
    f = jax.jit(lambda sizes, offset: tgmm(LHS.T, jnp.ones((8, 3)), sizes, group_offset=offset,
                                           num_actual_groups=2))
    for sizes, offset in (([100, 100, 7], 0), ([-50, 70, 1], 1), ([2, 2, 2], 5)):
        out = np.asarray(f(jnp.array(sizes, jnp.int32), offset))
        assert out.shape == (2, 4, 3) and np.isfinite(out).all()
