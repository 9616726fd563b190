"""The one pallas_call both Triton kernels go through: a 1-D grid, whole-array refs, and
existing_out aliased to the output when given."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from kernelhub._core import jax_internals as internals
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

    if not interpret:
        _offsets_by_elements(operands, existing_out)
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


KERNEL_PREFIX = "kernelhub_"


def _offsets_by_elements(operands: Sequence[jax.Array], existing_out: jax.Array | None) -> None:
    """Makes the kernels' pointer offsets 64-bit for every array of 2**31 elements or more,
    whatever its dtype (Pallas alone widens them by bytes, so 8-bit arrays of 2**31 to 2**32
    elements would wrap). Raises rather than lower a kernel whose offsets could wrap."""
    try:
        internals.pallas_triton_offsets_by_elements(KERNEL_PREFIX)
    except RuntimeError as error:
        arrays = [*operands, *([] if existing_out is None else [existing_out])]
        if any(np.prod(a.shape, dtype=np.int64) >= internals.WIDE_OFFSET_ELEMENTS for a in arrays):
            raise NotImplementedError(
                "the Triton kernels cannot address an operand of 2**31 elements or more with "
                f"this jax ({error}); call with platform='xla'") from None
