"""The rules for the values of group sizes and offsets, and when they are checked.

Eager calls check them without waiting on a device (kernelhub/_core/value_checks.py says when
a failure is reported); traced calls only under kernelhub.runtime_checks(), when they run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from kernelhub._core import runtime_checks, value_checks
from kernelhub._core.runtime_checks import RuntimeCheckError
from kernelhub._grouped_matmul.groups import NO_OFFSET


def validate_values(group_sizes: np.ndarray, group_offset: int, rows: int,
                    local_groups: int | None, op: str) -> None:
    """Raises a ValueError when concrete group sizes or offsets break the contract of `op`."""
    validate_sizes(group_sizes, rows, op)
    validate_offset(group_offset, np.shape(group_sizes)[-1], local_groups, op)


def validate_sizes(group_sizes: np.ndarray, rows: int, op: str, allow_excess: bool = False
                   ) -> None:
    """Raises a ValueError when concrete group sizes do not fit int32, are negative or (unless
    `allow_excess`: lax's ragged_dot drops the excess) sum past the `rows` they split."""
    group_sizes = np.asarray(group_sizes)
    too_large = np.flatnonzero(group_sizes > np.iinfo(np.int32).max)
    if too_large.size:
        raise ValueError(
            f"group_sizes must fit in int32 (at most 2**31 - 1 each); "
            f"{int(group_sizes[too_large[0]])} at index {int(too_large[0])} does not ({op})")
    if np.any(group_sizes < 0):
        bad = np.flatnonzero(group_sizes < 0)[:5].tolist()
        raise ValueError(f"group_sizes must be >= 0; negative at indices {bad} ({op})")
    total = int(np.sum(group_sizes, dtype=np.int64))
    if total > rows and not allow_excess:
        raise ValueError(f"group_sizes sum to {total}, more than the {rows} rows they split ({op})")


def validate_offset(group_offset: int, num_groups: int, local_groups: int | None,
                    op: str) -> None:
    """Raises a ValueError when `group_offset` leaves no room for the local groups (None: all
    groups from the offset on, at least one)."""
    local = num_groups - group_offset if local_groups is None else local_groups
    if group_offset < 0 or local < 1 or group_offset + local > num_groups:
        raise ValueError(
            f"group_offset={group_offset} with {local_groups or 'at least one'} local groups "
            f"must lie within the {num_groups} groups of group_sizes (0 <= group_offset <= "
            f"{num_groups - (local_groups or 1)}) ({op})")


def check_group_sizes(group_sizes: Any, rows: int, op: str, allow_excess: bool = False) -> None:
    """Checks concrete group sizes (each row of a batch of them) against the `rows` they split."""

    def check(host: np.ndarray) -> None:
        host = np.asarray(host)
        for sizes in host.reshape(-1, host.shape[-1]) if host.ndim else [host]:
            validate_sizes(sizes, rows, op, allow_excess)

    # One op always allows an excess or never does: the op in the memo tells the two apart.
    value_checks.check_values(check, group_sizes, call=op, memo=("group_sizes", rows, op))


def check_call(group_sizes: Any, group_offset: Any, rows: int, local_groups: int | None,
               op: str, allow_excess: bool = False) -> None:
    """The value checks of one call: its group sizes (each row of a batch of them) against the
    `rows` they split (with `allow_excess`, a sum past them is no error), and a given offset
    against `local_groups` (None: all groups from the offset on). Tracers, whose values are not
    known, are left to kernelhub.runtime_checks."""
    if not value_checks.passed(("group_sizes", rows, op), group_sizes):
        if not isinstance(group_sizes, jax.core.Tracer):
            check_group_sizes(group_sizes, rows, op, allow_excess)
    if group_offset is None or isinstance(group_offset, jax.core.Tracer):
        return
    num_groups = np.shape(group_sizes)[-1]
    offset_memo = ("group_offset", num_groups, local_groups, op)
    if value_checks.passed(offset_memo, group_offset):
        return

    def check(host: np.ndarray) -> None:
        validate_offset(int(np.asarray(host).reshape(())), num_groups, local_groups, op)

    value_checks.check_values(check, group_offset, call=op, memo=offset_memo)


def value_hooks(op: str, rows: Callable[[dict[str, Any]], int],
                local_groups: Callable[[dict[str, Any]], int | None]
                ) -> tuple[Callable[[dict[str, Any]], None], Callable[[dict[str, Any]], None]]:
    """A contract's `check_values` and `runtime_check` (kernelhub.define_op) for group sizes
    that split `rows(arguments)` rows and an offset for `local_groups(arguments)` groups."""

    def check_values(arguments: dict[str, Any]) -> None:
        check_call(arguments["group_sizes"], arguments["group_offset"], rows(arguments),
                   local_groups(arguments), op)

    def runtime_check(arguments: dict[str, Any]) -> None:
        check = group_check(op, rows(arguments), local_groups(arguments))
        offset = arguments["group_offset"]
        runtime_checks.host_check(check, arguments["group_sizes"],
                                  NO_OFFSET if offset is None else offset)

    return check_values, runtime_check


def group_check(op: str, rows: int, local_groups: int | None) -> Callable[[Any, Any], None]:
    """A check, run by the computation (kernelhub.runtime_checks), of group sizes that split
    `rows` and of an offset for `local_groups`."""

    def check(group_sizes: np.ndarray, group_offset: np.ndarray) -> None:
        try:
            validate_values(np.asarray(group_sizes), int(np.asarray(group_offset).reshape(())),
                            rows, local_groups, op)
        except ValueError as error:
            raise RuntimeCheckError(str(error)) from None

    return check
