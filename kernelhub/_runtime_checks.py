"""The opt-in runtime check of group sizes and offsets under jit.

When the values are concrete the contract checks them before any kernel runs. Under `jit` they are
not known while tracing; with this switch on, the traced call carries a host callback that raises
a ValueError naming the bad argument when the computation runs. It costs a device-to-host copy of
group_sizes per call, which is why it is off by default. With it off, the kernels clamp every
index, so bad sizes give unspecified values but never out-of-bounds memory access.

Switch it on with the environment variable KERNELHUB_RUNTIME_CHECKS=1 (read when a call is
traced), or for a block of code with `kernelhub.runtime_checks()`.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

RUNTIME_CHECKS_VARIABLE = "KERNELHUB_RUNTIME_CHECKS"
_override: contextvars.ContextVar[bool | None] = contextvars.ContextVar("kernelhub_runtime_checks", default=None)


def enabled() -> bool:
    override = _override.get()
    if override is not None:
        return override
    return os.environ.get(RUNTIME_CHECKS_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def runtime_checks(enable: bool = True) -> Iterator[None]:
    """Turns the runtime check of group sizes on (or off) for calls traced inside the block."""
    token = _override.set(bool(enable))
    try:
        yield
    finally:
        _override.reset(token)


def host_check(check: Callable[..., None], *arrays: Any) -> None:
    """Runs `check(*host arrays)` when the computation runs (a ValueError it raises surfaces
    from the call); for an op's `runtime_check` (see kernelhub.define_op)."""
    jax.debug.callback(check, *arrays, ordered=False)


def group_check(op: str, rows: int, local_groups: int) -> Callable[[Any, Any], None]:
    """A check of group sizes that split `rows`, and of an offset for `local_groups`."""

    def check(group_sizes: np.ndarray, group_offset: np.ndarray) -> None:
        validate_values(np.asarray(group_sizes), int(group_offset), rows, local_groups, op)

    return check


def validate_values(group_sizes: np.ndarray, group_offset: int, rows: int, local_groups: int, op: str) -> None:
    """Raises a ValueError when concrete group sizes or offsets break the contract of `op`."""
    if np.any(group_sizes < 0):
        bad = np.flatnonzero(group_sizes < 0)[:5].tolist()
        raise ValueError(f"group_sizes must be >= 0; negative at indices {bad} ({op})")
    total = int(np.sum(group_sizes, dtype=np.int64))
    if total > rows:
        raise ValueError(f"group_sizes sum to {total}, more than the {rows} rows they split ({op})")
    num_groups = group_sizes.shape[0]
    if group_offset < 0 or group_offset + local_groups > num_groups:
        raise ValueError(
            f"group_offset={group_offset} with {local_groups} local groups must lie within "
            f"the {num_groups} groups of group_sizes (0 <= group_offset <= "
            f"{num_groups - local_groups}) ({op})"
        )
