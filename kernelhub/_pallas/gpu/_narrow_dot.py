"""int8 and fp8 tiles multiplied as stored, on Hopper's int8 and fp8 tensor cores.

Pallas lowers `lax.dot_general` to a Triton `tt.dot` without `maxNumImpreciseAcc` (so 0), and
Triton (3.6) gives an fp8 dot with a float32 result to wgmma only when that number is at least
32: it says after how many products the tensor core's own partial sum, narrower than float32,
must be added into a float32 accumulator. Without it the dot runs as f16 `mma.sync`. Triton's
Python frontend sets it; Pallas has no way to. Pallas also refuses operands of two dtypes
(e4m3 x e5m2), and leaves `total + dot` to Triton's combine pass, which does not fold a dot
carrying the attribute into `dot(a, b, total)`: the promoted partial sums would then go to a
separate zero accumulator and `total` take one more add per block.

So the kernels call `accumulate(total, left, right)`, one primitive for `total + left @ right`:

* inside a Pallas Triton kernel it lowers to one `tt.dot` accumulating into `total`, with
  maxNumImpreciseAcc set to the tile's contraction length for fp8, so that each block's
  tensor-core sum is added into the float32 total (`promotion_interval`; the rule is added to
  Pallas's table on first use, through kernelhub/_core/jax_internals.py);
* anywhere else (interpret mode on a CPU) it computes what the kernels' contract asks for,
  exactly: int8 products summed in int32, fp8 products (exact in float32) summed in float32.

int8 x int8 needs no attribute (Pallas's own dot already reaches wgmma `.s32.s8.s8`); it goes
through here for the in-place int32 accumulation across the contraction.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._core import jax_internals as internals
from kernelhub.quantization import QUANTIZED_DTYPES

_FP8 = tuple(dtype for dtype in QUANTIZED_DTYPES if jnp.issubdtype(dtype, jnp.floating))
_INT8 = jnp.dtype(jnp.int8)

# Triton's smallest contraction tile for 8-bit operands (its frontend's rule; Pallas's lowering
# does not check it).
MIN_CONTRACTION_BLOCK = 32


def accumulator_dtype(lhs_dtype, rhs_dtype) -> jnp.dtype | None:
    """What `accumulate` sums tiles of these dtypes in (int32 for int8 x int8, float32 for fp8
    x fp8 of either kind), or None when they are not multiplied as stored."""
    lhs_dtype, rhs_dtype = jnp.dtype(lhs_dtype), jnp.dtype(rhs_dtype)
    if lhs_dtype == rhs_dtype == _INT8:
        return jnp.dtype(jnp.int32)
    if lhs_dtype in _FP8 and rhs_dtype in _FP8:
        return jnp.dtype(jnp.float32)
    return None


def accumulate(total: jax.Array, left: jax.Array, right: jax.Array,
               trans_b: bool = False) -> jax.Array:
    """total + left @ right (right given as [n, k] with trans_b), int8 or fp8 tiles as stored."""
    expected = accumulator_dtype(left.dtype, right.dtype)
    if expected is None or total.dtype != expected:
        raise TypeError(f"no narrow dot for {left.dtype} x {right.dtype} into {total.dtype}")
    interval = promotion_interval(left.shape[1]) if expected == jnp.float32 else 0
    return _primitive().bind(total, left, right, trans_b=trans_b, imprecise_interval=interval)


def promotion_interval(contraction_block: int) -> int:
    """How many fp8 products the tensor core sums in its own accumulator (narrower than
    float32) before Triton adds that partial sum into the float32 total: one contraction block.

    Promoting inside a block would be finer (down to one 32-product wgmma instruction), but
    Triton then emits the adds between the block's wgmmas, reading registers of one in flight,
    and ptxas serializes every wgmma of the kernel (its remark C7514); after the block's last
    wgmma they cost one wait per block. Triton needs 32 to the block's length to promote."""
    return max(contraction_block, MIN_CONTRACTION_BLOCK)


def triton_lowering_missing() -> str | None:
    """None when Pallas's Triton backend can lower `accumulate` (registering it on first call),
    else why not (jax moved what this reaches into)."""
    return _register_triton_rule()


def _exact(total, left, right, *, trans_b: bool, imprecise_interval: int):
    del imprecise_interval  # how a tensor core approximates float32 sums; here they are float32
    dims = (((1,), (1 if trans_b else 0,)), ((), ()))
    if total.dtype == jnp.int32:
        product = lax.dot_general(left, right, dims, preferred_element_type=jnp.int32)
    else:
        product = lax.dot_general(left.astype(jnp.float32), right.astype(jnp.float32), dims,
                                  precision=lax.Precision.HIGHEST,
                                  preferred_element_type=jnp.float32)
    return total + product


def _abstract_eval(total, left, right, *, trans_b: bool, imprecise_interval: int):
    del imprecise_interval
    rows, depth = left.shape
    columns = right.shape[0] if trans_b else right.shape[1]
    if (right.shape[1] if trans_b else right.shape[0]) != depth or total.shape != (rows, columns):
        raise TypeError(f"narrow dot: {total.shape} + {left.shape} @ {right.shape}"
                        f"{'^T' if trans_b else ''} do not fit")
    return total


@functools.cache
def _primitive():
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    primitive = Primitive("kernelhub_narrow_dot")
    primitive.def_impl(_exact)
    primitive.def_abstract_eval(_abstract_eval)
    mlir.register_lowering(primitive, mlir.lower_fun(_exact, multiple_results=False))
    return primitive


def _triton_rule(ctx, total, left, right, *, trans_b: bool, imprecise_interval: int):
    """One tt.dot accumulating into `total`: Triton then keeps the accumulator in the wgmma
    registers across the contraction loop, promoting fp8 partial sums every interval."""
    del ctx
    tt = internals.triton_dialect()
    if trans_b:
        right = tt.trans(right, (1, 0))
    return tt.dot(left, right, total, max_num_imprecise_acc=imprecise_interval or None)


@functools.cache
def _register_triton_rule() -> str | None:
    try:
        internals.triton_dialect()
        internals.register_pallas_triton_rule(_primitive(), _triton_rule)
    except RuntimeError as error:
        return str(error)
    return None
