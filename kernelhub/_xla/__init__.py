"""Pure-XLA implementations: run on every backend, differentiable, the default on CPU.

Their raw kernels take QuantizedArrays as they are (kernelhub/_xla/_operands.py dequantizes a
chunk at a time), so no scales are folded around them.
"""

from __future__ import annotations

from kernelhub import ops  # noqa: F401  (declares the ops registered here)
from kernelhub._grouped_matmul.names import (
    ACTIVATION, BIAS, GLU, QUANTIZED, QUANTIZED_4BIT, QUANTIZED_BLOCKS, QUANTIZED_ODD_BLOCKS, SYMBOLIC_SHAPES)
from kernelhub._grouped_matmul.registration import register_grouped_matmuls
from kernelhub._xla.grouped_matmul import raw_grouped_matmul
from kernelhub._xla.transposed_grouped_matmul import raw_transposed_grouped_matmul
from kernelhub._xla.tuning_space import SPACE

grouped_matmul, transposed_grouped_matmul = register_grouped_matmuls(
    "xla", "any", raw_grouped_matmul, raw_transposed_grouped_matmul, SPACE,
    features=(QUANTIZED, QUANTIZED_4BIT, QUANTIZED_BLOCKS, QUANTIZED_ODD_BLOCKS, SYMBOLIC_SHAPES, BIAS, ACTIVATION,
              GLU),
    fold_scales=False)
