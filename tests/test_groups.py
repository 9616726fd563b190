"""Where each group's rows lie (kernelhub/_grouped_matmul/groups.py): the running sums every implementation
and every gradient builds on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelhub._grouped_matmul.groups import group_bounds, running_sum

INT32_MAX = 2**31 - 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=40))
def test_running_sum_is_the_inclusive_sum(values):
    np.testing.assert_array_equal(running_sum(jnp.asarray(values, jnp.int32)), np.cumsum(values))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-(2**31), INT32_MAX), min_size=1, max_size=12),
       st.integers(0, INT32_MAX))
def test_saturating_running_sum_never_wraps(values, limit):
    expected = np.minimum(np.cumsum(np.clip(np.asarray(values, np.int64), 0, limit)), limit)
    got = jax.jit(lambda v: running_sum(v, limit=limit))(jnp.asarray(values, jnp.int32))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("sizes, rows, starts, ends", [
    ([2**30, 2**30, 5], 16, [0, 16, 16], [16, 16, 16]),  # the int32 sum would wrap negative
    ([INT32_MAX, INT32_MAX, 5], INT32_MAX, [0, INT32_MAX, INT32_MAX], [INT32_MAX] * 3),
    ([4, -3, 5, 20], 16, [0, 4, 4, 9], [4, 4, 9, 16]),  # negative sizes count as 0
])
def test_group_bounds_stay_in_rows(sizes, rows, starts, ends):
    for fn in (group_bounds, jax.jit(group_bounds, static_argnums=1)):
        got_starts, got_ends = fn(jnp.asarray(sizes, jnp.int32), rows)
        np.testing.assert_array_equal(got_starts, starts)
        np.testing.assert_array_equal(got_ends, ends)


def test_no_cumsum_primitive():
    """jax 0.11 lowers cumsum for CUDA through a composite whose fallback is a while loop (each
    step a host round trip on a GPU; seen in an H100 export, 2026-11-25): the running sums are
    log-depth scans of plain adds instead."""
    jaxpr = str(jax.make_jaxpr(lambda s: group_bounds(s, 100))(jnp.ones((8,), jnp.int32)))
    assert "cumsum" not in jaxpr and "while" not in jaxpr


@pytest.mark.parametrize("jit", [False, True])
def test_group_sums_keep_a_nan_or_an_infinity_in_its_own_group(jit):
    """The bias gradient's per-group sums (a one-hot product for finite values): a NaN or an
    infinity in one group's row reaches only that group's sum; rows of other shards' groups,
    NaN or not, reach none."""
    from kernelhub._grouped_matmul.groups import group_sums

    values = np.arange(24, dtype=np.float32).reshape(8, 3)
    values[0, 0] = np.nan  # group 0: not local (offset 1)
    values[3, 1] = np.nan  # group 1 (rows 2-4)
    values[6, 2] = np.inf  # group 2 (rows 5-7)
    sizes, offset = jnp.array([2, 3, 3], jnp.int32), jnp.int32(1)
    sums = (jax.jit(group_sums, static_argnums=3) if jit else group_sums)(
        jnp.asarray(values), sizes, offset, 2)
    want = np.stack([values[2:5].sum(0), values[5:8].sum(0)])
    np.testing.assert_array_equal(np.asarray(sums), want)  # NaN and inf where they belong
    finite = np.nan_to_num(values, nan=0.0, posinf=0.0)
    sums = group_sums(jnp.asarray(finite), sizes, offset, 2)
    np.testing.assert_array_equal(np.asarray(sums), np.stack([finite[2:5].sum(0),
                                                              finite[5:8].sum(0)]))
