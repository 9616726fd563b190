"""Which tuning table a grouped-matmul call consults, set by `with tuning:` blocks.

The table in force is a jax configuration option that jax's trace caches key on: a function
jitted once and called under two tables is traced once for each, so no call keeps tilings
chosen under another table. Its environment variable, KERNELHUB_TUNING, may name a table file
to use everywhere (read when kernelhub is first used); kernelhub/_grouped_matmul/tables.py
(`active`) turns such a path into its table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kernelhub._core import jax_internals as _jax_internals

_OPTION = "kernelhub_tuning"
_option_state = None


def _option() -> Any:
    global _option_state
    if _option_state is None:  # made on first use: an option of jax's, with its variable
        _option_state = _jax_internals.jit_keyed_object(
            _OPTION, "kernelhub: the tuning table grouped-matmul calls use (a JSON file's path)")
    return _option_state


def define_option() -> None:
    """Makes the option without reading it (a KERNELHUB_TUNING file is loaded at its first
    lookup); kernelhub/_loader.py calls this before any trace."""
    _option()


class _Heuristic:
    """The active table inside `heuristic()`: no table at all, every choice the heuristic's."""

    def tiling_for(self, call: Any) -> None:
        del call
        return None

    def __repr__(self) -> str:
        return "kernelhub.tuning.heuristic()"


HEURISTIC = _Heuristic()


def value() -> Any:
    """The option as set here: a table, a recorder (inside autotune), HEURISTIC, a file's path
    (from KERNELHUB_TUNING), or None."""
    return _option().value


@contextlib.contextmanager
def activated(table: Any) -> Iterator[Any]:
    with _option()(table):
        yield table


def heuristic() -> contextlib.AbstractContextManager:
    """A context in which calls use neither a user's tuning nor the shipped tables: each kernel
    gets its implementation's heuristic tiling (what a call got before autotuning existed)."""
    return activated(HEURISTIC)
