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

from kernelhub import _loader  # the loader imports nothing until asked

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
    if name not in __all__ and name not in _SUBMODULES:
        raise AttributeError(f"module 'kernelhub' has no attribute {name!r}")
    # Before the module holding the name: jax and kernelhub's ops, once, under the loader's lock,
    # whichever name and thread come first (kernelhub/_loader.py says why).
    _loader.load()
    if name in _SUBMODULES:
        return importlib.import_module(f"kernelhub.{name}")
    value = getattr(importlib.import_module("kernelhub._public"), name)
    globals()[name] = value  # later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *_SUBMODULES, "__version__"])
