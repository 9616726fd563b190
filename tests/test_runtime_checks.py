"""The opt-in check of group sizes under jit, and in-bounds behaviour without it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
from conftest import call, implementation_params

LHS, RHS = jnp.ones((8, 4)), jnp.ones((2, 4, 3))


@pytest.mark.parametrize("bad_sizes,message", [
    ([3, 9], "sum to 12, more than the 8 rows"),
    ([-2, 5], "must be >= 0"),
])
def test_runtime_check_reports_bad_sizes_under_jit(bad_sizes, message):
    f = jax.jit(lambda sizes: kernelhub.grouped_matmul(LHS, RHS, sizes))
    with kernelhub.runtime_checks():
        traced = jax.jit(lambda sizes: kernelhub.grouped_matmul(LHS, RHS, sizes))
        with pytest.raises(Exception, match=message):
            jax.block_until_ready(traced(jnp.array(bad_sizes, jnp.int32)))
    # Off by default: no error, and nothing outside the buffers is touched.
    out = np.asarray(f(jnp.array(bad_sizes, jnp.int32)))
    assert out.shape == (8, 3) and np.isfinite(out).all()


def test_runtime_check_from_environment(monkeypatch):
    monkeypatch.setenv("KERNELHUB_RUNTIME_CHECKS", "1")
    f = jax.jit(lambda offset: kernelhub.grouped_matmul(LHS, RHS[:1], jnp.array([3, 5]), group_offset=offset))
    with pytest.raises(Exception, match="group_offset=2"):
        jax.block_until_ready(f(2))


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
