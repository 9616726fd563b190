"""Quantized training: a grouped matmul whose forward and backward passes each have a format.

    from kernelhub import quantized_training as qt
    out = qt.grouped_matmul(x, w, group_sizes, recipe=qt.MXFP8)           # float x, w
    out = qt.grouped_matmul(x, w, group_sizes, recipe=qt.MXFP8_FORWARD)   # backward unquantized

`kernelhub.grouped_matmul` on QuantizedArrays passes gradients straight through to the float
sources, and its backward products reuse the forward's quantized operands (quantized along the
forward's contraction) beside float cotangents. A recipe instead quantizes each pass's operands
along that pass's own contraction axis, as MXFP8 training does (OCP MX: one power-of-two scale
per 32 values along the axis a product sums over):

  forward:    out      = gmm(Q_f(x) along k, Q_f(w) along k)         then the epilogue
  lhs grad:   d x      = gmm(Q_b(d z) along n, Q_b(w) along n)
  rhs grad:   d w[g]   = Q_b(x)^T along m  @  Q_b(d z) along m     (tgmm, rows of group g)
  bias grad:  d bias[g] = the sum of d z over group g's rows (float32)

Q_f and Q_b are the recipe's `forward` and `backward` formats: a named format of
kernelhub.quantize ("mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4") or a value dtype (one scale per
row or column along the axis); `backward=None` runs the backward products on the unquantized
operands in their own dtype (bf16 in bf16 training: the choice torchao added because MXFP8
weight gradients were slow). d z is the epilogue's gradient at the pre-activation z, which the
forward keeps (float32, under the checkpoint name "kernelhub_pre_activation", as
kernelhub.grouped_matmul does: a jax.checkpoint policy may drop it, and the forward runs again). The gradients are
those of the quantized products with respect to the float operands (straight-through).

Every pass is a kernelhub.grouped_matmul or transposed_grouped_matmul call, so each runs on the
implementation the dispatcher picks (or `platform`), on TPU, GPU and CPU alike.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from kernelhub import _loader
from jax.ad_checkpoint import checkpoint_name

from kernelhub._core.dispatch import get
from kernelhub._grouped_matmul.epilogue import Epilogue, KernelEpilogue, applied
from kernelhub._grouped_matmul.groups import group_sums
from kernelhub._grouped_matmul.names import PRE_ACTIVATION
from kernelhub.quantization import FORMATS, VALUE_DTYPES, quantize


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The formats of a grouped matmul's passes: `forward` quantizes x and w along k;
    `backward` quantizes each gradient product's operands along its contraction (None: the
    operands as they are)."""

    forward: Any = "mxfp8"
    backward: Any = "mxfp8"

    def __post_init__(self) -> None:
        for name in ("forward", "backward"):
            form = getattr(self, name)
            if form is None and name == "backward":
                continue
            if isinstance(form, str):
                if form not in FORMATS:
                    raise ValueError(f"Recipe.{name} must be a format name "
                                     f"({', '.join(sorted(FORMATS))}) or a value dtype; got "
                                     f"{form!r}")
                continue
            try:
                dtype = jnp.dtype(form)
            except TypeError:
                dtype = None
            if dtype not in VALUE_DTYPES:
                raise ValueError(f"Recipe.{name} must be a format name "
                                 f"({', '.join(sorted(FORMATS))}) or a value dtype "
                                 f"({', '.join(d.name for d in VALUE_DTYPES)}); got {form!r}")


MXFP8 = Recipe("mxfp8", "mxfp8")
MXFP8_FORWARD = Recipe("mxfp8", None)


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                   recipe: Recipe = MXFP8, preferred_element_type: Any = jnp.float32,
                   group_offset: jax.Array | None = None, transpose_rhs: bool = False,
                   bias: jax.Array | None = None, activation: Any = None, glu: str | None = None,
                   glu_layout: str = "concatenated", platform: str | None = None) -> jax.Array:
    """kernelhub.grouped_matmul of float `lhs` [m, k] and `rhs` [G, k, n] ([G, n, k] with
    transpose_rhs), each pass in the recipe's format (module docstring). The arguments mean
    what they mean there (kernelhub/ops/grouped_matmul.py); existing_out and tiling are not
    taken. `platform` forces an implementation as kernelhub.get does."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a kernelhub.quantized_training.Recipe; got "
                        f"{type(recipe).__name__}")
    for name, operand in (("lhs", lhs), ("rhs", rhs)):
        if not jnp.issubdtype(jnp.result_type(operand), jnp.floating):
            raise TypeError(f"{name} must be a float array (the recipe quantizes it); got "
                            f"{jnp.result_type(operand)}")
    out_dtype = jnp.dtype(preferred_element_type)
    offset = jnp.zeros((), jnp.int32) if group_offset is None else jnp.asarray(group_offset,
                                                                               jnp.int32)
    epilogue = Epilogue(bias is not None, activation, glu, glu_layout)
    call = _differentiable(recipe, out_dtype, transpose_rhs, epilogue, platform)
    return call(lhs, rhs, bias, group_sizes, offset)


def _quantized(x: jax.Array, form: Any, axis: int) -> Any:
    if form is None:
        return x
    return quantize(x, form, axis=axis)


@functools.lru_cache(maxsize=None)
def _differentiable(recipe: Recipe, out_dtype: Any, transpose_rhs: bool, epilogue: Epilogue,
                    platform: str | None):
    _loader.load()
    gmm = get("grouped_matmul", platform=platform)
    tgmm = get("transposed_grouped_matmul", platform=platform)
    rhs_k_axis, rhs_n_axis = (2, 1) if transpose_rhs else (1, 2)
    epilogue_arguments = dict(activation=epilogue.activation, glu=epilogue.glu,
                              glu_layout=epilogue.glu_layout)

    def forward(lhs, rhs, bias, group_sizes, group_offset, out_type, with_epilogue):
        options = epilogue_arguments if with_epilogue else {}
        return gmm(_quantized(lhs, recipe.forward, 1), _quantized(rhs, recipe.forward, rhs_k_axis),
                   group_sizes, preferred_element_type=out_type, group_offset=group_offset,
                   transpose_rhs=transpose_rhs, bias=bias, **options)

    @jax.custom_vjp
    def call(lhs, rhs, bias, group_sizes, group_offset):
        return forward(lhs, rhs, bias, group_sizes, group_offset, out_dtype, True)

    def call_forward(lhs, rhs, bias, group_sizes, group_offset):
        if not epilogue.nonlinear:
            out = forward(lhs, rhs, bias, group_sizes, group_offset, out_dtype, True)
            return out, (lhs, rhs, bias, group_sizes, group_offset, None)
        # The forward matmul writes z (bias added); the epilogue follows outside it.
        z = forward(lhs, rhs, bias, group_sizes, group_offset, jnp.float32, False)
        z = checkpoint_name(z, PRE_ACTIVATION)
        out = applied(z, KernelEpilogue(epilogue, None), group_sizes, group_offset, rhs.shape[0],
                      None, out_dtype)
        return out, (lhs, rhs, bias, group_sizes, group_offset, z)

    def call_backward(residuals, d_out):
        lhs, rhs, bias, group_sizes, group_offset, z = residuals
        if epilogue.nonlinear:
            d_z = epilogue.pre_activation_gradient(z, d_out)
        else:
            d_z = d_out.astype(jnp.float32)
        # Unquantized backward products run in the operands' dtype, as the rest of the step.
        d_z = d_z.astype(lhs.dtype) if recipe.backward is None else d_z
        local_groups = rhs.shape[0]
        d_lhs = gmm(_quantized(d_z, recipe.backward, 1),
                    _quantized(rhs, recipe.backward, rhs_n_axis), group_sizes,
                    preferred_element_type=lhs.dtype, group_offset=group_offset,
                    transpose_rhs=not transpose_rhs)
        if transpose_rhs:  # d w [G, n, k] = d z^T @ x, summed over each group's rows
            pair = (_quantized(d_z.T, recipe.backward, 1), _quantized(lhs, recipe.backward, 0))
        else:  # d w [G, k, n] = x^T @ d z
            pair = (_quantized(lhs.T, recipe.backward, 1), _quantized(d_z, recipe.backward, 0))
        d_rhs = tgmm(*pair, group_sizes, preferred_element_type=rhs.dtype,
                     group_offset=group_offset, num_actual_groups=local_groups)
        d_bias = None
        if bias is not None:
            d_bias = group_sums(d_z, group_sizes, group_offset, local_groups).astype(bias.dtype)
        return d_lhs, d_rhs, d_bias, None, None

    call.defvjp(call_forward, call_backward)
    return call
