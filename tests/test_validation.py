"""Bad input gets a TypeError or ValueError naming the argument, whichever implementation is forced.

The contract checks run before any kernel, so these cost little even for interpret-mode kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import call, implementation_params

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"

M, K, N, G = 12, 8, 6, 3
LHS = jnp.ones((M, K), jnp.float32)
RHS = jnp.ones((G, K, N), jnp.float32)
SIZES = jnp.array([4, 4, 4], jnp.int32)


def gmm_arguments(**changes):
    arguments = dict(lhs=LHS, rhs=RHS, group_sizes=SIZES)
    arguments.update(changes)
    return arguments


GMM_CASES = [
    ("lhs", TypeError, dict(lhs=LHS.astype(jnp.int32))),
    ("lhs", TypeError, dict(lhs=[[1.0] * K] * M)),
    ("lhs", TypeError, dict(lhs=jnp.ones((M, K, 1)))),
    ("rhs", TypeError, dict(rhs=jnp.ones((K, N)))),
    ("rhs", ValueError, dict(rhs=jnp.ones((G, K + 1, N)))),  # contraction size differs
    ("rhs", ValueError, dict(rhs=jnp.ones((G, N, K + 1)), transpose_rhs=True)),
    ("rhs", ValueError, dict(rhs=jnp.ones((G + 1, K, N)))),  # more local groups than groups
    ("group_sizes", TypeError, dict(group_sizes=SIZES.astype(jnp.float32))),
    ("group_sizes", TypeError, dict(group_sizes=SIZES.reshape(1, 3))),
    ("group_sizes", ValueError, dict(group_sizes=jnp.array([4, -1, 4], jnp.int32))),
    ("group_sizes", ValueError, dict(group_sizes=jnp.array([4, 9, 4], jnp.int32))),
    ("preferred_element_type", TypeError, dict(preferred_element_type=jnp.int32)),
    ("preferred_element_type", TypeError, dict(preferred_element_type="not a dtype")),
    ("tiling", ValueError, dict(tiling=(128, -8, 128))),
    ("tiling", ValueError, dict(tiling=(0, 128, 128))),
    ("tiling", ValueError, dict(tiling=(128, 128))),  # megablox's (rows, k, n), as every kernel reads it
    ("tiling", TypeError, dict(tiling="big")),
    ("group_offset", ValueError, dict(group_offset=1)),  # 1 + 3 local groups > 3 groups
    ("group_offset", ValueError, dict(group_offset=-1)),
    ("group_offset", TypeError, dict(group_offset=1.5)),
    ("group_offset", TypeError, dict(group_offset=True)),
    ("existing_out", ValueError, dict(existing_out=jnp.ones((M, N + 1)))),
    ("existing_out", TypeError, dict(existing_out=jnp.ones((M, N), jnp.bfloat16))),
    ("transpose_rhs", TypeError, dict(transpose_rhs="yes")),
]


@pytest.mark.parametrize("spec", implementation_params(GMM))
@pytest.mark.parametrize("argument,error,changes", GMM_CASES,
                         ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(GMM_CASES)])
def test_gmm_rejects(spec, argument, error, changes):
    with pytest.raises(error, match=argument) as raised:
        call(spec)(**gmm_arguments(**changes))
    _one_line_naming(raised.value, argument)


def _one_line_naming(error: Exception, argument: str) -> None:
    """The message is one line that starts with the argument (the type checker's own report,
    25-30 lines, stays attached as the cause)."""
    message = str(error)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(argument), message


TGMM_LHS = jnp.ones((K, M), jnp.float32)
TGMM_RHS = jnp.ones((M, N), jnp.float32)

TGMM_CASES = [
    ("lhs", TypeError, dict(lhs=TGMM_LHS.astype(jnp.int16))),
    ("rhs", ValueError, dict(rhs=jnp.ones((M + 1, N)))),  # m differs from lhs's
    ("group_sizes", ValueError, dict(group_sizes=jnp.array([8, 8, 0], jnp.int32))),
    ("num_actual_groups", ValueError, dict(num_actual_groups=0)),
    ("num_actual_groups", ValueError, dict(num_actual_groups=G + 1)),
    ("num_actual_groups", TypeError, dict(num_actual_groups=1.0)),
    ("group_offset", ValueError, dict(group_offset=2, num_actual_groups=2)),
    ("group_offset", ValueError, dict(group_offset=G)),
    ("existing_out", ValueError, dict(existing_out=jnp.ones((G, K, N + 1)))),  # n differs from rhs's
    ("existing_out", ValueError, dict(existing_out=jnp.ones((G - 1, K, N)))),
]


@pytest.mark.parametrize("spec", implementation_params(TGMM))
@pytest.mark.parametrize("argument,error,changes", TGMM_CASES,
                         ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(TGMM_CASES)])
def test_tgmm_rejects(spec, argument, error, changes):
    arguments = dict(lhs=TGMM_LHS, rhs=TGMM_RHS, group_sizes=SIZES)
    arguments.update(changes)
    with pytest.raises(error, match=argument) as raised:
        call(spec)(**arguments)
    _one_line_naming(raised.value, argument)


@pytest.mark.parametrize("spec", implementation_params(TGMM))
def test_tgmm_traced_offset_needs_num_actual_groups(spec):
    tgmm = call(spec)
    with pytest.raises(ValueError, match="num_actual_groups"):
        jax.jit(lambda offset: tgmm(TGMM_LHS, TGMM_RHS, SIZES, group_offset=offset))(1)


@pytest.mark.parametrize("spec", implementation_params(GMM))
def test_unknown_argument_is_a_type_error(spec):
    with pytest.raises(TypeError, match="^tilling: grouped_matmul has no such argument; did you mean tiling"):
        call(spec)(LHS, RHS, SIZES, tilling=(8, 8, 8))
    with pytest.raises(TypeError, match="group_sizes"):
        call(spec)(LHS, RHS)
    # megablox's and tokamax's keywords point at kernelhub's way
    with pytest.raises(TypeError, match="^interpret: .*platform='pallas'"):
        call(spec)(LHS, RHS, SIZES, interpret=True)
    with pytest.raises(TypeError, match="^implementation: .*kernelhub.get"):
        call(spec)(LHS, RHS, SIZES, implementation="triton")


@pytest.mark.parametrize("changes,message", [
    (dict(lhs=jnp.ones((2, M, K))), "^lhs must be a real array of shape \\[m, k\\] or a "
                                    "kernelhub.QuantizedArray or a qwix.QArray, got float32 "
                                    "array of shape "
                                    "\\(2, 12, 8\\); reshape it to \\[m, k\\]"),
    (dict(group_sizes=[4, 4, 4]), "^group_sizes must be an integer array .*got list .*jnp.asarray"),
    (dict(lhs=LHS.astype(jnp.int32)), "^lhs must have dtype .*got int32.*astype"),
    (dict(rhs=jnp.ones((K, N))), "^rhs must be .*it needs 3 axes"),
])
def test_type_mistakes_get_one_line_with_the_fix(changes, message):
    import kernelhub

    with pytest.raises(TypeError, match=message) as raised:
        kernelhub.grouped_matmul(**gmm_arguments(**changes))
    assert len(str(raised.value).splitlines()) == 1
    if raised.value.__cause__ is not None:  # an annotation's mismatch (a dtype is the contract's)
        assert "Type-check error" in str(raised.value.__cause__)  # the full report, for diggers


def test_numpy_inputs_and_integer_group_sizes_are_accepted():
    import kernelhub

    out = kernelhub.grouped_matmul(np.ones((M, K), np.float32), np.ones((G, K, N), np.float32),
                                   np.array([4, 4, 4], np.int64))
    np.testing.assert_array_equal(np.asarray(out), np.full((M, N), K, np.float32))
