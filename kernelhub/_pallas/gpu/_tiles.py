"""Small in-kernel helpers shared by the Triton grouped matmuls: masks, integer division, loads.

Everything here runs while a kernel body is traced; all integers involved are non-negative, so
plain `lax.div`/`lax.rem` (one Triton instruction each) replace Python's floor division.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub.quantization import EXACT_IN_BFLOAT16


def div(a: jax.Array, b: int) -> jax.Array:
    return lax.div(a, jnp.asarray(b, a.dtype))


def rem(a: jax.Array, b: int) -> jax.Array:
    return lax.rem(a, jnp.asarray(b, a.dtype))


def span(first: jax.Array, size: int) -> jax.Array:
    """The indices first .. first + size - 1."""
    return first + jnp.arange(size, dtype=jnp.int32)


def within(index: jax.Array, limit: int, block: int) -> jax.Array | None:
    """index < limit, or None when the block size divides the limit (then no index is past it,
    and leaving the mask out lets Triton vectorise the access)."""
    return None if limit % block == 0 else index < limit


def masked_load(ref, rows: jax.Array | None, cols: jax.Array | None) -> jax.Array:
    """Loads a 2-D block, reading 0 wherever rows[:, None] & cols[None, :] is False.

    Masked-off elements are never read (on the GPU) and become exact zeros, so neither garbage
    past the array nor a NaN in another group's rows can enter the product.
    """
    from jax.experimental.pallas import triton as plgpu

    mask = full_mask(ref.shape, rows, cols)
    if mask is None:
        return plgpu.load(ref)
    return plgpu.load(ref, mask=mask, other=jnp.zeros((), ref.dtype))


def compute_dtype(lhs_dtype, rhs_dtype) -> jnp.dtype:
    """The dtype the tiles are multiplied in: int8 and fp8 tiles count as the bf16 they widen
    to exactly (so int8 or fp8 with bf16 runs on bf16 tensor cores), then the promotion.

    fp8 x fp8 stays on bf16 tensor cores too: as lowered through Pallas, Triton 3.6 compiles an
    fp8 tl.dot for sm_90 to f16 mma.sync (no wgmma), slower than bf16's wgmma.
    """
    lhs_dtype, rhs_dtype = (jnp.dtype(jnp.bfloat16) if jnp.dtype(d) in EXACT_IN_BFLOAT16
                            else jnp.dtype(d) for d in (lhs_dtype, rhs_dtype))
    return jnp.dtype(jnp.promote_types(lhs_dtype, rhs_dtype))


def dot(left: jax.Array, right: jax.Array, trans_b: bool = False) -> jax.Array:
    """left @ right (right transposed with trans_b), accumulated in float32; tl.dot on a GPU.

    Float32 operands use TF32 on the GPU, as XLA's own dots do by default.
    """
    from jax.experimental.pallas import triton as plgpu

    return plgpu.dot(left, right, trans_b=trans_b)


def masked_store(ref, value: jax.Array, rows: jax.Array | None, cols: jax.Array | None) -> None:
    """Stores a 2-D block where rows[:, None] & cols[None, :]; other elements keep their value."""
    from jax.experimental.pallas import triton as plgpu

    mask = full_mask(ref.shape, rows, cols)
    plgpu.store(ref, value, mask=mask)


def full_mask(shape: tuple[int, int], rows: jax.Array | None,
              cols: jax.Array | None) -> jax.Array | None:
    """rows[:, None] & cols[None, :] broadcast to `shape`; None parts count as all-true."""
    if rows is None and cols is None:
        return None
    if rows is None:
        return jnp.broadcast_to(cols[None, :], shape)
    if cols is None:
        return jnp.broadcast_to(rows[:, None], shape)
    return rows[:, None] & cols[None, :]
