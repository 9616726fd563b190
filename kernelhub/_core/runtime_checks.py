"""The opt-in runtime checks of values that are not known when a call is traced.

An eager call checks its arguments' values without waiting on a device
(kernelhub/_core/value_checks.py). Under `jit` they are not known while tracing; with this
switch on, an op's `runtime_check` gives the traced call a host callback that checks them when
the computation runs (for the grouped matmuls: group sizes and offsets). It costs a
device-to-host copy per call, which is why it is off by default. With it off, kernels must stay
in bounds whatever the values (the grouped matmuls clamp every index), and bad values give
unspecified results.

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
import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax

from kernelhub._core import jax_internals as _jax_internals
from kernelhub._core import value_checks

RUNTIME_CHECKS_VARIABLE = "KERNELHUB_RUNTIME_CHECKS"
_OPTION = RUNTIME_CHECKS_VARIABLE.lower()  # jax reads the variable of its upper-case name
_switch = None


class RuntimeCheckError(ValueError):
    """Argument values that break an op's contract (group sizes, say), found while it ran."""


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
    """Turns the runtime checks (of group sizes, say) on (or off) for every call in the block; a
    check that fails raises RuntimeCheckError by the end of the block. The block's end also
    settles the value checks of eager calls still waiting for their values (value_checks)."""
    with _option()(bool(enable)):
        try:
            yield
            if enable:
                jax.effects_barrier()  # let the checks of calls still running report
        except jax.errors.JaxRuntimeError as error:
            value_checks.forget_pending()  # one failure is reported: this one
            problem = problem_in(error)
            if problem is None:
                raise
            raise RuntimeCheckError(problem) from error
        except BaseException:
            value_checks.forget_pending()
            raise
        if enable:
            value_checks.settle()


def problem_in(error: BaseException) -> str | None:
    """The message of a failed runtime check inside jax's error report, if it holds one."""
    marker = f"{RuntimeCheckError.__name__}: "
    lines = [line for line in str(error).splitlines() if marker in line]
    return lines[-1].split(marker, 1)[1].strip() if lines else None


def host_check(check: Callable[..., None], *arrays: Any) -> None:
    """Runs `check(*host arrays)` when the computation runs (a RuntimeCheckError it raises
    surfaces from the call); for an op's `runtime_check` (see kernelhub.define_op)."""
    _quiet_failed_checks()
    jax.debug.callback(check, *arrays, ordered=False)


class _FailedCheckFilter(logging.Filter):
    """Drops jax's log of a failed callback when the failure is a RuntimeCheckError: the error
    itself reaches the caller, in one clean line, and a traceback on stderr besides is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, RuntimeCheckError)


_filter = _FailedCheckFilter()


def _quiet_failed_checks() -> None:
    logger = logging.getLogger("jax._src.debugging")
    if _filter not in logger.filters:
        logger.addFilter(_filter)
