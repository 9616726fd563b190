"""Pure-XLA implementations: run on every backend, differentiable, the default on CPU."""

from __future__ import annotations

import jax

from kernelhub._registry import register
from kernelhub._xla.grouped_matmul import raw_grouped_matmul
from kernelhub._xla.transposed_grouped_matmul import raw_transposed_grouped_matmul
from kernelhub._xla.tuning_space import SPACE
from kernelhub.ops import GROUPED_MATMUL, TRANSPOSED_GROUPED_MATMUL
from kernelhub.ops._autodiff import differentiable
from kernelhub.ops._checks import QUANTIZED, QUANTIZED_BLOCKS, QUANTIZED_ODD_BLOCKS

_differentiable = differentiable(raw_grouped_matmul, raw_transposed_grouped_matmul, SPACE)
_FEATURES = (QUANTIZED, QUANTIZED_BLOCKS, QUANTIZED_ODD_BLOCKS)

grouped_matmul = register(GROUPED_MATMUL, "xla", "any", features=_FEATURES)(
    jax.jit(_differentiable.grouped_matmul,
            static_argnames=("preferred_element_type", "tiling", "transpose_rhs"))
)
transposed_grouped_matmul = register(TRANSPOSED_GROUPED_MATMUL, "xla", "any",
                                     features=_FEATURES)(
    jax.jit(_differentiable.transposed_grouped_matmul,
            static_argnames=("preferred_element_type", "tiling", "num_actual_groups"))
)
