"""A user's own op, declared and implemented outside kernelhub: SwiGLU, silu(gate) * up.

    python examples/swiglu_op.py        # checks every implementation against a float64 reference

What a project adds to kernelhub to get one op on every backend (docs/extending.md walks
through it):

1. the contract: a function whose signature and docstring are the op's, declared with
   `kernelhub.define_op`, with a validation hook;
2. implementations, each registered for (platform, backend): a portable one in plain jax, and
   a Pallas kernel, compiled on TPU and run in interpret mode on a CPU when forced;
3. a check that they all agree with an independent reference (`kernelhub.testing`).
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

import kernelhub
import kernelhub.export
from kernelhub import testing


# 1. The contract --------------------------------------------------------------------------

def _validate(arguments: dict[str, Any]) -> dict[str, Any]:
    gate, up = jnp.asarray(arguments["gate"]), jnp.asarray(arguments["up"])
    if gate.dtype != up.dtype:
        raise TypeError(f"up must have gate's dtype {gate.dtype}, got {up.dtype}")
    return {"gate": gate, "up": up}


@kernelhub.define_op(validate=_validate)
def swiglu(gate: Float[Array, "rows features"], up: Float[Array, "rows features"]) -> Float[Array, "rows features"]:
    """The gated activation of a SwiGLU feed-forward layer: silu(gate) * up, elementwise.

    Args:
      gate: [rows, features], the gate projection's output.
      up: [rows, features] of gate's dtype, the up projection's output.

    Returns:
      [rows, features] of gate's dtype, computed in float32 and rounded once.
    """


# 2. Implementations -----------------------------------------------------------------------

@kernelhub.register(swiglu, "xla", "any")
def swiglu_xla(gate, up):
    wide = gate.astype(jnp.float32)
    return (jax.nn.silu(wide) * up.astype(jnp.float32)).astype(gate.dtype)


BLOCK_ROWS = 256


def _swiglu_kernel(gate_ref, up_ref, out_ref):
    gate = gate_ref[...].astype(jnp.float32)
    out_ref[...] = (gate * jax.nn.sigmoid(gate) * up_ref[...].astype(jnp.float32)).astype(out_ref.dtype)


def _swiglu_pallas(gate, up, *, interpret):
    from jax.experimental import pallas as pl

    rows, features = gate.shape
    block_rows = rows if rows <= BLOCK_ROWS else BLOCK_ROWS  # a multiple of 8, or every row
    block = pl.BlockSpec((block_rows, features), lambda i: (i, 0))
    return pl.pallas_call(
        _swiglu_kernel,
        out_shape=jax.ShapeDtypeStruct(gate.shape, gate.dtype),
        grid=(pl.cdiv(rows, block_rows),),
        in_specs=[block, block],
        out_specs=block,
        interpret=interpret,
    )(gate, up)


def _pallas_op(interpret: bool):
    """The kernel with a VJP: a pallas_call has no autodiff of its own."""

    @jax.custom_vjp
    def op(gate, up):
        return _swiglu_pallas(gate, up, interpret=interpret)

    def forward(gate, up):
        return op(gate, up), (gate, up)

    def backward(residuals, d_out):
        gate, up = (r.astype(jnp.float32) for r in residuals)
        sigmoid = jax.nn.sigmoid(gate)
        d_out = d_out.astype(jnp.float32)
        d_gate = d_out * up * sigmoid * (1 + gate * (1 - sigmoid))
        return d_gate.astype(residuals[0].dtype), (d_out * gate * sigmoid).astype(residuals[1].dtype)

    op.defvjp(forward, backward)

    def swiglu_pallas(gate, up):  # the op's exact signature, as register requires
        return op(gate, up)

    return swiglu_pallas


# The compiled kernel is the default on a TPU; the interpreted one runs on a CPU when pallas
# is forced (platform="pallas" or KERNELHUB_PLATFORM=pallas), never by default.
kernelhub.register(swiglu, "pallas", "tpu", priority=10,
                   requirement=kernelhub.needs_device("tpu"))(_pallas_op(interpret=False))
kernelhub.register(swiglu, "pallas", "cpu", interpret_only=True)(_pallas_op(interpret=True))


# 3. Every implementation against a reference -----------------------------------------------

def reference(gate, up):
    """In float64, written with jax.numpy so that kernelhub.testing can differentiate it."""
    return gate / (1 + jnp.exp(-gate)) * up


def random_case(rng: np.random.Generator) -> testing.Case:
    rows, features = rng.integers(1, 600), rng.integers(1, 48)
    dtype = rng.choice([jnp.float32, jnp.bfloat16])
    draw = functools.partial(rng.normal, size=(rows, features))
    return testing.Case(jnp.asarray(draw(), dtype), jnp.asarray(draw(), dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=8, help="random cases per implementation")
    report = testing.check_implementations(swiglu, reference, random_case,
                                           examples=parser.parse_args().examples)
    print(report)
    report.assert_ok()

    # One exported artifact: the TPU lowering holds the Pallas kernel, the CPU one plain XLA.
    rows = jax.ShapeDtypeStruct((512, 128), jnp.bfloat16)
    exported = kernelhub.export.export(swiglu, rows, rows)
    print("kernels in each platform's lowering:", kernelhub.export.kernels_by_platform(exported))
    print("a call here uses", kernelhub.resolve(swiglu))


if __name__ == "__main__":
    main()
