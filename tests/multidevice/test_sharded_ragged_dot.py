"""kernelhub.ragged_dot with experts sharded over 8 devices: the traced group_offset that
jax.lax.ragged_dot lacks, under shard_map's default checks, values and gradients against the
float64 reference of the unsharded call."""

from __future__ import annotations

import jax
import pytest

if jax.device_count() < 8:
    pytest.skip("needs 8 devices: tests/test_parallel.py runs this in a subprocess",
                allow_module_level=True)

import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import kernelhub
import reference
from conftest import assert_close

AXIS = "experts"
EXPERTS = 16


@pytest.mark.parametrize("platform", [None, "pallas"], ids=["unforced", "pallas-interpret"])
def test_ragged_dot_with_sharded_experts_matches_one_device(platform):
    rng = np.random.default_rng(2)
    m, k, n = 40, 8, 16
    lhs = jnp.asarray(rng.normal(size=(m, k)), jnp.float32)
    rhs = jnp.asarray(rng.normal(size=(EXPERTS, k, n)), jnp.float32)
    sizes = jnp.asarray(rng.multinomial(m - 3, np.full(EXPERTS, 1 / EXPERTS)), jnp.int32)
    d_out = jnp.asarray(rng.normal(size=(m, n)), jnp.float32)
    ragged_dot = kernelhub.get("ragged_dot", platform=platform)
    mesh = jax.make_mesh((8,), (AXIS,))

    def on_device(lhs, rhs, sizes):
        first = (jax.lax.axis_index(AXIS) * rhs.shape[0]).reshape(1)  # lax's [1]-shaped offset
        return jax.lax.psum(ragged_dot(lhs, rhs, sizes, group_offset=first), AXIS)

    sharded = jax.shard_map(on_device, mesh=mesh, in_specs=(P(), P(AXIS), P()), out_specs=P())
    rhs_sharded = jax.device_put(rhs, NamedSharding(mesh, P(AXIS)))

    @jax.jit
    def values_and_grads(lhs, rhs):
        out, pullback = jax.vjp(lambda a, b: sharded(a, b, sizes), lhs, rhs)
        return (out, *pullback(d_out))

    out, d_lhs, d_rhs = values_and_grads(lhs, rhs_sharded)
    host = np.asarray(sizes)
    want_lhs, want_rhs, _ = reference.gmm_vjp(lhs, rhs, host, d_out)
    assert_close(out, reference.gmm(lhs, rhs, host), jnp.float32, jnp.float32, contraction=k)
    assert_close(d_lhs, want_lhs, jnp.float32, jnp.float32, contraction=n)
    assert_close(d_rhs, want_rhs, jnp.float32, jnp.float32, contraction=m)
