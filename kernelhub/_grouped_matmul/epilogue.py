"""Fused epilogues: what grouped_matmul does to its float32 sums before the cast.

The meaning is defined here once (kernelhub/ops/grouped_matmul.py states it for users); each
backend only applies it to the tile it holds:

  z   = the float32 sum (scales applied) + bias[group]          [rows, n_rhs]
  out = activation(z)                                           [rows, n_rhs]
      or glu(gate, up), gate and up halves of z by the layout    [rows, n_rhs / 2]

`Epilogue` is the static description (hashable: it is a jit static argument and part of the
custom VJP's non-differentiable arguments); the bias travels beside it as an array. The
gradient of an epilogue is `jax.vjp` of `Epilogue.apply` on the float32 pre-activation, for a
named activation and a user's callable alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from kernelhub._grouped_matmul import names
from kernelhub._grouped_matmul.groups import computed_rows, row_groups

Erf = Callable[[jax.Array], jax.Array]


def _gelu(x: jax.Array, erf: Erf) -> jax.Array:
    return 0.5 * x * (1.0 + erf(x * 0.7071067811865476))


def _gelu_tanh(x: jax.Array, erf: Erf) -> jax.Array:
    del erf
    return 0.5 * x * (1.0 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _silu(x: jax.Array, erf: Erf) -> jax.Array:
    del erf
    return x * lax.logistic(x)


# Written out with the primitives every kernel language lowers (the GPU kernels pass `erf=` a
# polynomial, kernelhub/_grouped_matmul/polynomial_erf.py).
ACTIVATIONS: dict[str, Callable[[jax.Array, Erf], jax.Array]] = {
    "relu": lambda x, erf: jnp.maximum(x, 0.0),
    "silu": _silu,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "tanh": lambda x, erf: jnp.tanh(x),
    "sigmoid": lambda x, erf: lax.logistic(x),
    "identity": lambda x, erf: x,
}

# GPT-OSS's gated unit: both halves clamped, the gate through a sharpened sigmoid, up shifted.
SWIGLU_OAI_LIMIT = 7.0
SWIGLU_OAI_ALPHA = 1.702


def _swiglu_oai(gate: jax.Array, up: jax.Array, erf: Erf) -> jax.Array:
    del erf
    gate = jnp.minimum(gate, SWIGLU_OAI_LIMIT)
    up = jnp.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return (up + 1.0) * gate * lax.logistic(SWIGLU_OAI_ALPHA * gate)


GLUS: dict[str, Callable[[jax.Array, jax.Array, Erf], jax.Array]] = {
    "silu": lambda gate, up, erf: _silu(gate, erf) * up,
    "gelu": lambda gate, up, erf: _gelu(gate, erf) * up,
    "gelu_tanh": lambda gate, up, erf: _gelu_tanh(gate, erf) * up,
    "swiglu_oai": _swiglu_oai,
}

CONCATENATED = "concatenated"  # gate = columns [:n], up = [n:]
INTERLEAVED = "interleaved"  # gate = columns [0::2], up = [1::2]
GLU_LAYOUTS = (CONCATENATED, INTERLEAVED)


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What follows the sum: a bias (its array passed beside), then an activation (a name of
    ACTIVATIONS or an elementwise callable) or a gated unit (a name of GLUS, halves laid out by
    `glu_layout`). The default does nothing."""

    has_bias: bool = False
    activation: str | Callable[[jax.Array], jax.Array] | None = None
    glu: str | None = None
    glu_layout: str = CONCATENATED

    @property
    def is_identity(self) -> bool:
        """Whether the output is the plain sum (no bias, activation or gate)."""
        return not self.has_bias and self.nonlinear is False

    @property
    def nonlinear(self) -> bool:
        """Whether an activation or gate follows the bias (its gradient needs z)."""
        return self.glu is not None or (self.activation is not None
                                        and self.activation != "identity")

    @property
    def interleaved(self) -> bool:
        return self.glu is not None and self.glu_layout == INTERLEAVED

    def output_columns(self, rhs_columns: Any) -> Any:
        """The output's columns for `rhs_columns` columns of rhs (half of them for a glu)."""
        return rhs_columns // 2 if self.glu is not None else rhs_columns

    def bias_only(self) -> Epilogue:
        """This epilogue without its activation or gate: what yields z."""
        return Epilogue(has_bias=self.has_bias)

    def features(self) -> frozenset[str]:
        """The registry features (kernelhub/_grouped_matmul/names.py) a call with it uses."""
        used = set()
        if self.has_bias:
            used.add(names.BIAS)
        if self.activation is not None:
            used.add(names.ACTIVATION)
        if self.glu is not None:
            used.add(names.GLU)
        return frozenset(used)

    # --- the float32 math, on whole arrays or on one kernel's tile --------------------------

    def activate(self, z: jax.Array, erf: Erf = lax.erf) -> jax.Array:
        """The activation of float32 `z` (no gate); the identity without one."""
        if self.activation is None:
            return z
        if callable(self.activation):
            return self.activation(z).astype(jnp.float32)
        return ACTIVATIONS[self.activation](z, erf)

    def gated(self, gate: jax.Array, up: jax.Array, erf: Erf = lax.erf) -> jax.Array:
        """The gated unit of float32 halves `gate` and `up` (equal shapes)."""
        return GLUS[self.glu](gate, up, erf)

    def split(self, z: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(gate, up) of z [..., 2n] by the layout."""
        half = z.shape[-1] // 2
        if self.glu_layout == INTERLEAVED:
            pairs = z.reshape(*z.shape[:-1], half, 2)
            return pairs[..., 0], pairs[..., 1]
        return z[..., :half], z[..., half:]

    def apply(self, z: jax.Array, erf: Erf = lax.erf) -> jax.Array:
        """The output of float32 pre-activation z [..., n_rhs] (bias added)."""
        if self.glu is None:
            return self.activate(z, erf)
        return self.gated(*self.split(z), erf)

    def pre_activation_gradient(self, z: jax.Array, d_out: jax.Array) -> jax.Array:
        """d z (float32) from float32 z [..., n_rhs] and the output's cotangent."""
        if not self.nonlinear:
            return d_out.astype(jnp.float32)
        _, pullback = jax.vjp(self.apply, z)
        (d_z,) = pullback(d_out.astype(jnp.float32))
        return d_z


class KernelEpilogue(NamedTuple):
    """A raw kernel's `epilogue=` option: the description, the bias [local_groups, n_rhs], and
    the scales of quantized operands that the kit folds out of the sum (scale_folding.py): one
    per row of lhs [m] and one per group and rhs column [local_groups, n_rhs]. Each None when
    absent. The kernel's tile becomes spec.apply(sum * row_scale * column_scale + bias)."""

    spec: Epilogue
    bias: jax.Array | None
    row_scale: jax.Array | None = None
    column_scale: jax.Array | None = None

    @property
    def is_identity(self) -> bool:
        """Whether the kernel writes its plain sums."""
        return self.spec.is_identity and self.row_scale is None and self.column_scale is None

    @property
    def column_vectors(self) -> tuple[jax.Array, ...]:
        """The per-group column arrays the kernel reads for its tile: the column scale, then the
        bias, each when given."""
        return tuple(v for v in (self.column_scale, self.bias) if v is not None)


NO_EPILOGUE = KernelEpilogue(Epilogue(), None)


def applied(total: jax.Array, epilogue: KernelEpilogue, group_sizes: jax.Array,
            group_offset: jax.Array, local_groups: int, existing_out: jax.Array | None,
            out_dtype: Any) -> jax.Array:
    """The whole output from grouped_matmul's float32 sums `total` [m, n_rhs] (rows outside the
    local groups may hold anything): the epilogue on the computed rows, existing_out's rows (or
    0) elsewhere, in `out_dtype`. For the paths that apply the epilogue outside a kernel: scales
    around a kernel that cannot take them with a glu, a contraction of length 0, the
    saved-residual forward."""
    m = total.shape[0]
    z = total.astype(jnp.float32)
    groups = row_groups(group_sizes, group_offset, local_groups, m)
    if epilogue.row_scale is not None:
        z = z * epilogue.row_scale.astype(jnp.float32)[:, None]
    if epilogue.column_scale is not None:
        z = z * epilogue.column_scale.astype(jnp.float32)[groups]
    if epilogue.bias is not None:
        z = z + epilogue.bias.astype(jnp.float32)[groups]
    out = epilogue.spec.apply(z).astype(out_dtype)
    computed = computed_rows(group_sizes, group_offset, local_groups, m)[:, None]
    base = jnp.zeros_like(out) if existing_out is None else existing_out
    return jnp.where(computed, out, base)
