"""tokamax's own quantized ragged-dot test (RaggedDotTestBase.test_quantized, shipped in the
tokamax wheel), run on kernelhub.grouped_matmul: int8 and int4 operands from qwix, and from
tokamax's AsQArray, in every tiling it draws, with and without an activation.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import kernelhub

test_base = pytest.importorskip("tokamax._src.ops.ragged_dot.test_base")
quantization = pytest.importorskip("tokamax._src.quantization")


def kernelhub_ragged_dot(lhs, rhs, group_sizes, activation=None, preferred_element_type=None,
                         precision=None):
    """tokamax's ragged_dot signature on kernelhub's gmm (mode 1: ragged rows)."""
    del precision  # kernelhub accumulates in float32 always
    lhs, rhs = (x.as_qarray() if isinstance(x, quantization.AsQArray) else x for x in (lhs, rhs))
    out_dtype = preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype)
    out = kernelhub.grouped_matmul(lhs, rhs, group_sizes.astype(jnp.int32))
    if activation is not None:
        out = activation(out)
    return out.astype(out_dtype)


class KernelhubQuantizedRaggedDotTest(test_base.RaggedDotTestBase):
    def __init__(self, *args):
        super().__init__(*args, dot_fn=kernelhub_ragged_dot)


# Only the quantized test: the others exercise tokamax's own options (checkify, configs).
for _name in list(vars(test_base.RaggedDotTestBase)) + list(vars(KernelhubQuantizedRaggedDotTest)):
    if _name.startswith("test") and not _name.startswith("test_quantized"):
        setattr(KernelhubQuantizedRaggedDotTest, _name, None)
