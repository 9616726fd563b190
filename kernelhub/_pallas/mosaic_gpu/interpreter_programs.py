"""Compiled programs of jax's Mosaic GPU interpreter, shared between kernels that trace alike.

An interpreted kernel is a program of its own on XLA:CPU (kernel_parts.launch runs it from a
host call): about half a second to compile, and its code stays mapped while the call's
executable holds it. launch builds a new kernel function each time a call is traced, and one
call is traced several times: the VJP traces the forward again, and shapes that pad to the same
tiles give the same kernel. Each trace compiled the same program again (test_mosaic_gpu: 110
compiles, 55 of them distinct), and kept it as long as its call's executable lived.

Programs are shared by the text of their jaxpr: every operation, parameter, literal and
operand type the program runs. What the text does not show are Python functions in
parameters (jax prints their address masked): only a host callback runs one, so a program
holding a callback is never shared. The map holds programs weakly: sharing never keeps a
program alive longer than the executables that run it (jax.clear_caches frees them all).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

_PROGRAMS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def compiled(kernel: Callable[..., Any], arrays: Sequence[np.ndarray]) -> Callable[..., Any]:
    """`kernel` compiled for the shapes and dtypes of `arrays`: the program of a kernel of the
    same jaxpr while one is alive, else a new one. The caller keeps it alive."""
    traced = jax.jit(kernel).trace(*arrays)
    with np.printoptions(threshold=sys.maxsize):  # an array parameter printed whole
        key = str(traced.jaxpr)
    if "callback" in key:
        return traced.lower().compile()
    with _LOCK:
        program = _PROGRAMS.get(key)
    if program is None:
        program = traced.lower().compile()
        with _LOCK:
            program = _PROGRAMS.setdefault(key, program)
    return program
