"""The one pallas_call both Triton kernels go through: a 1-D grid, whole-array refs, and
existing_out aliased to the output when given."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from kernelhub._core.manual_axes import shape_dtype_like
from kernelhub._pallas.gpu.config import BlockConfig


def pallas_triton(kernel: Callable[..., None], operands: Sequence[jax.Array],
                  existing_out: jax.Array | None, out_shape: tuple[int, ...], out_dtype: np.dtype,
                  programs: int, blocks: BlockConfig, interpret: bool, name: str) -> jax.Array:
    """Runs `kernel(*operand_refs, [existing_ref,] out_ref)` once per program.

    No BlockSpecs: every program sees whole arrays and computes its own offsets, since which rows
    a program owns comes from a table on the device, not from its grid index alone. The output
    starts as existing_out when given (the kernel then writes only what it changes); otherwise
    it starts undefined and the kernel must write all of it.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    aliases = {}
    if existing_out is not None:
        aliases = {len(operands): 0}
        operands = (*operands, existing_out)
    return pl.pallas_call(
        kernel,
        out_shape=shape_dtype_like(out_shape, out_dtype, operands[-1]),
        grid=(programs,),
        input_output_aliases=aliases,
        compiler_params=plgpu.CompilerParams(num_warps=blocks.num_warps,
                                             num_stages=blocks.num_stages),
        interpret=interpret,
        name=name,
    )(*operands)
