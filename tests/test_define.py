"""Users' own ops: declared with define_op, implemented with register, dispatched like ours."""

from __future__ import annotations

import inspect
import itertools
import pathlib
import re
import subprocess
import sys

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import kernelhub
import kernelhub.export
from kernelhub._core import registry as _registry
from kernelhub._core.registry import Platform

_names = itertools.count()
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def declare():
    """define_op for this test only: each op gets a fresh name and is forgotten afterwards."""
    declared = []

    def define(contract, **options):
        name = f"{contract.__name__}_{next(_names)}"
        op = kernelhub.define_op(contract, name=name, **options)
        declared.append(name)
        return op

    yield define
    for name in declared:
        _registry.remove_op(name)


def scale_rows(x: Float[Array, "rows cols"], weights: Float[Array, "rows"],
               factor: float = 1.0) -> Float[Array, "rows cols"]:
    """x * weights[:, None] * factor."""


def _scale_xla(x, weights, factor=1.0):
    return x * weights[:, None] * factor


def test_the_entry_point_carries_the_contract_and_dispatches(declare):
    op = declare(scale_rows)
    name = _registry.op_name(op)
    kernelhub.register(op, "xla", "any")(_scale_xla)
    assert list(inspect.signature(op).parameters) == ["x", "weights", "factor"]
    assert op.__doc__ == scale_rows.__doc__ and name in kernelhub.op_names()
    x, w = jnp.arange(6.0).reshape(2, 3), jnp.array([1.0, -2.0])
    np.testing.assert_array_equal(op(x, w, factor=0.5), [[0, 0.5, 1], [-3, -4, -5]])
    assert kernelhub.get(name) is kernelhub.get(op)
    assert kernelhub.resolve(op).platform is Platform.XLA
    # Differentiable, under jit and vmap, like the built-in ops.
    grad = jax.jit(jax.grad(lambda w: op(x, w).sum()))(w)
    np.testing.assert_allclose(grad, [3.0, 12.0])
    np.testing.assert_allclose(jax.vmap(op)(x[None], w[None])[0], op(x, w))


def test_the_contracts_shapes_are_checked_on_every_call(declare):
    op = declare(scale_rows)
    kernelhub.register(op, "xla", "any")(_scale_xla)
    with pytest.raises(Exception, match="rows"):  # jaxtyping names the axis that disagrees
        op(jnp.ones((2, 3)), jnp.ones((4,)))
    with pytest.raises(TypeError):
        op(jnp.ones((2, 3)), jnp.ones((2,)), factor="big")


def test_the_validation_hook_normalises_what_implementations_receive(declare):
    received = []

    def validate(arguments):
        if arguments["factor"] < 0:
            raise ValueError(f"factor must be >= 0, got {arguments['factor']}")
        return {**arguments, "factor": float(arguments["factor"]) * 2}

    op = declare(scale_rows, validate=validate)

    @kernelhub.register(op, "xla", "any")
    def implementation(x, weights, factor=1.0):
        received.append(factor)
        return _scale_xla(x, weights, factor)

    op(jnp.ones((1, 1)), jnp.ones((1,)), factor=1.5)
    assert set(received) == {3.0}
    with pytest.raises(ValueError, match="factor must be >= 0"):
        op(jnp.ones((1, 1)), jnp.ones((1,)), factor=-1.0)


def test_an_undeclared_op_cannot_be_registered_and_the_message_says_why():
    with pytest.raises(ValueError, match="unknown op 'scale_rowz'.*kernelhub.define_op"):
        kernelhub.register("scale_rowz", "xla", "any")(_scale_xla)
    assert "scale_rowz" not in kernelhub.op_names()


def test_a_name_is_declared_once(declare):
    op = declare(scale_rows)
    with pytest.raises(ValueError, match="already defined"):
        kernelhub.define_op(scale_rows, name=_registry.op_name(op))


def test_implementations_must_match_the_signature(declare):
    op = declare(scale_rows)
    with pytest.raises(TypeError, match="parameter 1 is 'w', expected 'weights'"):
        kernelhub.register(op, "xla", "any")(lambda x, w, factor=1.0: x)


def test_forcing_listing_and_errors_work_as_for_the_built_in_ops(declare, platform_variable):
    op = declare(scale_rows)
    name = _registry.op_name(op)
    kernelhub.register(op, "xla", "any")(_scale_xla)
    kernelhub.register(op, "pallas", "cpu", interpret_only=True)(
        lambda x, weights, factor=1.0: -_scale_xla(x, weights, factor))
    x, w = jnp.ones((2, 2)), jnp.ones((2,))
    assert float(op(x, w)[0, 0]) == 1.0  # interpret-only: never the default
    assert float(kernelhub.get(op, platform="pallas")(x, w)[0, 0]) == -1.0
    platform_variable("pallas")
    assert float(op(x, w)[0, 0]) == -1.0
    platform_variable("triton")
    with pytest.raises(kernelhub.NoImplementationError, match=f"no implementation of {name}"):
        op(x, w)
    platform_variable(None)
    listed = subprocess_free_listing(name)
    assert "pallas" in listed and "xla" in listed


def subprocess_free_listing(op: str) -> str:
    """What `kernelhub list --op` prints, run in this process (the op is declared here)."""
    import argparse
    import contextlib
    import io

    from kernelhub._cli import listing

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        listing.run(argparse.Namespace(op=op))
    return out.getvalue()


def test_a_platform_with_no_implementation_fails_when_lowered_for_it(declare):
    op = declare(scale_rows)
    kernelhub.register(op, "xla", "tpu", requirement=kernelhub.needs_device("tpu"))(_scale_xla)
    args = (jax.ShapeDtypeStruct((2, 3), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.float32))
    exported = kernelhub.export.export(lambda x, w: op(x, w), *args, platforms=("tpu",))
    assert exported.platforms == ("tpu",)
    with pytest.raises(kernelhub.NoImplementationError, match="cannot lower for cpu"):
        kernelhub.export.export(lambda x, w: op(x, w), *args, platforms=("cpu",))


def test_implementations_must_be_pure(declare):
    op = declare(scale_rows)

    @kernelhub.register(op, "xla", "any")
    def calling_the_host(x, weights, factor=1.0):
        return jax.experimental.io_callback(lambda v: v, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises(TypeError, match="side effects that cannot go through a custom VJP"):
        op(jnp.ones((1, 1)), jnp.ones((1,)))


def test_the_user_op_example_runs_as_documented():
    """examples/swiglu_op.py: declared outside kernelhub, checked by kernelhub.testing."""
    result = subprocess.run([sys.executable, "examples/swiglu_op.py", "--examples", "3"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "pallas/cpu (interpret)" in result.stdout and "xla/any" in result.stdout


def test_the_documented_snippets_are_the_examples_code():
    """docs/extending.md shows excerpts of examples/swiglu_op.py, which the test above runs."""
    example = (ROOT / "examples" / "swiglu_op.py").read_text()
    doc = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    excerpts = [b for b in blocks if "# from examples/swiglu_op.py" in b]
    assert excerpts
    for block in excerpts:
        code = block.replace("# from examples/swiglu_op.py\n", "")
        assert code in example, code[:200]



def test_runtime_checks_run_the_ops_own_hook_and_only_it(declare):
    seen = []

    def hook(arguments):
        seen.append(sorted(arguments))

    plain = declare(scale_rows)
    hooked = declare(scale_rows, runtime_check=hook)
    for op in (plain, hooked):
        kernelhub.register(op, "xla", "any")(_scale_xla)
    x, w = jnp.ones((2, 2)), jnp.ones((2,))
    with kernelhub.runtime_checks():
        jax.jit(plain)(x, w)  # an op without a hook: nothing to attach, nothing fails
        jax.jit(hooked)(x, w)
    assert seen == [["factor", "weights", "x"]]


def exponential(x: Float[Array, "n"]) -> Float[Array, "n"]:
    """exp(x)."""


def test_an_implementations_residuals_reach_its_backward_pass(declare):
    """What an implementation's forward keeps for its backward crosses the dispatcher: the
    lowered forward + gradient computes exp once (it used to run again inside the backward),
    and a jax.checkpoint policy decides by the residual's name whether it is kept or
    recomputed. The implementation is not jitted, so each computation of exp is inlined and
    counted once per run."""
    op = declare(exponential)

    @jax.custom_vjp
    def exp_kernel(x):
        return jnp.exp(x)

    def exp_forward(x):
        y = jax.ad_checkpoint.checkpoint_name(jnp.exp(x), "exp_of_x")
        return y, y

    exp_kernel.defvjp(exp_forward, lambda y, d_y: (d_y * y,))
    kernelhub.register(op, "xla", "any")(exp_kernel)
    x = jnp.array([0.5, -1.0, 2.0])
    policies = jax.checkpoint_policies
    cases = [(None, 1), (policies.save_only_these_names("exp_of_x"), 1),
             (policies.nothing_saveable, 2)]
    for policy, runs in cases:
        loss = lambda v: jnp.sum(op(v))  # noqa: E731
        if policy is not None:
            loss = jax.checkpoint(loss, policy=policy)
        step = jax.jit(jax.value_and_grad(loss))
        value, grad = step(x)
        np.testing.assert_allclose(value, np.sum(np.exp(x)), rtol=1e-6)
        np.testing.assert_allclose(grad, np.exp(x), rtol=1e-6)
        assert step.lower(x).as_text().count("stablehlo.exponential") == runs, policy


def _exp_keeping(residual):
    """An exp kernel whose VJP keeps residual(x, y) and rebuilds y = exp(x) from it."""

    @jax.custom_vjp
    def kernel(x):
        return jnp.exp(x)

    def forward(x):
        y = jnp.exp(x)
        return y, residual(x, y)

    kernel.defvjp(forward, lambda kept, d_y: (d_y * kept.reshape(-1)[:d_y.shape[0]],))
    return kernel


def test_targets_whose_residuals_differ_recompute_and_a_false_shared_name_is_an_error(declare):
    """Residuals cross the primitive only when every target keeps the same types: here the tpu
    implementation keeps y as [n, 1], the xla one as [n], so the backward recomputes (and is
    right on both). Declaring them one VJP family (`residuals=`) when they are not fails when
    the odd one lowers, naming it."""
    args = [jax.ShapeDtypeStruct((3,), jnp.float32)]

    def loss(v):
        return jnp.sum(op(v))

    for shared in (None, "one_family"):
        op = declare(exponential)
        kernelhub.register(op, "xla", "any", residuals=shared)(_exp_keeping(lambda x, y: y))
        kernelhub.register(op, "pallas", "tpu", residuals=shared)(
            _exp_keeping(lambda x, y: y[:, None]))
        x = jnp.array([0.5, -1.0, 2.0])
        np.testing.assert_allclose(jax.grad(loss)(x), np.exp(x), rtol=1e-6)
        if shared is None:
            exported = kernelhub.export.export(jax.grad(loss), *args, platforms=("cpu", "tpu"))
            assert exported.platforms == ("cpu", "tpu")
        else:
            with pytest.raises(TypeError, match="pallas/tpu.*residuals='one_family'"):
                kernelhub.export.export(jax.grad(loss), *args, platforms=("cpu", "tpu"))
