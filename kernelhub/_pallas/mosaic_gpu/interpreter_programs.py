"""Compiled programs of jax's Mosaic GPU interpreter, shared between kernels that trace alike.

An interpreted kernel is a program of its own on XLA:CPU (kernel_parts.launch runs it from a
host call): about half a second to compile, and its code stays mapped while anything holds it.
launch builds a new kernel function each time a call is traced, and one call is traced several
times: the VJP traces the forward again, and shapes that pad to the same tiles give the same
kernel. Each trace compiled the same program again (test_mosaic_gpu: 110 compiles, 55 of them
distinct), and a process interpreting many shapes kept every copy: about 500 memory maps a
case, so the kernelhub.testing harness on a few hundred drawn cases ran out of the kernel's
65,530 and XLA crashed.

Programs are shared by the text of their jaxpr: every operation, parameter, literal and
operand type the program runs. What the text does not show are Python functions in
parameters (jax prints their address masked): only a host callback runs one, so a program
holding a callback is never shared.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

# Programs kept: a shape's kernels and their gradients' (a handful) many times over.
CAPACITY = 64

_PROGRAMS: collections.OrderedDict[str, Callable[..., Any]] = collections.OrderedDict()
_LOCK = threading.Lock()


def compiled(kernel: Callable[..., Any], arrays: Sequence[np.ndarray]) -> Callable[..., Any]:
    """`kernel` compiled for the shapes and dtypes of `arrays`: a program compiled before for
    a kernel of the same jaxpr, or a new one, kept for the next (the least recently used of
    more than CAPACITY dropped)."""
    traced = jax.jit(kernel).trace(*arrays)
    with np.printoptions(threshold=sys.maxsize):  # an array parameter printed whole
        key = str(traced.jaxpr)
    if "callback" in key:
        return traced.lower().compile()
    with _LOCK:
        program = _PROGRAMS.get(key)
        if program is not None:
            _PROGRAMS.move_to_end(key)
            return program
    program = traced.lower().compile()
    with _LOCK:
        _PROGRAMS[key] = program
        while len(_PROGRAMS) > CAPACITY:
            _PROGRAMS.popitem(last=False)
    return program
