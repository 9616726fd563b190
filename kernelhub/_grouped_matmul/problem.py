"""The problem one kernel call solves: the one description that heuristics, tuning keys and
tuning spaces of every backend share.

A differentiated grouped matmul runs three kernels (kernelhub/_grouped_matmul/tilings.py says
which pass runs which): `Kernel` names them, `Problem` gives one call's sizes and dtypes.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any

import numpy as np

from kernelhub._core.shapes import is_static

from kernelhub._core.errors import ShapeError
from kernelhub.quantization import QuantizedArray


class Kernel(enum.StrEnum):
    """The kernels a grouped matmul and its gradients run (their names in tuning tables)."""

    GMM = "gmm"  # grouped_matmul, rhs [G, k, n]
    GMM_TRANSPOSED_RHS = "gmm_t"  # grouped_matmul with rhs [G, n, k]: gmm's lhs gradient
    TGMM = "tgmm"  # transposed_grouped_matmul: gmm's weight gradient


@dataclasses.dataclass(frozen=True, order=True)
class Problem:
    """The exact problem of one kernel call.

    `m` is the grouped axis (gmm's rows, tgmm's summed rows), `k` the other contraction or
    input axis, `n` the output's columns. Dtypes are names ("bfloat16"); a quantized operand's
    is its stored values' ("int8"). `lhs_blocks` and `rhs_blocks` name a quantized operand's
    scale blocks (kernelhub/quantization.py) where it has several along its axis: that axis
    by the letter above (g for the experts' axis) and the block's length, "k128" for blocks of
    128 along the contraction; "" for a float operand or one scale per row or column. A kernel
    steps through blocks, or widens the operand first, so a time taken with blocks is not the
    time without them, nor with others.
    """

    kernel: Kernel
    m: int
    k: int
    n: int
    num_groups: int
    local_groups: int
    lhs_dtype: str
    rhs_dtype: str
    out_dtype: str
    has_existing: bool
    lhs_blocks: str = ""
    rhs_blocks: str = ""

    def __post_init__(self):
        object.__setattr__(self, "kernel", Kernel(self.kernel))
        for name in ("lhs_dtype", "rhs_dtype", "out_dtype"):
            object.__setattr__(self, name, np.dtype(getattr(self, name)).name)
        for name in ("lhs_blocks", "rhs_blocks"):
            if not _BLOCKS.fullmatch(getattr(self, name)):
                raise ValueError(f"{name} must be \"\" or an axis (g, m, k or n) and a block "
                                 f"length, as \"k128\"; got {getattr(self, name)!r}")

    @property
    def static(self) -> bool:
        """Whether m, k and n are numbers: under shape-polymorphic export (jax.export with
        symbolic shapes) m (and on the XLA loops k and n) may be a symbolic dimension, which
        no tuning key can bucket: its tiling is the heuristic's (kernelhub/_grouped_matmul/
        tables.py)."""
        return all(is_static(size) for size in (self.m, self.k, self.n))

    @property
    def input_bytes(self) -> int:
        """The widest operand's bytes per element."""
        return max(np.dtype(self.lhs_dtype).itemsize, np.dtype(self.rhs_dtype).itemsize)

    @property
    def output_bytes(self) -> int:
        return np.dtype(self.out_dtype).itemsize


_BLOCKS = re.compile(r"([gmkn][1-9][0-9]*)?")


def require_static(size: Any, what: str) -> None:
    """Raises a ShapeError (a TypeError, as lax's, and a ValueError) when `size`, the length of
    what `what` names, is a symbolic dimension: the group counts, which every kernel loops over
    or fills an output axis with, and whatever else a kernel cannot take symbolic."""
    if not is_static(size):
        raise ShapeError(
            f"{what} must be static in exported functions (jax.export with symbolic shapes), "
            f"got the symbolic dimension {size}")


def require_static_groups(num_groups: Any, local_groups: Any, local_what: str) -> None:
    """The group counts as require_static checks them: the kernels loop over the local groups
    and the output of transposed_grouped_matmul has one entry per group."""
    require_static(num_groups, "the group count (group_sizes' last dimension)")
    require_static(local_groups, local_what)


def dtype_name(operand: Any) -> str:
    """An operand's stored dtype: a quantized operand's values' dtype."""
    values = operand.values if isinstance(operand, QuantizedArray) else operand
    return np.dtype(values.dtype).name


def scale_blocks(operand: Any, axes: str) -> str:
    """Problem's `lhs_blocks`/`rhs_blocks` of `operand`, whose axes `axes` names in order."""
    if not isinstance(operand, QuantizedArray) or operand.num_blocks == 1:
        return ""
    return f"{axes[operand.axis % operand.ndim]}{operand.block_size}"


def gmm_problem(lhs: Any, rhs: Any, group_sizes: Any, out_dtype: Any, has_existing: bool,
                transpose_rhs: bool) -> Problem:
    """The problem of grouped_matmul(lhs [m, k], rhs [G_local, k, n] or [G_local, n, k])."""
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    kernel = Kernel.GMM_TRANSPOSED_RHS if transpose_rhs else Kernel.GMM
    return Problem(kernel, m, k, n, group_sizes.shape[0], rhs.shape[0], dtype_name(lhs),
                   dtype_name(rhs), out_dtype, has_existing, scale_blocks(lhs, "mk"),
                   scale_blocks(rhs, "gnk" if transpose_rhs else "gkn"))


def tgmm_problem(lhs: Any, rhs: Any, group_sizes: Any, out_dtype: Any, has_existing: bool,
                 actual_groups: int) -> Problem:
    """The problem of transposed_grouped_matmul(lhs [k, m], rhs [m, n]) for `actual_groups`."""
    k, m = lhs.shape
    return Problem(Kernel.TGMM, m, k, rhs.shape[1], group_sizes.shape[0], actual_groups,
                   dtype_name(lhs), dtype_name(rhs), out_dtype, has_existing,
                   scale_blocks(lhs, "km"), scale_blocks(rhs, "mn"))
