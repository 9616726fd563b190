"""kernelhub: grouped matmuls for JAX, one contract, the best kernel for where it runs.

    import kernelhub
    out = kernelhub.grouped_matmul(lhs, rhs, group_sizes)          # best for this backend
    gmm = kernelhub.get("grouped_matmul", platform="xla")           # or force one
    kernelhub.resolve("grouped_matmul")                             # which would run
    out = kernelhub.ragged_dot(lhs, rhs, group_sizes)              # jax.lax's API, every mode
    w8 = kernelhub.quantize(w, jnp.int8, axis=1)                    # int8/fp8 operands
    with kernelhub.autotune(step, params, batch):                   # tilings measured here

Each platform's kernel is chosen when XLA lowers the call (an exported function holds them
all: `kernelhub.export`). Users declare ops of their own with `define_op` and add
implementations with `register` (docs/extending.md); `kernelhub.testing` checks every
implementation against a reference.

`import kernelhub` itself loads nothing: jax, the ops and their implementations load on first
use of any name here (kernelhub/_public.py), so `kernelhub --help` answers at once. Loading
touches no device and reads no environment.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "KernelSpec",
    "NoImplementationError",
    "Platform",
    "QuantizedArray",
    "RuntimeCheckError",
    "ShapeError",
    "Tilings",
    "autotune",
    "define_op",
    "get",
    "grouped_matmul",
    "implementations",
    "needs_device",
    "op_names",
    "quantize",
    "ragged_dot",
    "ragged_dot_general",
    "register",
    "resolve",
    "runtime_checks",
    "transposed_grouped_matmul",
]

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from kernelhub._public import *  # noqa: F403


# Submodules that `kernelhub.<name>` reaches without an import of their own, as before.
_SUBMODULES = ("export", "ops", "parallel", "quantization", "quantized_training", "testing",
               "tuning")


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("kernelhub._public"), name)
        globals()[name] = value  # later lookups find it without coming here
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"kernelhub.{name}")
    raise AttributeError(f"module 'kernelhub' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, *_SUBMODULES, "__version__"])
