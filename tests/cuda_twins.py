"""Every Mosaic GPU kernel the suite interprets is lowered for cuda too, once per distinct call.

Mosaic GPU's interpreter runs a kernel's program on this host without the passes that lower it
for a GPU (layout inference, TMA's rules, the shared-memory limit), so a kernel can pass every
interpreted test here and still fail to lower on an H100: three such faults were found by hand
on 2026-11-29, none by a test. While a test runs, each interpreted raw kernel call (the forward
and the weight gradient's) is noted with its operands' shapes and dtypes and every static
argument; after the test the same call with `interpret=False` is exported for cuda, which runs
all of Mosaic GPU's lowering from a CPU, and a failure fails the test that made the call.

Only on a CPU host: on a GPU the suites run the compiled kernels themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import kernelhub.export

_KERNELS = (("kernelhub._pallas.mosaic_gpu.grouped_matmul", "raw_grouped_matmul"),
            ("kernelhub._pallas.mosaic_gpu.transposed_grouped_matmul",
             "raw_transposed_grouped_matmul"))


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One interpreted call, as what it takes to make it again on abstract operands."""

    kernel: Callable[..., Any]
    structure: Any  # the treedef of (args, kwargs)
    leaves: tuple  # a jax.ShapeDtypeStruct for each array, the value itself for the rest
    x64: bool

    def describe(self) -> str:
        shown = [_Shown(f"{leaf.dtype}{list(leaf.shape)}") if _is_spec(leaf) else leaf
                 for leaf in self.leaves]
        args, kwargs = jax.tree.unflatten(self.structure, shown)
        listed = [*map(repr, args), *(f"{name}={value!r}" for name, value in kwargs.items())]
        return f"{self.kernel.__name__}({', '.join(listed)})"

    def export_for_cuda(self) -> jax.export.Exported:
        arrays = [leaf for leaf in self.leaves if _is_spec(leaf)]

        def compiled(*operands):
            given = iter(operands)
            leaves = [next(given) if _is_spec(leaf) else leaf for leaf in self.leaves]
            args, kwargs = jax.tree.unflatten(self.structure, leaves)
            return self.kernel(*args, **kwargs, interpret=False)

        with jax.enable_x64(self.x64):
            return jax.export.export(jax.jit(compiled), platforms=["cuda"])(*arrays)


class _Shown(str):
    """An operand in a described call: its dtype and shape, unquoted inside containers."""

    def __repr__(self) -> str:
        return str(self)


def _is_spec(leaf: Any) -> bool:
    return isinstance(leaf, jax.ShapeDtypeStruct)


def _abstract(leaf: Any) -> Any:
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):  # tracers are jax.Arrays too
        return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype)
    return leaf


class Twins:
    """The interpreted calls noted since the last `lower`, and the keys of every call seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # tests that start threads make interpreted calls too
        self._seen: set = set()
        self._pending: list[KernelCall] = []
        self.lowered = 0

    def note(self, call: KernelCall) -> None:
        key = (call.kernel.__name__, call.structure, tuple(
            (leaf.shape, str(leaf.dtype)) if _is_spec(leaf) else repr(leaf)
            for leaf in call.leaves), call.x64)
        with self._lock:
            if key not in self._seen:
                self._seen.add(key)
                self._pending.append(call)

    def lower(self) -> list[str]:
        """Exports each call noted since the last time for cuda; what failed, described."""
        with self._lock:
            pending, self._pending = self._pending, []
        failures = []
        for call in pending:
            try:
                exported = call.export_for_cuda()
            except Exception as error:  # noqa: BLE001  (each failure is reported, with its call)
                failures.append(f"{call.describe()}: {type(error).__name__}: {error}")
                continue
            if not kernelhub.export.kernels_by_platform(exported)["cuda"].get("mosaic_gpu"):
                failures.append(f"{call.describe()}: lowered with no Mosaic GPU kernel")
            self.lowered += 1
        return failures


TWINS = Twins()


def _noting(kernel: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(kernel)
    def noted(*args, interpret: bool = False, **kwargs):
        out = kernel(*args, interpret=interpret, **kwargs)
        if interpret:  # noted once it ran: a call refused before it runs has no twin to lower
            leaves, structure = jax.tree.flatten((args, kwargs))
            TWINS.note(KernelCall(kernel, structure, tuple(map(_abstract, leaves)),
                                  bool(jax.config.jax_enable_x64)))
        return out

    return noted


def install() -> None:
    """Wraps the raw kernels where the backend's registration looks them up at each call."""
    import importlib

    for module_name, name in _KERNELS:
        module = importlib.import_module(module_name)
        setattr(module, name, _noting(getattr(module, name)))
