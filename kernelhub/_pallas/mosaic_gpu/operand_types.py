"""The types a Mosaic GPU kernel multiplies its tiles in.

Both operands are multiplied in one type: their own where wgmma takes it (bf16, f16, float32,
fp8 of one kind), int8 where two int8 operands' int32 sums cannot wrap, else the narrowest
float holding both (`kernel_dtype`). An 8-bit or 4-bit operand beside another type can
instead be read as stored and converted per step in shared memory (the tiling's `upcast`,
`converted_dtype`). 4-bit operands count as 8-bit here (numpy gives int4 and float4_e2m1fn an
itemsize of 1): every rule for 8-bit tiles holds for them, each converted to a wider type
before any wgmma (none takes 4-bit values on Hopper); float4_e2m1fn ones are read as their
uint4 codes (`read_as`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernelhub import quantization
from kernelhub._core.shapes import is_static
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._pallas import four_bit_bits

# Types whose wgmma reads the B operand K-major only.
K_MAJOR_ONLY = ("float32", "float8_e4m3fn", "float8_e5m2", "int8")
# What 8-bit tiles are converted to for 16-bit wgmma (`upcast`): Hopper converts fp8 to
# float16 in one instruction (to bfloat16 only through float32), and float16 holds every e4m3,
# e5m2 and int8 value exactly.
UPCAST_DTYPE = np.dtype(np.float16)


# What float4_e2m1fn tiles are read as: Hopper converts no e2m1 value (Mosaic GPU does so on
# Blackwell only), so the kernels read the codes (a bitcast) and kernel_parts.widened builds
# their float16 bits.
E2M1_CODES = np.dtype(jnp.uint4)


def read_as(array: jax.Array) -> jax.Array:
    """An operand as a kernel whose tiles are converted in shared memory reads it: e2m1 values
    as their uint4 codes (`E2M1_CODES`), any other as it is."""
    if np.dtype(array.dtype) == np.dtype(jnp.float4_e2m1fn):
        return four_bit_bits.as_uint4(array)
    return array


def tgmm_tiles(k_major_only: bool, block_m: int, block_k: int,
               block_n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The shapes of tgmm's lhs and rhs tiles as its kernel reads them from lhs [m, k] and rhs
    [m, n] (tgmm_chunks.ChunkLayout): as stored, [block_m, block_k] and [block_m, block_n],
    where wgmma takes the multiplied type either way; [block_k, block_m] and [block_n, block_m],
    the summed rows along the minor axis, where wgmma reads that type K-major only."""
    if k_major_only:
        return (block_k, block_m), (block_n, block_m)
    return (block_m, block_k), (block_m, block_n)


def converted_dtype(lhs_dtype: Any, rhs_dtype: Any) -> np.dtype | None:
    """What `upcast` converts a call's 8-bit tiles to: float16 beside another 8-bit operand,
    else the other operand's type (float16, bfloat16 and float32 hold every int8, e4m3 and
    e5m2 value exactly); None without an 8-bit operand."""
    lhs, rhs = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
    widths = {lhs.itemsize, rhs.itemsize}
    if 1 not in widths:
        return None
    return UPCAST_DTYPE if widths == {1} else (lhs if lhs.itemsize != 1 else rhs)


def multiplied_dtype(upcast: bool | None, lhs_dtype: Any, rhs_dtype: Any) -> np.dtype:
    """What a gmm body's wgmma multiplies, its refs holding `lhs_dtype` and `rhs_dtype`: with
    the tiling's `upcast` `converted_dtype`, else theirs (the caller cast both to
    kernel_dtype)."""
    return converted_dtype(lhs_dtype, rhs_dtype) if upcast else np.dtype(lhs_dtype)


def upcast_applies(problem: Problem) -> bool:
    """Whether the tiling's `upcast` entry chooses anything: an 8-bit operand beside a 16-bit
    one or one of another 8-bit kind (no 8-bit wgmma takes the pair), or, in gmm, two of one
    kind with weights [G, k, n] (8-bit wgmma reads those only after a K-major copy). Beside a
    float32 operand (a quantized call's gradients meet the float32 cotangent the kit folds the
    scales into) the converted tiles go to float32 wgmma, which reads both K-major: every such
    tile lies so but 8-bit weights [G, k, n], which would need a transpose as well."""
    converted = converted_dtype(problem.lhs_dtype, problem.rhs_dtype)
    if converted is None:
        return False
    if converted.name in K_MAJOR_ONLY:
        return not (problem.kernel is Kernel.GMM and np.dtype(problem.rhs_dtype).itemsize == 1)
    return operand_bytes(problem) != 1 or problem.kernel is Kernel.GMM


def operand_bytes(problem: Problem) -> int:
    """Bytes per element of the tiles the kernel multiplies (kernel_dtype's choice)."""
    return np.dtype(problem_dtype(problem)).itemsize


def problem_dtype(problem: Problem) -> np.dtype:
    """kernel_dtype for `problem`'s operands and contraction (gmm's k, tgmm's summed rows)."""
    contraction = problem.m if problem.kernel is Kernel.TGMM else problem.k
    return kernel_dtype(problem.lhs_dtype, problem.rhs_dtype, contraction)


# The operand types wgmma multiplies as stored, both operands of one type.
_WGMMA_TYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")


def kernel_dtype(lhs_dtype: Any, rhs_dtype: Any, contraction: Any) -> np.dtype:
    """The one dtype both tiles are multiplied in: their own when they share a wgmma type, or
    int8 for two int8 operands whose int32 sums cannot wrap (`contraction` terms, the summed
    axis, at most quantization.MAX_EXACT_INT32_TERMS); else the narrowest float that holds
    both exactly (bfloat16 for 8-bit values, float32 beside a float32 operand or for float16
    with bfloat16)."""
    lhs, rhs = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
    if lhs == rhs and lhs.name in _WGMMA_TYPES:
        return lhs
    if lhs == rhs == np.dtype(np.int8) and is_static(contraction) and (
            contraction <= quantization.MAX_EXACT_INT32_TERMS):
        return lhs
    if "float32" in (lhs.name, rhs.name) or {lhs.name, rhs.name} == {"float16", "bfloat16"}:
        return np.dtype(np.float32)
    if "float16" in (lhs.name, rhs.name):
        return np.dtype(np.float16)
    return np.dtype("bfloat16")


def accumulator_dtype(multiplied: Any) -> np.dtype:
    """What wgmma sums tiles of the `multiplied` dtype in: int32 for int8 (exact, kernel_dtype
    bounds the terms), else float32. The kernels read it as float32 before the epilogue."""
    return np.dtype(np.int32 if np.dtype(multiplied) == np.dtype(np.int8) else np.float32)
