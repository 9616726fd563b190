"""The registry: registration rules, signature checks, listing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import kernelhub
from kernelhub._core import registry as _registry
from kernelhub._core.registry import Backend, Platform


def _gmm_like(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=None,
              group_offset=None, existing_out=None, transpose_rhs=False):
    return "fake"


@pytest.fixture
def fake_tpu_kernel():
    kernelhub.register("grouped_matmul", "triton", "tpu", priority=3)(_gmm_like)
    yield
    _registry.unregister("grouped_matmul", "triton", "tpu")


def test_enums_take_plain_strings():
    assert Platform("pallas") is Platform.PALLAS and Platform.XLA == "xla"
    assert _registry.as_backend(" GPU ") is Backend.GPU
    with pytest.raises(ValueError, match="backend='mps' is not one of: tpu, gpu, cpu, any"):
        _registry.as_backend("mps")
    with pytest.raises(TypeError, match="platform"):
        _registry.as_platform(3)


def test_registered_implementation_is_listed(fake_tpu_kernel):
    specs = kernelhub.implementations("grouped_matmul")
    fake = [s for s in specs if s.platform is Platform.TRITON and s.backend is Backend.TPU]
    assert len(fake) == 1 and fake[0].priority == 3 and fake[0].available


def test_same_key_twice_is_an_error(fake_tpu_kernel):
    with pytest.raises(ValueError, match="already has an implementation for platform=triton, backend=tpu"):
        kernelhub.register("grouped_matmul", Platform.TRITON, Backend.TPU)(_gmm_like)


def test_unknown_op_lists_known_ops():
    with pytest.raises(ValueError, match="known ops: .*grouped_matmul.*transposed_grouped_matmul"):
        kernelhub.implementations("grouped_matmull")
    with pytest.raises(ValueError, match="unknown op"):
        kernelhub.get("nope")


@pytest.mark.parametrize("bad,message", [
    (lambda lhs, rhs, sizes, preferred_element_type=None, tiling=None, group_offset=None,
     existing_out=None, transpose_rhs=False: None, "parameter 2 is 'sizes', expected 'group_sizes'"),
    (lambda lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=None,
     group_offset=None, existing_out=None, transpose_rhs=True: None, "'transpose_rhs' defaults to True"),
    (lambda lhs, rhs: None, "has 2 parameters"),
    (lambda lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=None,
     group_offset=None, existing_out=None, transpose_rhs=False, bias=None, activation=None,
     glu=None, glu_layout="concatenated", extra=None: None, "has 13 parameters"),
    (lambda lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=None,
     group_offset=None, existing_out=None, *, transpose_rhs=False: None, "keyword-only"),
])
def test_signature_must_match_the_contract(bad, message):
    with pytest.raises(TypeError, match=message):
        kernelhub.register("grouped_matmul", "triton", "tpu")(bad)
    assert not any(s.backend is Backend.TPU and s.platform is Platform.TRITON
                   for s in kernelhub.implementations("grouped_matmul"))


def test_every_registered_implementation_has_the_contract_signature():
    import inspect

    for op in kernelhub.op_names():
        contract = [p.name for p in _registry.op_definition(op).signature.parameters.values()]
        for spec in kernelhub.implementations(op):
            assert list(inspect.signature(spec.fn).parameters) == contract, spec
            assert not spec.omitted, spec


def test_an_implementation_written_before_the_epilogue_arguments_still_serves():
    """Registered with grouped_matmul's signature as it was before bias, activation, glu and
    glu_layout: it gets the calls that leave them at their defaults, and a call that uses one
    is refused by name (the feature it lacks), never run without it."""
    calls = []

    def old(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=None,
            group_offset=None, existing_out=None, transpose_rhs=False):
        calls.append(transpose_rhs)
        return jnp.zeros((lhs.shape[0], rhs.shape[2]), preferred_element_type)

    kernelhub.register("grouped_matmul", "triton", "tpu")(old)
    try:
        _check_old_signature_serves(calls)
    finally:
        _registry.unregister("grouped_matmul", "triton", "tpu")


def _check_old_signature_serves(calls):
    spec = next(s for s in kernelhub.implementations("grouped_matmul")
                if s.backend is Backend.TPU and s.platform is Platform.TRITON)
    assert [name for name, _ in spec.omitted] == ["bias", "activation", "glu", "glu_layout"]
    gmm = kernelhub.get("grouped_matmul", platform="triton", backend="tpu")
    lhs, rhs, sizes = jnp.ones((4, 3)), jnp.ones((2, 3, 2)), jnp.array([1, 3], jnp.int32)
    jax.jit(gmm).trace(lhs, rhs, sizes).lower(lowering_platforms=("tpu",))
    assert calls and not any(calls)  # called, without the arguments it lacks
    with pytest.raises(kernelhub.NoImplementationError, match="activation"):
        jax.jit(lambda *a: gmm(*a, activation="relu")).trace(lhs, rhs, sizes).lower(
            lowering_platforms=("tpu",))
    with pytest.raises(kernelhub.NoImplementationError, match="takes no 'glu'"):
        spec.arguments_for({"lhs": lhs, "glu": "silu"})
