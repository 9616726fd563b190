"""Expert parallelism: the pieces that need one device here, and the 8-device suite in a child.

The multi-device tests (tests/multidevice) need XLA_FLAGS set before jax starts, so
`test_multidevice_suite` runs them in a fresh interpreter with 8 simulated CPU devices; this
process keeps its single device.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import kernelhub
from kernelhub import parallel
from multidevice.moe_cases import load_example, mlp_experts, moe_problem, moe_reference

ROOT = pathlib.Path(__file__).resolve().parents[1]
EIGHT_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"


@pytest.mark.multidevice
def test_multidevice_suite():
    # A clean child: no forced platform, no pytest or xdist state from this run.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KERNELHUB_", "PYTEST_"))}
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {EIGHT_DEVICES_FLAG}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    # The Mosaic GPU interpreter's kernels take turns, each of the 8 devices' waiting calls
    # holding one of XLA's CPU client threads (kernelhub/_pallas/mosaic_gpu/config.py,
    # interpreter_threads): 12 covers a warp-specialized kernel launched from all 8.
    env["NPROC"] = str(max(int(env.get("NPROC") or 0), 12))
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/multidevice", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    summary = child.stdout.strip().splitlines()[-1:] or ["(no output)"]
    assert child.returncode == 0, f"{summary[0]}\n{child.stdout[-6000:]}\n{child.stderr[-3000:]}"
    assert " passed" in summary[0] and "skipped" not in summary[0], summary[0]


def test_apply_experts_matches_float64_reference():
    problem = moe_problem(seed=1, tokens=24, experts=6, top_k=3)
    tokens, expert_ids, weights, params = problem.jax_inputs()
    block = jax.jit(lambda *a: parallel.apply_experts(mlp_experts(), *a))
    out = block(tokens, expert_ids, weights, params)
    np.testing.assert_allclose(np.asarray(out), moe_reference(problem), rtol=1e-4, atol=1e-5)


def test_route_sorts_choices_by_expert_and_keeps_token_order():
    expert_ids = jnp.asarray([[2, 0], [0, 1], [2, 1]], jnp.int32)
    routing = parallel.route(expert_ids, num_experts=4)
    np.testing.assert_array_equal(routing.group_sizes, [2, 2, 2, 0])
    np.testing.assert_array_equal(routing.token_of_row, [0, 1, 1, 2, 0, 2])
    np.testing.assert_array_equal(routing.choice_of_row, [1, 2, 3, 5, 0, 4])


@pytest.mark.parametrize("layout", ["replicated", "routed"])
def test_layouts_on_a_one_device_mesh_equal_the_unsharded_block(layout):
    problem = moe_problem(seed=2, tokens=16, experts=4)
    inputs = problem.jax_inputs()
    mesh = jax.make_mesh((1,), ("expert",))
    if layout == "replicated":
        def block(*a):
            return parallel.replicated_tokens(mlp_experts(), *a, mesh=mesh, axis_name="expert")
    else:
        def block(*a):
            return parallel.routed_tokens(mlp_experts(), *a, mesh=mesh, axis_name="expert",
                                          capacity=parallel.safe_capacity(16, 2, 4))[0]
    out = jax.jit(block)(*inputs)
    np.testing.assert_allclose(np.asarray(out), moe_reference(problem), rtol=1e-4, atol=1e-5)


def _exchange_on_one_device(rows, send_sizes, capacity=4, axis_name="x", send_offsets=None):
    """Calls token_exchange on a one-device mesh; numpy arguments stay concrete inside."""
    mesh = jax.make_mesh((1,), ("x",))
    exchange = kernelhub.get("token_exchange")

    def on_device(dummy):
        return exchange(rows, send_sizes, capacity, axis_name, send_offsets).received + dummy

    return jax.shard_map(on_device, mesh=mesh, in_specs=P(), out_specs=P("x"))(jnp.float32(0))


def test_token_exchange_on_one_device_keeps_its_rows():
    rows = np.arange(12, dtype=np.float32).reshape(6, 2)
    received = _exchange_on_one_device(rows, np.asarray([3], np.int32), capacity=4)
    np.testing.assert_array_equal(received[0], np.concatenate([rows[:3], np.zeros((1, 2))]))


@pytest.mark.parametrize(("arguments", "error", "message"), [
    (dict(send_sizes=np.asarray([1, 1], np.int32)), ValueError,
     r"send_sizes must have shape \(1,\)"),
    (dict(send_sizes=np.asarray([-1], np.int32)), ValueError, "send_sizes must be >= 0"),
    (dict(send_sizes=np.asarray([7], np.int32)), ValueError, "within the 6 rows"),
    (dict(send_offsets=np.asarray([5], np.int32)), ValueError, "within the 6 rows"),
    (dict(capacity=0), TypeError, "capacity must be a positive int"),
    (dict(capacity=True), TypeError, "capacity must be a positive int"),
    (dict(axis_name="y"), ValueError, "axis_name='y' is not a bound mesh axis"),
    (dict(rows=np.zeros((6, 2), bool)), TypeError, "rows must have a float or integer dtype"),
    (dict(send_sizes=np.asarray([1.0], np.float32)), TypeError, "send_sizes"),
])
def test_token_exchange_rejects_bad_arguments_naming_them(arguments, error, message):
    call = dict(rows=np.zeros((6, 2), np.float32), send_sizes=np.asarray([2], np.int32))
    call.update(arguments)
    with pytest.raises(error, match=message):
        _exchange_on_one_device(**call)


def test_token_exchange_outside_shard_map_says_where_to_call_it():
    with pytest.raises(ValueError, match="inside jax.shard_map"):
        kernelhub.get("token_exchange")(
            np.zeros((2, 2), np.float32), np.asarray([2], np.int32), 2, "x")


def test_capacities():
    assert parallel.safe_capacity(32, 2, 1) == 32       # one expert per device: one row per token
    assert parallel.safe_capacity(32, 2, 4) == 64       # both choices may land on one device
    assert parallel.balanced_capacity(32, 2, 8, 1, capacity_factor=1.25) == 16  # 8 * 1.25 -> 16
    assert parallel.balanced_capacity(32, 2, 2, 4, capacity_factor=4.0) == 64   # capped at safe
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        parallel.safe_capacity(32, 0, 1)
    parallel.raise_on_overflow(jnp.int32(0))
    with pytest.raises(parallel.TokenOverflowError, match="3 token rows did not fit"):
        parallel.raise_on_overflow(jnp.int32(3))


_FLOAT_RUN: dict = {}


def float_run() -> dict:
    """The example's 40 float32 steps, run once per test process (its tests compare with it)."""
    if not _FLOAT_RUN:
        _FLOAT_RUN.update(load_example().main(["--steps", "40", "--layout", "local"]))
    return _FLOAT_RUN


@pytest.mark.standard_promotion(reason="optax's optimizers mix int32 step counts with floats")
def test_example_trains_and_loss_falls():
    result = float_run()
    losses = result["losses"]
    assert result["layout"] == "local" and len(losses) == 40
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    assert result["steps_per_second"] > 0


@pytest.mark.standard_promotion(reason="optax's optimizers mix int32 step counts with floats")
# Each way the example quantizes, once: per row and column (int8), in scale blocks
# (fp8-blocks, e4m3) and by a recipe of per-pass formats (mxfp8). Left out for CI's time, each
# about 10 s, and run until 2026-11-29: fp8 (int8's scales on e4m3 values) and mxfp8-fwd (a
# recipe whose backward is the float gradient of the quantized forward, checked as such in
# tests/test_quantized_training.py).
@pytest.mark.parametrize("quantize", ["int8", "fp8-blocks", "mxfp8"])
def test_example_trains_with_quantized_expert_matmuls(quantize):
    """Straight-through gradients (and the MXFP8 recipe's per-pass formats) train the float
    weights about as well as float matmuls."""
    example = load_example()
    quantized = example.main(["--steps", "40", "--layout", "local", "--quantize", quantize])
    plain = float_run()
    losses = quantized["losses"]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    assert abs(np.mean(losses[-5:]) - np.mean(plain["losses"][-5:])) < 0.1 * np.mean(losses[-5:])


@pytest.mark.standard_promotion(reason="optax's optimizers mix int32 step counts with floats")
@pytest.mark.parametrize("serve", ["int4", "nvfp4"])
def test_example_serves_a_float_trained_block_in_four_bits(serve):
    """--quantize int4 / nvfp4 train in float32 (the same losses as float) and report the
    held-out loss served in 4 bits, close to the float weights' own."""
    example = load_example()
    served = example.main(["--steps", "40", "--layout", "local", "--quantize", serve])
    plain = float_run()
    np.testing.assert_array_equal(served["losses"], plain["losses"])
    assert abs(served["served_loss"] - served["float_loss"]) < 0.25 * served["float_loss"], served
