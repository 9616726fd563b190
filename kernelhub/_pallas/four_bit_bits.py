"""The bits of 4-bit values (int4, float4_e2m1fn), as the Pallas kernels take them: a 4-bit code
per value (TPU's and Mosaic GPU's e2m1 operands) or two values to a byte (the Triton kernels'
operands); and e2m1 codes as the e4m3 values they equal, as the Triton kernels unpack them, or
as float16, as the Mosaic GPU kernels convert them (Hopper converts no e2m1 value itself).

On an accelerator these are bitcasts. XLA:CPU, which runs the kernels in interpret mode, gets
the same bits by arithmetic instead: its elemental fusion emitter (taken with
`--xla_cpu_use_fusion_emitters=false`, a common workaround flag and the test suite's choice for
compile time) emits an invalid LLVM bitcast ("bitcast i8 to i4") for a bitcast between 4-bit
types. `lax.platform_dependent` picks the form where XLA lowers the call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

_E2M1 = jnp.dtype(jnp.float4_e2m1fn)
# e4m3's exponent field for 0.5, e2m1's one subnormal (2**-1 at e4m3's bias of 7); e2m1's
# normal exponent fields 1, 2, 3 (bias 1) are e4m3's 7, 8, 9: this much higher.
_E4M3_FIELD_OF_HALF = 6


def e2m1_codes(values: jax.Array) -> jax.Array:
    """The 4-bit codes (sign in bit 3, two exponent bits, one mantissa bit) of float4_e2m1fn
    `values`, as uint8, computed from the values: each is an e4m3 exactly, whose fields give
    the code."""
    bits = lax.bitcast_convert_type(values.astype(jnp.float8_e4m3fn), jnp.uint8)
    sign = lax.shift_right_logical(bits, jnp.uint8(4)) & jnp.uint8(8)
    field = lax.shift_right_logical(bits, jnp.uint8(3)) & jnp.uint8(0xF)
    top_mantissa = lax.shift_right_logical(bits, jnp.uint8(2)) & jnp.uint8(1)
    normal = lax.shift_left(field - jnp.uint8(_E4M3_FIELD_OF_HALF), jnp.uint8(1)) | top_mantissa
    magnitude = jnp.where(field == jnp.uint8(0), jnp.uint8(0),
                          jnp.where(field == jnp.uint8(_E4M3_FIELD_OF_HALF), jnp.uint8(1), normal))
    return sign | magnitude


def e4m3_of_codes(codes: jax.Array) -> jax.Array:
    """The inverse of `e2m1_codes`: uint8 e2m1 codes as the float8_e4m3fn values they equal
    (the same sign, the exponent field moved up, the mantissa bit to e4m3's top one). Plain
    bit operations, so kernels may use it on their tiles."""
    sign = lax.shift_left(codes & jnp.uint8(8), jnp.uint8(4))
    field = lax.shift_right_logical(codes, jnp.uint8(1)) & jnp.uint8(3)
    mantissa = codes & jnp.uint8(1)
    normal = sign | lax.shift_left(field + jnp.uint8(_E4M3_FIELD_OF_HALF), jnp.uint8(3)) | (
        lax.shift_left(mantissa, jnp.uint8(2)))
    half = sign | (mantissa * jnp.uint8(_E4M3_FIELD_OF_HALF << 3))
    bits = jnp.where(field == jnp.uint8(0), half, normal)
    return lax.bitcast_convert_type(bits, jnp.float8_e4m3fn)


def stored_bits(dtype) -> int:
    """Bits an element of `dtype` takes where jax packs 4-bit values (in memory, VMEM and
    shared memory): 4 for int4, uint4 and float4_e2m1fn, whose numpy itemsize says a byte."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.iinfo(dtype).bits
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.finfo(dtype).bits
    return 8 * dtype.itemsize


# float16's exponent field for 0.5 (bias 15), shifted past its 10 mantissa bits minus one: e2m1's
# code for 1.0 (2) plus this, shifted left by 9, is 1.0's float16 bits, and every normal code
# after it follows (its exponent and mantissa bits line up with float16's top ones).
_FLOAT16_HALF_FIELD = 28
_FLOAT16_HALF = 0x3800


def float16_of_codes(codes: jax.Array) -> jax.Array:
    """e2m1 `codes` (any unsigned integer dtype, uint4 in the Mosaic GPU kernels' tiles) as the
    float16 values they equal, built as float16 bits in int32 arithmetic (Mosaic GPU has no
    pointwise 8-bit or 4-bit arithmetic and, on Hopper, no e2m1 conversion)."""
    code = codes.astype(jnp.int32)
    magnitude = code & 7
    bits = jnp.where(magnitude >= 2, lax.shift_left(magnitude + _FLOAT16_HALF_FIELD, 9),
                     jnp.where(magnitude == 1, _FLOAT16_HALF, 0))
    bits = bits | lax.shift_left(code & 8, 12)
    return lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.float16)


def _nibbles(values: jax.Array) -> jax.Array:
    """Each 4-bit value's bits in the low half of a uint8."""
    if jnp.dtype(values.dtype) == _E2M1:
        return e2m1_codes(values)
    return lax.bitcast_convert_type(values.astype(jnp.int8), jnp.uint8) & jnp.uint8(0xF)


def as_uint4(values: jax.Array) -> jax.Array:
    """float4_e2m1fn `values` reinterpreted as their uint4 codes."""
    return lax.platform_dependent(
        values,
        cpu=lambda v: _nibbles(v).astype(jnp.uint4),
        default=lambda v: lax.bitcast_convert_type(v, jnp.uint4))


def as_bytes(pairs: jax.Array) -> jax.Array:
    """4-bit `pairs` [..., 2] as the [...] uint8 bytes that hold them, the first of each pair
    in the low half (as `lax.bitcast_convert_type` packs them)."""
    def computed(v):
        nibbles = _nibbles(v)
        return nibbles[..., 0] | lax.shift_left(nibbles[..., 1], jnp.uint8(4))
    return lax.platform_dependent(
        pairs, cpu=computed, default=lambda v: lax.bitcast_convert_type(v, jnp.uint8))
