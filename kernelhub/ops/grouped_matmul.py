"""The contract of `grouped_matmul` (gmm): one signature, its meaning, and its checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Integer, Real

from kernelhub._core.define import define_op
from kernelhub._core.errors import ShapeError
from kernelhub._grouped_matmul import names
from kernelhub._grouped_matmul.measured import measured_seconds
from kernelhub._grouped_matmul.tables import active as active_tuning
from kernelhub.ops import _checks
from kernelhub.ops._group_values import value_hooks
from kernelhub._qwix import QwixQArray
from kernelhub.quantization import QuantizedArray

NAME = names.GROUPED_MATMUL
# The checkpoint name of the pre-activation a differentiated call with a nonlinear epilogue
# keeps for its backward pass (the docstring's Gradients).
PRE_ACTIVATION = names.PRE_ACTIVATION

ArrayIn = jax.Array | np.ndarray


def _prepare(arguments: dict[str, Any]) -> dict[str, Any]:
    transpose_rhs = _checks.flag("transpose_rhs", arguments["transpose_rhs"])
    lhs = _checks.operand("lhs", arguments["lhs"], 2, "[m, k]", 1)
    rhs_layout = "[local_groups, n, k]" if transpose_rhs else "[local_groups, k, n]"
    rhs = _checks.operand("rhs", arguments["rhs"], 3, rhs_layout, 2 if transpose_rhs else 1)
    m, k = lhs.shape
    local_groups = rhs.shape[0]
    rhs_k, n = (rhs.shape[2], rhs.shape[1]) if transpose_rhs else (rhs.shape[1], rhs.shape[2])
    if rhs_k != k:
        raise ShapeError(
            f"rhs must contract over lhs's k={k}: rhs has shape {rhs.shape} ({rhs_layout}, "
            f"transpose_rhs={transpose_rhs})"
        )
    if local_groups == 0:
        raise ShapeError(f"rhs must hold at least one group, got shape {rhs.shape}")
    group_sizes = _checks.group_sizes(arguments["group_sizes"])
    num_groups = group_sizes.shape[0]
    if local_groups > num_groups:
        raise ShapeError(
            f"rhs has {local_groups} groups but group_sizes only {num_groups}: rhs must hold at "
            f"most num_groups groups"
        )
    out_dtype = _checks.element_type(arguments["preferred_element_type"], lhs, rhs)
    epilogue, bias = _checks.epilogue(arguments, local_groups, n, out_dtype)
    n = epilogue.output_columns(n)
    return dict(
        lhs=lhs,
        rhs=rhs,
        group_sizes=group_sizes,
        preferred_element_type=out_dtype,
        tiling=_checks.tiling(arguments["tiling"]),
        group_offset=_checks.group_offset(arguments["group_offset"]),
        existing_out=_checks.existing_out(arguments["existing_out"], (m, n), out_dtype),
        transpose_rhs=transpose_rhs,
        bias=bias,
        activation=epilogue.activation,
        glu=epilogue.glu,
        glu_layout=epilogue.glu_layout,
    )


# lhs [m, k] holds the rows; rhs [local_groups, ...] the local groups.
_check_values, _runtime_check = value_hooks(
    NAME, lambda arguments: arguments["lhs"].shape[0], lambda arguments: arguments["rhs"].shape[0])


@define_op(validate=_prepare, runtime_check=_runtime_check, features=_checks.features,
           check_values=_check_values, validate_reads_values=False, context=active_tuning,
           measured=measured_seconds)
def grouped_matmul(
    lhs: Real[ArrayIn, "m k"] | QuantizedArray | QwixQArray,
    rhs: Real[ArrayIn, "local_groups _ _"] | QuantizedArray | QwixQArray,
    group_sizes: Integer[ArrayIn, "num_groups"],
    preferred_element_type: Any = jnp.float32,
    tiling: _checks.Tiling = None,
    group_offset: int | Integer[ArrayIn, ""] | None = None,
    existing_out: Real[ArrayIn, "m _"] | None = None,
    transpose_rhs: bool = False,
    bias: Real[ArrayIn, "local_groups n_rhs"] | None = None,
    activation: str | Callable[[jax.Array], jax.Array] | None = None,
    glu: str | None = None,
    glu_layout: str = "concatenated",
) -> Real[jax.Array, "m n"]:
    """Multiplies each row group of `lhs` by its own matrix: the MoE expert matmul.

    Args:
      lhs: [m, k] rows sorted by group. Group g owns rows
        [sum(group_sizes[:g]), sum(group_sizes[:g + 1])). float32, bfloat16 or float16; raw
        int8 (narrower integers such as int4 are widened to it), float8_e4m3fn or float8_e5m2
        values, multiplied as they are (no scales); or a QuantizedArray quantized along k
        (kernelhub.quantize(x, dtype, axis=1, block_size=...)).
      rhs: [local_groups, k, n], or [local_groups, n, k] with `transpose_rhs`. rhs[j] belongs to
        group `group_offset + j`. Any dtype lhs may have, or a QuantizedArray quantized along k
        (axis 1, or 2 with `transpose_rhs`).
      group_sizes: [num_groups] integers >= 0 with sum <= m (rows past the sum belong to no
        group). num_groups >= local_groups.
      preferred_element_type: dtype of the output: float32, bfloat16 or float16, or int32 when
        both operands are integer arrays. Products of two integer arrays are summed exactly in
        int32 (wrapping past 2**31, as lax's); every other pair in float32; cast once.
      tiling: implementation-specific block sizes: a tuple, a callable (m, k, n) -> tuple or None,
        or None (the tuning table in force, else the implementation's heuristic); or one of
        these per pass, as kernelhub.Tilings(forward=..., lhs_gradient=..., rhs_gradient=...)
        or a dict with those keys (kernelhub/_grouped_matmul/tilings.py). Never affects the result.
        With `glu`, the column tile counts rhs columns (gate and up together): the output tile
        is half of it.
      group_offset: first local group (an int or int32 scalar, may be traced, e.g. inside
        shard_map); 0 when None. Requires group_offset + local_groups <= num_groups.
      existing_out: [m, n] of preferred_element_type. Rows that no local group computes are
        copied from it instead of set to 0.
      transpose_rhs: rhs is laid out [local_groups, n, k] and used transposed.
      bias: [local_groups, n_rhs] float32, bfloat16 or float16, n_rhs being rhs's columns (2n
        with `glu`): bias[j] is added to the float32 sums of local group group_offset + j,
        before any activation.
      activation: applied to the float32 sums (bias added) before the cast: "relu", "silu",
        "gelu" (erf), "gelu_tanh", "tanh", "sigmoid", "identity", or any elementwise,
        differentiable callable of a float32 array (as tokamax's `activation=`).
      glu: a gated unit: rhs has n_rhs = 2n columns holding a gate half and an up half, and the
        output n columns, act(gate) * up in float32. "silu" (SwiGLU), "gelu", "gelu_tanh"
        (GeGLU), or "swiglu_oai" (GPT-OSS's: gate = min(gate, 7), up = clip(up, -7, 7),
        (up + 1) * gate * sigmoid(1.702 * gate)). Not together with `activation`.
      glu_layout: where the halves lie in rhs's (and bias's) columns: "concatenated" (gate =
        [:n], up = [n:]) or "interleaved" (gate = [0::2], up = [1::2], as GPT-OSS checkpoints).

    Returns:
      [m, n] of preferred_element_type (n = n_rhs / 2 with `glu`, else n_rhs). A row of local
      group g = group_offset + j is epilogue(lhs[row] @ rhs[j] (or rhs[j].T) + bias[j]), the
      epilogue being the activation, the gated unit, or nothing; all in float32, cast once. A quantized operand counts as its dequantized float32
      values (QuantizedArray.dequantize()); the product is accumulated in float32 and cast
      once (docs/quantization.md). Every other row (other groups' rows, rows past
      sum(group_sizes)) is exactly 0, or exactly existing_out's row. A NaN or Inf in lhs reaches
      only the output rows it belongs to.

    Gradients: exact VJPs for lhs, rhs, bias and existing_out (a group without rows gets a bias
    gradient of exactly 0; a callable activation is differentiated by jax.vjp). A QuantizedArray made by
    kernelhub.quantize passes the gradient of its dequantized value straight to what was
    quantized; its values and scale get none. existing_out's cotangent is the output
    cotangent on the rows not computed and 0 on the rows computed. An integer operand takes
    no gradient (as in lax); a raw fp8 one takes its gradient in its own dtype (as lax's:
    summed in float32, rounded once to fp8). Differentiated with an activation or glu, the
    forward pass keeps the pre-activation z = the sums + bias [m, n_rhs] in float32 for the
    backward pass, under the checkpoint name PRE_ACTIVATION ("kernelhub_pre_activation"): inside jax.checkpoint, a
    policy that saves that name keeps it, one that does not runs the forward matmul again in
    the backward pass.

    Raises:
      TypeError or ValueError naming the argument for bad ranks, dtypes, contraction sizes,
      group_sizes, tiling, existing_out, group_offset, bias, activation, glu and glu_layout
      (an odd n_rhs with glu, glu with activation, an epilogue on an int32 output), and (when
      concrete) negative group sizes or sizes summing past m. Under jit the sizes are checked only with
      `kernelhub.runtime_checks()` (or KERNELHUB_RUNTIME_CHECKS=1); without it bad sizes give
      unspecified values but never out-of-bounds memory access.
    """
