"""The ops as users call them (one implementation per platform, chosen at lowering) through
jax's transformations: jit, grad, vmap of grad, remat, scan, and second derivatives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

import kernelhub
import reference
from conftest import assert_close
from kernelhub._core import registry as _registry
from strategies import normal

SIZES = np.array([3, 0, 5, 1], np.int32)  # 9 of 11 rows: the last two belong to no group


def _problem(seed: int = 0, m: int = 11, k: int = 6, n: int = 5):
    rng = np.random.default_rng(seed)
    return (normal(rng, (m, k), jnp.float32), normal(rng, (4, k, n), jnp.float32),
            normal(rng, (m, n), jnp.float32))


def test_eager_and_jitted_calls_agree_with_the_reference():
    lhs, rhs, _ = _problem()
    want = reference.gmm(lhs, rhs, SIZES)
    eager = kernelhub.grouped_matmul(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(SIZES))
    jitted = jax.jit(kernelhub.grouped_matmul)(lhs, rhs, SIZES)
    assert_close(eager, want, jnp.float32, jnp.float32, contraction=6)
    np.testing.assert_array_equal(eager, jitted)


def test_gradients_under_remat_and_scan_match_the_reference():
    lhs, rhs, d_out = _problem(1)

    def layer(x, weights):
        return kernelhub.grouped_matmul(x, weights, SIZES)

    def loss(x, weights):
        return jnp.sum(layer(x, weights) * d_out)

    want_lhs, want_rhs, _ = reference.gmm_vjp(lhs, rhs, SIZES, d_out)
    for policy in (None, jax.checkpoint_policies.nothing_saveable):
        grads = jax.jit(jax.grad(jax.checkpoint(loss, policy=policy), argnums=(0, 1)))(lhs, rhs)
        assert_close(grads[0], want_lhs, jnp.float32, jnp.float32, contraction=5)
        assert_close(grads[1], want_rhs, jnp.float32, jnp.float32, contraction=11)

    # Two layers in a scan, the second fed the first's output (k = n here).
    square = normal(np.random.default_rng(2), (2, 4, 6, 6), jnp.float32)

    def stacked(x, weights):
        out, _ = jax.lax.scan(lambda h, w: (jnp.tanh(layer(h, w)), None), x, weights)
        return jnp.sum(out)

    def dense_stacked(x, weights):
        for w in weights:
            x = jnp.tanh(_dense(x, w))
        return jnp.sum(x)

    got = jax.jit(jax.grad(stacked, argnums=(0, 1)))(lhs, square)
    want = jax.grad(dense_stacked, argnums=(0, 1))(jnp.asarray(lhs), jnp.asarray(square))
    assert_close(got[0], want[0], jnp.float32, jnp.float32, contraction=36)
    assert_close(got[1], want[1], jnp.float32, jnp.float32, contraction=36)


def _dense(x, weights):
    """gmm with SIZES as a masked dense product, differentiable by jax (no kernelhub code)."""
    group = np.repeat(np.arange(4), SIZES)
    rows = np.zeros(x.shape[0], np.int32)
    rows[:group.size] = group
    keep = (np.arange(x.shape[0]) < group.size)[:, None]
    return jnp.where(keep, jnp.einsum("mk,mkn->mn", x, weights[rows]), 0.0)


def test_vmap_of_gradients_matches_the_reference():
    lhs, rhs, d_out = _problem(3)
    batch_lhs = np.stack([lhs, -lhs])

    def loss(x, weights):
        return jnp.sum(kernelhub.grouped_matmul(x, weights, SIZES) * d_out)

    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, None)))(batch_lhs, rhs)
    for b, x in enumerate(batch_lhs):
        want_lhs, want_rhs, _ = reference.gmm_vjp(x, rhs, SIZES, d_out)
        assert_close(grads[0][b], want_lhs, jnp.float32, jnp.float32, contraction=5)
        assert_close(grads[1][b], want_rhs, jnp.float32, jnp.float32, contraction=11)


def cube(x: Float[Array, "n"]) -> Float[Array, "n"]:
    """x ** 3."""


def test_second_derivatives_where_the_implementation_has_them():
    """A pullback is differentiable in turn when the implementation's VJP is (plain jax here;
    the grouped matmuls' loops with traced bounds are not)."""
    op = kernelhub.define_op(cube, name="cube_for_second_derivatives")
    try:
        kernelhub.register(op, "xla", "any")(lambda x: x**3)
        x = jnp.array([0.5, -1.0, 2.0])
        # Reverse over reverse: custom VJPs (ours included) have no forward mode.
        hessian = jax.jit(jax.jacrev(jax.jacrev(lambda v: jnp.sum(op(v)))))(x)
        np.testing.assert_allclose(hessian, np.diag(6 * np.asarray(x)), rtol=1e-6)
    finally:
        _registry.remove_op(op)
