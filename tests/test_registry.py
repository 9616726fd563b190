"""The registry: registration rules, signature checks, listing."""

from __future__ import annotations

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
    (lambda lhs, rhs, group_sizes: None, "has 3 parameters"),
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
