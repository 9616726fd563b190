"""Per-pass tilings: the `tiling` argument of grouped_matmul and transposed_grouped_matmul.

A differentiated call runs three kernels, each with its own best tiles:

  pass          grouped_matmul (gmm)               transposed_grouped_matmul (tgmm)
  forward       gmm(lhs, rhs)                      tgmm(lhs, rhs)
  lhs_gradient  gmm(d_out, rhs, transposed rhs)    gmm(rhs, d_out, transposed rhs)
  rhs_gradient  tgmm(lhs^T, d_out)                 gmm(lhs^T, d_out)

`tiling` is one tiling for all of them (a tuple, a callable (m, k, n) -> tuple | None, or None
for the implementation's choice), or a `Tilings` / mapping with an entry per pass. Entries left
None go to the active tuning (kernelhub.tuning), then the implementation's heuristic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

PASSES = ("forward", "lhs_gradient", "rhs_gradient")

SingleTiling = tuple[int, ...] | Callable[[int, int, int], tuple[int, ...] | None] | None


@dataclasses.dataclass(frozen=True)
class Tilings:
    """A tiling for each pass of a grouped matmul and its gradients (see the module docstring).

    Each entry is what `tiling` takes for one kernel: a tuple of ints starting with three block
    sizes (rows, k, n), a callable (m, k, n) -> tuple | None, or None for the tuned or default
    choice. `tuning` is the kernelhub.tuning table active when the call was made (set by the
    op, not by users); it is compared by identity, so a call traced under another table is
    traced again.
    """

    forward: SingleTiling = None
    lhs_gradient: SingleTiling = None
    rhs_gradient: SingleTiling = None
    tuning: Any = dataclasses.field(default=None, compare=True, repr=False)

    def __post_init__(self):
        for name in PASSES:
            object.__setattr__(self, name, single(getattr(self, name), f"tiling[{name!r}]"))

    def for_pass(self, name: str) -> SingleTiling:
        return getattr(self, name)


def single(value: Any, argument: str = "tiling") -> SingleTiling:
    """One kernel's tiling, checked for form: None, a callable, or a tuple of ints that starts
    with megablox's three positive block sizes (rows, k, n); kept as given.

    What else a tuple must be for a kernel (multiples of hardware tiles, powers of two, extra
    entries such as Triton's num_warps) is that kernel's rule, checked when it is traced.
    """
    if value is None or callable(value):
        return value
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        raise TypeError(
            f"{argument} must be None, a callable (m, k, n) -> tuple, or a tuple of ints such "
            f"as (128, 128, 128), got {value!r}")
    if len(value) < 3 or any(v <= 0 for v in value[:3]) or any(v < 0 for v in value[3:]):
        raise ValueError(
            f"{argument} must start with three positive block sizes (rows, k, n) as megablox's "
            f"(any further entries >= 0), got {tuple(value)!r}")
    return tuple(int(v) for v in value)


def as_tilings(value: Any, tuning: Any = None) -> Tilings:
    """`tiling` as Tilings, with `tuning` attached: one tiling serves every pass; a mapping
    names passes (unknown names are a ValueError listing the known ones)."""
    if isinstance(value, Tilings):
        return dataclasses.replace(value, tuning=tuning)
    if isinstance(value, Mapping):
        unknown = sorted(str(name) for name in value if name not in PASSES)
        if unknown:
            raise ValueError(
                f"tiling has entries for unknown passes {unknown}; the passes are "
                f"{', '.join(PASSES)}")
        return Tilings(**dict(value), tuning=tuning)
    one = single(value)
    return Tilings(one, one, one, tuning=tuning)


def in_pass(error: ValueError, pass_name: str) -> ValueError:
    """A kernel's tiling error, reworded to name the pass whose tiling broke the rule."""
    return type(error)(f"tiling for the {pass_name} pass: {error}")
