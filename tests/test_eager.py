"""Eager calls: a remembered preparation serves calls that look alike, values are still checked,
and no call waits on a device to check them (kernelhub/_core/dispatch.py, value_checks.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import reference
from conftest import assert_close
from kernelhub._core import dispatch, value_checks

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"


def _operands(m=12, k=8, n=6, groups=3, seed=0):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((groups, k, n)), jnp.float32)
    return lhs, rhs


def _fresh(op: str):
    """A dispatcher of `op` on the xla implementation, with no plan remembered yet."""
    return dispatch.Dispatched(op, kernelhub.Platform.XLA, None)


def _confirmed_plans(dispatched) -> int:
    return sum(plan.confirmed for plan in dispatched._plans.values())


def test_a_repeated_call_reuses_its_checked_plan_and_stays_exact():
    gmm = _fresh(GMM)
    lhs, rhs = _operands()
    for call, sizes in enumerate(([4, 4, 4], [0, 7, 5], [12, 0, 0], [1, 2, 3])):
        out = gmm(lhs, rhs, jnp.asarray(sizes, jnp.int32))
        expected = reference.gmm(np.asarray(lhs, np.float64), np.asarray(rhs, np.float64),
                                 np.asarray(sizes))
        assert_close(out, expected, jnp.float32, contraction=8)
        assert _confirmed_plans(gmm) == (1 if call >= 1 else 0)


def test_a_remembered_plan_still_checks_values():
    gmm = _fresh(GMM)
    lhs, rhs = _operands()
    for _ in range(3):
        gmm(lhs, rhs, jnp.asarray([4, 4, 4], jnp.int32))
    assert _confirmed_plans(gmm) == 1

    def ready(values):
        # Sizes still being computed are checked at the next call (value_checks' deferral, tested
        # below); ready ones are checked by the call itself, as this test means to show.
        return jnp.asarray(values, jnp.int32).block_until_ready()

    with pytest.raises(ValueError, match="group_sizes sum to 13, more than the 12 rows"):
        gmm(lhs, rhs, ready([4, 4, 5]))
    with pytest.raises(ValueError, match="group_sizes must be >= 0"):
        gmm(lhs, rhs, ready([4, -1, 4]))


def test_other_static_arguments_are_validated_again():
    gmm = _fresh(GMM)
    lhs, rhs = _operands()
    sizes = jnp.asarray([4, 4, 4], jnp.int32)
    for _ in range(3):
        gmm(lhs, rhs, sizes)
    with pytest.raises(ValueError, match="tiling"):
        gmm(lhs, rhs, sizes, tiling=(0, 8, 8))
    with pytest.raises(TypeError, match="preferred_element_type"):
        gmm(lhs, rhs, sizes, preferred_element_type=jnp.int32)


def test_an_offset_that_decides_the_output_shape_is_never_remembered():
    """tgmm without num_actual_groups reads a jax-array offset: each call gets its own count."""
    tgmm = _fresh(TGMM)
    lhs, rhs = jnp.ones((4, 12)), jnp.ones((12, 5))
    sizes = jnp.asarray([4, 4, 4], jnp.int32)
    for offset, groups in ((0, 3), (0, 3), (0, 3), (1, 2), (2, 1)):
        assert tgmm(lhs, rhs, sizes, group_offset=jnp.asarray(offset)).shape == (groups, 4, 5)


@pytest.fixture
def values_on_an_accelerator(monkeypatch):
    """Every jax array's values count as out of the host's reach (an accelerator's, or still
    being computed); records each blocking read of one."""
    reads = []
    real_read = value_checks._read

    def read(value):
        reads.append(value)
        return real_read(value)

    monkeypatch.setattr(value_checks, "_host_value",
                        lambda value: None if isinstance(value, jax.Array) else np.asarray(value))
    monkeypatch.setattr(value_checks, "_read", read)
    yield reads
    value_checks.settle()


def test_device_values_are_checked_without_waiting(values_on_an_accelerator):
    lhs, rhs = _operands()
    bad = jnp.asarray([4, 4, 9], jnp.int32)
    out = kernelhub.grouped_matmul(lhs, rhs, bad)  # returns: nothing waited for the sizes
    assert out.shape == (12, 6) and not values_on_an_accelerator
    out.block_until_ready()
    with pytest.raises(ValueError, match="sum to 17.*after an earlier call of grouped_matmul"):
        kernelhub.grouped_matmul(lhs, rhs, jnp.asarray([4, 4, 4], jnp.int32))


def test_runtime_checks_settle_pending_value_checks(values_on_an_accelerator):
    lhs, rhs = _operands()
    with pytest.raises(ValueError, match="group_sizes must be >= 0"):
        with kernelhub.runtime_checks():
            kernelhub.grouped_matmul(lhs, rhs, jnp.asarray([-1, 4, 4], jnp.int32))


def test_host_values_are_checked_at_once(values_on_an_accelerator):
    lhs, rhs = _operands()
    with pytest.raises(ValueError, match="sum to 13"):
        kernelhub.grouped_matmul(lhs, rhs, np.asarray([4, 4, 5], np.int32))
    with pytest.raises(ValueError, match="group_offset=3"):
        kernelhub.grouped_matmul(lhs, rhs[:1], np.asarray([4, 4, 4], np.int32), group_offset=3)


def test_the_same_array_is_read_once():
    """A check an array passed is remembered, whether it ran at the call (the values were
    computed) or later (pending until they were: under load the sizes' own computation may
    not have finished when the call reads them)."""
    lhs, rhs = _operands()
    sizes = jnp.asarray([4, 4, 4], jnp.int32)
    kernelhub.grouped_matmul(lhs, rhs, sizes)
    value_checks.settle()
    assert value_checks.passed(("group_sizes", 12, GMM), sizes)
    assert not value_checks.passed(("group_sizes", 11, GMM), sizes)


def test_a_check_that_passed_once_its_values_arrived_is_remembered(values_on_an_accelerator):
    lhs, rhs = _operands()
    sizes = jnp.asarray([4, 4, 4], jnp.int32)
    kernelhub.grouped_matmul(lhs, rhs, sizes)
    value_checks.settle()
    assert value_checks.passed(("group_sizes", 12, GMM), sizes)
    kernelhub.grouped_matmul(lhs, rhs, sizes)
    value_checks.settle()
    assert len(values_on_an_accelerator) == 1  # read for the first call's check only


def test_host_sizes_inside_jit_are_checked_when_traced():
    """Concrete sizes closed over by a traced function are checked, though other arguments are
    tracers."""
    traced = jax.jit(lambda lhs, rhs: kernelhub.grouped_matmul(lhs, rhs, np.asarray([4, 4, 5])))
    with pytest.raises(ValueError, match="sum to 13, more than the 12 rows"):
        traced(*_operands())
