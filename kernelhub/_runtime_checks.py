"""The opt-in runtime check of group sizes and offsets under jit.

When the values are concrete the contract checks them before any kernel runs. Under `jit` they are
not known while tracing; with this switch on, the traced call carries a host callback that checks
them when the computation runs. It costs a device-to-host copy of group_sizes per call, which is
why it is off by default. With it off, the kernels clamp every index, so bad sizes give
unspecified values but never out-of-bounds memory access.

The switch is a jax configuration option that jax.jit caches on, so turning it on takes effect
for every later call, functions jitted (and called) before included: they are traced again.

    with kernelhub.runtime_checks():     # for every call in the block; a failed check raises
        out = step(params, batch)        # kernelhub.RuntimeCheckError (a ValueError) by the
                                         # end of the block

or KERNELHUB_RUNTIME_CHECKS=1 for the whole process (read when kernelhub is first used). A check
fails inside the running computation, and jax reports that as `jax.errors.JaxRuntimeError` where
the result is waited for; inside the block it becomes a RuntimeCheckError whose message is the
problem itself. Outside a block, the problem is the last line of jax's message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from kernelhub import _jax_internals

RUNTIME_CHECKS_VARIABLE = "KERNELHUB_RUNTIME_CHECKS"
_OPTION = RUNTIME_CHECKS_VARIABLE.lower()  # jax reads the variable of its upper-case name
_switch = None


class RuntimeCheckError(ValueError):
    """Group sizes or a group offset that break an op's contract, found while it ran."""


def _option():
    global _switch
    if _switch is None:  # made on first use: an option of jax's, with its environment variable
        _switch = _jax_internals.jit_keyed_flag(
            _OPTION, "kernelhub: check group sizes and offsets of traced calls when they run")
    return _switch


def enabled() -> bool:
    return bool(_option().value)


@contextlib.contextmanager
def runtime_checks(enable: bool = True) -> Iterator[None]:
    """Turns the runtime check of group sizes on (or off) for every call in the block; a check
    that fails raises RuntimeCheckError by the end of the block."""
    with _option()(bool(enable)):
        try:
            yield
            if enable:
                jax.effects_barrier()  # let the checks of calls still running report
        except jax.errors.JaxRuntimeError as error:
            problem = problem_in(error)
            if problem is None:
                raise
            raise RuntimeCheckError(problem) from error


def problem_in(error: BaseException) -> str | None:
    """The message of a failed runtime check inside jax's error report, if it holds one."""
    marker = f"{RuntimeCheckError.__name__}: "
    lines = [line for line in str(error).splitlines() if marker in line]
    return lines[-1].split(marker, 1)[1].strip() if lines else None


def host_check(check: Callable[..., None], *arrays: Any) -> None:
    """Runs `check(*host arrays)` when the computation runs (a ValueError it raises surfaces
    from the call); for an op's `runtime_check` (see kernelhub.define_op)."""
    jax.debug.callback(check, *arrays, ordered=False)


def group_check(op: str, rows: int, local_groups: int) -> Callable[[Any, Any], None]:
    """A check of group sizes that split `rows`, and of an offset for `local_groups`."""

    def check(group_sizes: np.ndarray, group_offset: np.ndarray) -> None:
        try:
            validate_values(np.asarray(group_sizes), int(group_offset), rows, local_groups, op)
        except ValueError as error:
            raise RuntimeCheckError(str(error)) from None

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
