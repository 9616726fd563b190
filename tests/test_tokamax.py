"""tokamax's own ragged-dot tests of gradients and quantized operands (RaggedDotTestBase.test_vjp
and test_quantized, shipped in the tokamax wheel), run on kernelhub.grouped_matmul on every
implementation that runs here: bf16 forward and VJP against tokamax's float32 reference, and
int8 and int4 operands from qwix and from tokamax's AsQArray in every tiling it draws; each
with and without an activation, which kernelhub applies itself (its `activation=` epilogue).

The interpret-mode kernels (Pallas and Triton emulated on the CPU, about 2 s a case) take a
slice of the products: test_vjp's smaller problem with each activation; for test_quantized each
dtype with each activation, both operand kinds, every tiling of lhs and of rhs at least once.
The compiled implementations take 20 of test_quantized's 240 cases, in which every pair of
values of any two of its five parameters meets (each lhs tiling with each rhs tiling, each
tiling with each dtype, activation and operand kind; CI's time: the whole product took 158 s of
its 20 minutes; it passed whole on 2026-11-26), and test_vjp's 6 of 12 cases meeting every pair.
KERNELHUB_TEST_WHOLE_PRODUCTS=1 runs both whole.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import pytest

import kernelhub
from conftest import runnable_implementations
from slices import WHOLE_PRODUCTS, all_pairs_indices

test_base = pytest.importorskip("tokamax._src.ops.ragged_dot.test_base")
quantization = pytest.importorskip("tokamax._src.quantization")
parameterized = pytest.importorskip("absl.testing.parameterized")

GMM = "grouped_matmul"


def ragged_dot_on(gmm):
    """tokamax's ragged_dot signature on kernelhub's gmm `gmm` (mode 1: ragged rows)."""

    def ragged_dot(lhs, rhs, group_sizes, activation=None, preferred_element_type=None,
                   precision=None):
        del precision  # kernelhub accumulates in float32 always
        lhs, rhs = (x.as_qarray() if isinstance(x, quantization.AsQArray) else x
                    for x in (lhs, rhs))
        out_dtype = preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype)
        # The activation runs on the float32 sums inside kernelhub, before the one cast.
        out = gmm(lhs, rhs, group_sizes.astype(jnp.int32), activation=activation)
        return out.astype(out_dtype)

    return ragged_dot


# The interpret kernels' slice of test_quantized's product: each dtype with each activation,
# qwix's QArray and tokamax's AsQArray in turn, and so every lhs and rhs tiling in turn.
_A_TILES = (None, (1, 128), (1, 16), (256, 1), (16, 1))
_B_TILES = ((1, 1, 16), (1, 1, 128), (1, 256, 1), (1, 16, 1))
_ACTIVATIONS = (None, test_base.relu, jax.nn.tanh)
_DTYPES = ("int8", "int4")
INTERPRET_SLICE = [
    dict(dtype=dtype, a_tile_shape=_A_TILES[i % len(_A_TILES)],
         b_tile_shape=_B_TILES[i % len(_B_TILES)], use_as_qarray=bool(i % 2),
         activation=activation)
    for i, (dtype, activation) in enumerate(
        itertools.product(_DTYPES, _ACTIVATIONS))]


# test_quantized on the compiled implementations: every pair of values of any two of its five
# parameters meets (tests/slices.py, whose own tests check that property).
_QUANTIZED_AXES = dict(dtype=_DTYPES, a_tile_shape=_A_TILES, b_tile_shape=_B_TILES,
                       use_as_qarray=(False, True), activation=_ACTIVATIONS)
COMPILED_SLICE = [
    {name: values[i] for (name, values), i in zip(_QUANTIZED_AXES.items(), case)}
    for case in all_pairs_indices([len(values) for values in _QUANTIZED_AXES.values()])]


# test_vjp's product with m=128 only (it also draws m=1024: the same code at 8x the rows, for CI's
# time) on the compiled implementations, 6 of its 12 (k, n, activation) cases: every pair of
# any two of them (tests/slices.py); its smallest problem with each activation on the interpret
# kernels. KERNELHUB_TEST_WHOLE_PRODUCTS=1 runs the 12.
_VJP_AXES = dict(k=(128, 64), n=(256, 128), activation=_ACTIVATIONS)
VJP_CASES = [dict(num_groups=8, m=128, **{name: values[i] for (name, values), i
                                          in zip(_VJP_AXES.items(), case)})
             for case in all_pairs_indices([len(values) for values in _VJP_AXES.values()])]
VJP_SLICE = [dict(num_groups=8, m=128, k=64, n=128, activation=activation)
             for activation in _ACTIVATIONS]


def _test_class(spec: kernelhub.KernelSpec) -> type:
    gmm = kernelhub.get(GMM, platform=spec.platform)

    class Test(test_base.RaggedDotTestBase):
        def __init__(self, *args):
            super().__init__(*args, dot_fn=ragged_dot_on(gmm))

        @parameterized.parameters(*(VJP_SLICE if spec.interpret_only else VJP_CASES))
        def test_vjp(self, num_groups, m, k, n, activation):
            self._test_vjp(num_groups, m, k, n, activation)

        if not WHOLE_PRODUCTS or spec.interpret_only:
            @parameterized.parameters(*(INTERPRET_SLICE if spec.interpret_only
                                        else COMPILED_SLICE))
            def test_quantized(self, dtype, a_tile_shape, b_tile_shape, use_as_qarray,
                               activation):
                self._test_quantized(dtype, dtype, a_tile_shape, b_tile_shape, use_as_qarray,
                                     activation)

    # Only the gradient and quantized tests (the others exercise tokamax's own options:
    # checkify, configs), as parameterized above; test_quantized's whole product on the
    # compiled implementations with KERNELHUB_TEST_WHOLE_PRODUCTS=1.
    own = set(vars(Test))
    for name in set(dir(test_base.RaggedDotTestBase)) | own:
        kept = name in own or (WHOLE_PRODUCTS and not spec.interpret_only
                                and name.startswith("test_quantized"))
        if name.startswith("test") and not kept:
            setattr(Test, name, None)
    Test.__name__ = Test.__qualname__ = (
        f"Kernelhub{spec.platform.value.capitalize()}RaggedDotTest")
    return Test


# Every implementation here, Mosaic GPU's interpreter included (9 tests, about 25 s on two
# workers), whose int4 cases read 4-bit values since it takes them.
for _spec in runnable_implementations(GMM):
    _cls = _test_class(_spec)
    globals()[_cls.__name__] = _cls
del _spec, _cls

