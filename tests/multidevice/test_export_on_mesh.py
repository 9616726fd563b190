"""Whole expert-parallel MoE blocks with their gradients, exported once for cpu, tpu and cuda.

The layouts call the grouped matmuls and the token exchange unforced, so each platform's
lowering must hold its own choices: the XLA loops and the fixed-capacity all_to_all for CPU,
the Mosaic kernels and the ragged all-to-all for TPU, the Triton kernels and the ragged
all-to-all for CUDA. A deserialized artifact runs on the 8 simulated CPU devices, unless it
holds a ragged all-to-all: XLA:CPU refuses that op even in a branch for another platform.
"""

from __future__ import annotations

import jax
import pytest

if jax.device_count() < 8:
    pytest.skip("needs 8 devices: tests/test_parallel.py runs this in a subprocess",
                allow_module_level=True)

import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType

import kernelhub
import kernelhub.export
from kernelhub import parallel
from moe_cases import mlp_experts, moe_problem, moe_reference

DEVICES = 8
RAGGED = "ragged_all_to_all"


def _mesh():
    return jax.make_mesh((DEVICES,), ("expert",), axis_types=(AxisType.Explicit,))


def _loss_and_grads(block):
    def loss_and_grads(tokens, weights, params):
        def loss(tokens, weights, params):
            out = block(tokens, weights, params)
            return jnp.sum(out**2), out

        (value, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
            tokens, weights, params)
        return value, out, grads

    return loss_and_grads


def test_routed_block_exports_each_platforms_kernels_and_exchange():
    problem = moe_problem(seed=3, tokens=32, experts=8)
    mesh = _mesh()
    experts = mlp_experts(gmm=kernelhub.grouped_matmul)  # unforced: chosen per platform
    tokens, expert_ids, weights, params = problem.jax_inputs()

    def block(tokens, weights, params):
        return parallel.routed_tokens(experts, tokens, expert_ids, weights, params, mesh=mesh,
                                      axis_name="expert", capacity=4)[0]

    exported = kernelhub.export.export(_loss_and_grads(block), tokens, weights, params)
    calls = kernelhub.export.custom_calls_by_platform(exported)
    kernels = kernelhub.export.kernels_by_platform(exported)
    # Two grouped matmuls forward, two kernels each backward; two exchanges forward and their
    # transposes backward.
    assert kernels["cpu"] == {} and RAGGED not in calls["cpu"]
    assert kernels["tpu"] == {"mosaic": 6} and calls["tpu"][RAGGED] >= 4
    assert kernels["cuda"] == {"triton": 6} and calls["cuda"][RAGGED] >= 4


def test_replicated_block_artifact_runs_on_the_cpu_mesh():
    problem = moe_problem(seed=4, tokens=32, experts=8)
    mesh = _mesh()
    experts = mlp_experts(gmm=kernelhub.grouped_matmul)
    tokens, expert_ids, weights, params = problem.jax_inputs()

    def block(tokens, weights, params):
        return parallel.replicated_tokens(experts, tokens, expert_ids, weights, params,
                                          mesh=mesh, axis_name="expert", reduce="psum")

    exported = kernelhub.export.export(_loss_and_grads(block), tokens, weights, params)
    assert kernelhub.export.kernels_by_platform(exported) == {
        "cpu": {}, "tpu": {"mosaic": 6}, "cuda": {"triton": 6}}
    with jax.set_mesh(mesh):  # the artifact's outputs are typed by the mesh it was made on
        value, out, _ = jax.export.deserialize(exported.serialize()).call(tokens, weights, params)
    np.testing.assert_allclose(np.asarray(out), moe_reference(problem), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(value), np.sum(moe_reference(problem) ** 2), rtol=1e-4)


def test_mosaic_gpu_kernels_in_a_block_hold_the_collectives_the_triton_kernels_do():
    """The replicated block's gradients lowered for cuda with each GPU kernel forced: the same
    all-reduces. plgpu.kernel types its output the same on every device; untyped by the
    kernels, the expert outputs' cotangents were summed over the devices once more (one
    all-reduce more, wrong gradients in expert-parallel training on the Mosaic GPU kernels)."""
    problem = moe_problem(seed=5, tokens=32, experts=8)
    mesh = _mesh()
    tokens, expert_ids, weights, params = problem.jax_inputs()
    all_reduces = {}
    for platform in ("triton", "mosaic"):
        experts = mlp_experts(gmm=kernelhub.get("grouped_matmul", platform=platform,
                                                backend="gpu"))

        def block(tokens, weights, params, experts=experts):
            return parallel.replicated_tokens(experts, tokens, expert_ids, weights, params,
                                              mesh=mesh, axis_name="expert", reduce="psum")

        lowered = jax.jit(_loss_and_grads(block)).trace(tokens, weights, params).lower(
            lowering_platforms=("cuda",))
        all_reduces[platform] = lowered.as_text().count("all_reduce")
    assert all_reduces["mosaic"] == all_reduces["triton"] > 0, all_reduces
