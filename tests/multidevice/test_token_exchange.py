"""token_exchange on 8 simulated devices against a numpy simulation of the contract.

The fixed-capacity all_to_all implementation runs here; the ragged_all_to_all one (TPU, GPU)
cannot run on XLA:CPU, so it is lowered for TPU and CUDA instead.
"""

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
from kernelhub import parallel
from kernelhub._collectives.ragged import ragged_exchange
from moe_cases import moe_problem, mlp_experts

AXIS = "x"
DEVICES = 8
ROWS, FEATURES = 12, 3


def simulate(rows, sizes, offsets, capacity):
    """(received [D, D, C, h], received_sizes [D, D], dropped [D]) indexed by receiver first."""
    received = np.zeros((DEVICES, DEVICES, capacity, rows.shape[-1]), rows.dtype)
    received_sizes = np.zeros((DEVICES, DEVICES), np.int32)
    dropped = np.zeros(DEVICES, np.int32)
    for source in range(DEVICES):
        for target in range(DEVICES):
            sent = min(sizes[source, target], capacity)
            start = offsets[source, target]
            received[target, source, :sent] = rows[source, start:start + sent]
            received_sizes[target, source] = sent
            dropped[source] += sizes[source, target] - sent
    return received, received_sizes, dropped


def random_runs(rng, packed: bool):
    """Per source: run sizes (some longer than the capacity of 3) and where they start."""
    sizes = np.stack([rng.multinomial(ROWS - 2, rng.dirichlet(np.ones(DEVICES)))
                      for _ in range(DEVICES)])
    if packed:
        offsets = np.cumsum(sizes, axis=1) - sizes
    else:  # runs anywhere in the rows, overlapping or not
        offsets = np.stack([[rng.integers(0, ROWS - s + 1) for s in row] for row in sizes])
    return sizes.astype(np.int32), offsets.astype(np.int32)


def exchange_on_mesh(capacity: int, with_offsets: bool, exchange=None):
    exchange = exchange or kernelhub.get("token_exchange")
    mesh = jax.make_mesh((DEVICES,), (AXIS,))

    def on_device(rows, sizes, offsets):
        result = exchange(rows[0], sizes[0], capacity, AXIS, offsets[0] if with_offsets else None)
        return result.received[None], result.received_sizes[None], result.dropped[None]

    sharded = jax.shard_map(on_device, mesh=mesh, in_specs=(P(AXIS),) * 3, out_specs=(P(AXIS),) * 3)

    def run(rows, sizes, offsets):
        place = lambda a: jax.device_put(a, NamedSharding(mesh, P(AXIS)))
        return sharded(place(rows), place(sizes), place(offsets))

    return jax.jit(run)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "offsets"])
def test_exchange_matches_simulation_values_and_gradients(packed):
    rng = np.random.default_rng(3 if packed else 4)
    capacity = 3
    rows = rng.normal(size=(DEVICES, ROWS, FEATURES)).astype(np.float32)
    sizes, offsets = random_runs(rng, packed)
    cotangent = rng.normal(size=(DEVICES, DEVICES, capacity, FEATURES)).astype(np.float32)
    run = exchange_on_mesh(capacity, with_offsets=not packed)

    received, received_sizes, dropped = run(rows, sizes, offsets)
    want_received, want_sizes, want_dropped = simulate(rows, sizes, offsets, capacity)
    np.testing.assert_array_equal(np.asarray(received), want_received)
    np.testing.assert_array_equal(np.asarray(received_sizes), want_sizes)
    np.testing.assert_array_equal(np.asarray(dropped), want_dropped)
    assert want_dropped.sum() > 0, "the case must exercise the capacity"

    d_rows = jax.jit(jax.grad(lambda r: jnp.sum(run(r, sizes, offsets)[0] * cotangent)))(rows)
    want_d_rows = np.zeros_like(rows)
    for source in range(DEVICES):
        for target in range(DEVICES):
            sent, start = want_sizes[target, source], offsets[source, target]
            want_d_rows[source, start:start + sent] += cotangent[target, source, :sent]
    np.testing.assert_allclose(np.asarray(d_rows), want_d_rows, rtol=1e-6, atol=1e-6)


def test_rows_that_are_not_sent_do_not_travel():
    rows = np.ones((DEVICES, ROWS, FEATURES), np.float32)
    rows[:, -1] = np.nan  # no run reaches the last row
    sizes = np.full((DEVICES, DEVICES), 1, np.int32)
    received, _, _ = exchange_on_mesh(2, with_offsets=False)(rows, sizes, sizes)
    assert np.isfinite(np.asarray(received)).all()


def _export_text(fn, args, platform: str) -> str:
    exported = jax.export.export(
        jax.jit(fn), platforms=[platform],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ragged_all_to_all")],
    )(*args)
    return exported.mlir_module()


@pytest.mark.parametrize(("backend", "platform"), [("tpu", "tpu"), ("gpu", "cuda")])
def test_ragged_exchange_is_chosen_for_accelerators_and_lowers(backend, platform):
    exchange = kernelhub.get("token_exchange", backend=backend)
    assert exchange.resolve().fn is ragged_exchange
    mesh = jax.make_mesh((DEVICES,), (AXIS,))
    sharding = NamedSharding(mesh, P(AXIS))
    args = (jax.ShapeDtypeStruct((DEVICES, ROWS, FEATURES), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((DEVICES, DEVICES), jnp.int32, sharding=sharding),
            jax.ShapeDtypeStruct((DEVICES, DEVICES), jnp.int32, sharding=sharding))
    run = exchange_on_mesh(4, with_offsets=True, exchange=exchange)
    text = _export_text(lambda *a: run(*a)[0], args, platform)
    assert "ragged_all_to_all" in text


def test_routed_layout_with_ragged_exchange_lowers_for_tpu_with_gradients():
    problem = moe_problem(seed=5, tokens=32, experts=8)
    mesh = jax.make_mesh((DEVICES,), (AXIS,))
    tpu_exchange = kernelhub.get("token_exchange", backend="tpu")
    tokens, expert_ids, weights, params = problem.jax_inputs()

    def loss(tokens, weights, params):
        out, _ = parallel.routed_tokens(mlp_experts(), tokens, expert_ids, weights, params,
                                        mesh=mesh, axis_name=AXIS, capacity=4,
                                        exchange=tpu_exchange)
        return jnp.sum(out ** 2)

    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
    args = jax.tree.map(spec, (tokens, weights, params))
    text = _export_text(jax.value_and_grad(loss, argnums=(0, 1, 2)), args, "tpu")
    # Two exchanges forward, and their transposes backward.
    assert text.count("stablehlo.custom_call @ragged_all_to_all") >= 4
