"""Checking the values of an eager call's arguments without waiting on a device.

An op's `validate` may need the numbers in an array (group sizes that must not be negative,
say). Reading a device array's numbers makes the host wait for the device, which no call should
do of its own accord; `check_values` reads them only where that costs no wait:

- host data (numpy arrays, lists, Python numbers): checked at once;
- a jax array on the CPU whose values are computed: checked at once (its memory is the host's);
- any other jax array (on an accelerator, or still being computed): its copy to the host starts
  now, asynchronously, and the check runs once its values are computed: at the start of the
  next eager call of any op, or at `settle()` (the end of a `kernelhub.runtime_checks()` block
  settles every pending check, waiting for it). A failure is raised there, its message naming
  the earlier call.

An array is read once (jax arrays never change): its host copy is remembered per array object,
and so is each check it passed (by the check's `memo`), so a loop that passes the same group
sizes pays for one read and one check.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

Check = Callable[..., None]

_lock = threading.Lock()
# Checks waiting for device values: (check, arrays, description of the call, the key that
# remembers its pass or None).
_pending: list[tuple[Check, tuple[Any, ...], str, tuple[Any, ...] | None]] = []
# Host copies of device arrays read before, by id, with a weak reference that drops the entry
# when the array is deleted.
_host_values: dict[int, tuple[weakref.ref, np.ndarray]] = {}
# Checks that passed, by (memo, ids of the jax arrays checked), with weak references to them.
_passed: dict[tuple[Any, ...], tuple[weakref.ref, ...]] = {}
_REMEMBERED = 1024


class DeferredCheckError(ValueError):
    """A check of an earlier call's device values that failed once they were computed."""


def passed(memo: Any, *arrays: Any) -> bool:
    """Whether the check described by `memo` passed before for exactly these jax arrays."""
    references = _passed.get((memo, *map(id, arrays)))
    return references is not None and all(r() is a for r, a in zip(references, arrays))


def check_values(check: Check, *values: Any, call: str = "", memo: Any = None) -> None:
    """Runs `check(*host values)` now, or once the values are computed (see the module).

    `memo`: a hashable description of the check (what it compares the values with): the same
    check of the same jax arrays is then made once.
    """
    passed_key = None
    if memo is not None and all(isinstance(value, jax.Array) for value in values):
        passed_key = (memo, *map(id, values))
        if passed(memo, *values):
            return
    host = []
    for value in values:
        known = _host_value(value)
        if known is None:
            for array in values:
                if isinstance(array, jax.Array):
                    array.copy_to_host_async()
            with _lock:
                _pending.append((check, values, call, passed_key))
            return
        host.append(known)
    check(*host)
    _remember_pass(passed_key, values)


def _remember_pass(passed_key: tuple[Any, ...] | None, values: tuple[Any, ...]) -> None:
    if passed_key is None:
        return
    with _lock:
        if len(_passed) >= _REMEMBERED:
            _passed.clear()
        _passed[passed_key] = tuple(weakref.ref(value) for value in values)


def report_arrived() -> None:
    """Runs the pending checks whose values are computed (no wait); raises the first failure."""
    if not _pending:
        return
    _run(lambda arrays: all(_ready(array) for array in arrays))


def settle() -> None:
    """Runs every pending check, waiting for its values; raises the first failure."""
    if _pending:
        _run(lambda arrays: True)


def forget_pending() -> None:
    """Drops the pending checks (a failure already being reported makes them moot)."""
    with _lock:
        _pending.clear()


def _run(due: Callable[[tuple[Any, ...]], bool]) -> None:
    with _lock:
        now = [entry for entry in _pending if due(entry[1])]
        _pending[:] = [entry for entry in _pending if not due(entry[1])]
    failure = None
    for check, arrays, call, passed_key in now:
        try:
            check(*(_read(array) for array in arrays))
        except ValueError as error:
            failure = failure or DeferredCheckError(
                f"{error} (found when its values were computed, after an earlier call"
                f"{' of ' + call if call else ''} had returned)")
        else:
            _remember_pass(passed_key, arrays)
    if failure is not None:
        raise failure


def _ready(value: Any) -> bool:
    return not isinstance(value, jax.Array) or value.is_ready()


def _host_value(value: Any) -> np.ndarray | None:
    """`value`'s numbers if they can be had without waiting on a device, else None."""
    if not isinstance(value, jax.Array):
        return np.asarray(value)
    remembered = _host_values.get(id(value))
    if remembered is not None and remembered[0]() is value:
        return remembered[1]
    on_host = all(device.platform == "cpu" for device in value.devices())
    if not (on_host and value.is_ready()):
        return None
    return _remember(value)


def _read(value: Any) -> np.ndarray:
    if not isinstance(value, jax.Array):
        return np.asarray(value)
    remembered = _host_values.get(id(value))
    if remembered is not None and remembered[0]() is value:
        return remembered[1]
    return _remember(value)


def _remember(array: jax.Array) -> np.ndarray:
    host = np.asarray(array)
    key = id(array)
    with _lock:
        if len(_host_values) >= _REMEMBERED:
            _host_values.clear()
        _host_values[key] = (weakref.ref(array, functools.partial(_forget, key)), host)
    return host


def _forget(key: int, _reference: Any) -> None:
    if _host_values is not None:  # None while the interpreter shuts down
        _host_values.pop(key, None)
