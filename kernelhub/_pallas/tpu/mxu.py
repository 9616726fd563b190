"""What the MXU multiplies a pair of tiles in, and at what rate: per chip for the compiled
kernels (kernel_parts.call_options), and for the tiling's cost model (tiling.estimated_seconds),
so that both read the same choice."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from kernelhub._pallas.tpu.hardware import Chip
from kernelhub.quantization import EXACT_IN_BFLOAT16

INT4, INT8 = jnp.dtype(jnp.int4), jnp.dtype(jnp.int8)
INTEGER = (INT8, INT4)
FP8 = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))


def compute_dtype(lhs_dtype: Any, rhs_dtype: Any, int8_mxu: bool = False,
                  int4_mxu: bool = False, fp8_mxu: bool = False) -> Any:
    """The MXU takes bf16 x bf16 as is, int4 x int4 where it has int4 (v5e, v5p, v6e), and
    int8 x int8 where it has int8 (the same three), int4 tiles beside int8 ones widened to int8
    (int32 sums in both), and fp8 x fp8 of one kind where its fp8 rate passes bf16's (v7x;
    float32 sums of exact products, as widened); other int8, fp8 or 4-bit tiles are widened
    to bf16 exactly; any other pair is multiplied in float32."""
    lhs_dtype, rhs_dtype = jnp.dtype(lhs_dtype), jnp.dtype(rhs_dtype)
    if fp8_mxu and lhs_dtype == rhs_dtype and lhs_dtype in FP8:
        return lhs_dtype
    if int4_mxu and lhs_dtype == rhs_dtype == INT4:
        return jnp.int4
    if int8_mxu and lhs_dtype in INTEGER and rhs_dtype in INTEGER:
        return jnp.int8
    if lhs_dtype in EXACT_IN_BFLOAT16 and rhs_dtype in EXACT_IN_BFLOAT16:
        return jnp.bfloat16
    return jnp.float32


def units(chip: Chip) -> dict[str, bool]:
    """compute_dtype's flags for `chip`: its int8 and int4 units where it has them, its fp8
    unit only where it is faster than widening to bf16 (v7x, twice; v5p and v6e multiply fp8
    at their bf16 rate)."""
    return dict(int8_mxu=chip.int8_flops > 0, int4_mxu=chip.int4_flops > 0,
                fp8_mxu=chip.fp8_flops > chip.bf16_flops)


def products_per_second(lhs_dtype: Any, rhs_dtype: Any, chip: Chip) -> float:
    """The rate at which `chip` multiplies tiles of these dtypes (compute_dtype's choice):
    float32 products, at HIGHEST precision, are counted at a quarter of bf16's."""
    compute = jnp.dtype(compute_dtype(lhs_dtype, rhs_dtype, **units(chip)))
    rates = {INT4: chip.int4_flops, INT8: chip.int8_flops, jnp.dtype(jnp.bfloat16): chip.bf16_flops,
             **dict.fromkeys(FP8, chip.fp8_flops)}
    return rates.get(compute, chip.bf16_flops / 4)
