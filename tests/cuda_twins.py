"""Every GPU kernel the suite interprets is lowered for cuda too, once per distinct call.

The interpreters run a kernel's program on this host without the passes that lower it for a
GPU: Mosaic GPU's interpreter has no layout inference and checks neither TMA's rules nor the
shared-memory limit, and Pallas's Triton interpreter runs jax operations where the Triton
lowering takes only some. So a kernel can pass every interpreted test here and still fail to
lower on an H100: three such Mosaic GPU faults were found by hand on 2026-11-29, none by a test.
While a test runs, each interpreted raw kernel call of the Mosaic GPU and Triton backends (the
forward's and the weight gradient's) is noted with its operands' shapes and dtypes and every
static argument; after the test the same call with `interpret=False` is exported for cuda, which
runs the backend's whole lowering from a CPU (Mosaic GPU's to its custom call, with jax.export's
default checks; Triton's to Triton IR, whose custom call is not export-stable, hence that check
disabled), and a call that fails, or lowers to no kernel of its backend, fails the test that
made it. (Only a GPU compiles the lowered kernels: PTX, and Mosaic GPU's own at jax's compile.)

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
from kernelhub._core import jax_internals
from kernelhub._verify import cuda_lowering

# (module, raw kernel, the kernel kind kernelhub.export.kernels_by_platform counts it as)
_KERNELS = (("kernelhub._pallas.mosaic_gpu.grouped_matmul", "raw_grouped_matmul", "mosaic_gpu"),
            ("kernelhub._pallas.mosaic_gpu.transposed_grouped_matmul",
             "raw_transposed_grouped_matmul", "mosaic_gpu"),
            ("kernelhub._pallas.gpu.grouped_matmul", "raw_grouped_matmul", "triton"),
            ("kernelhub._pallas.gpu.transposed_grouped_matmul", "raw_transposed_grouped_matmul",
             "triton"))


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One interpreted call, as what it takes to make it again on abstract operands."""

    kernel: Callable[..., Any]
    kind: str  # "mosaic_gpu" or "triton"
    structure: Any  # the treedef of (args, kwargs)
    leaves: tuple  # a jax.ShapeDtypeStruct for each array, the value itself for the rest
    x64: bool

    def describe(self) -> str:
        shown = [_Shown(f"{leaf.dtype}{list(leaf.shape)}") if _is_spec(leaf) else leaf
                 for leaf in self.leaves]
        args, kwargs = jax.tree.unflatten(self.structure, shown)
        listed = [*map(repr, args), *(f"{name}={value!r}" for name, value in kwargs.items())]
        return f"{self.kind} {self.kernel.__name__}({', '.join(listed)})"

    def export_for_cuda(self) -> jax.export.Exported:
        arrays = [leaf for leaf in self.leaves if _is_spec(leaf)]

        def compiled(*operands):
            given = iter(operands)
            leaves = [next(given) if _is_spec(leaf) else leaf for leaf in self.leaves]
            args, kwargs = jax.tree.unflatten(self.structure, leaves)
            return self.kernel(*args, **kwargs, interpret=False)

        # lowering_for: as kernelhub's own calls lower for cuda (jax 0.11's Triton lowering
        # asks the host which GPU it compiles for).
        with jax.enable_x64(self.x64), jax_internals.lowering_for("cuda"):
            if self.kind == "triton":
                return cuda_lowering.export_for_cuda(compiled, arrays)
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
        key = (call.kind, call.kernel.__name__, call.structure, tuple(
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
            if not kernelhub.export.kernels_by_platform(exported)["cuda"].get(call.kind):
                failures.append(f"{call.describe()}: lowered with no {call.kind} kernel")
            self.lowered += 1
        return failures


TWINS = Twins()


def _noting(kernel: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(kernel)
    def noted(*args, interpret: bool = False, **kwargs):
        out = kernel(*args, interpret=interpret, **kwargs)
        if interpret:  # noted once it ran: a call refused before it runs has no twin to lower
            leaves, structure = jax.tree.flatten((args, kwargs))
            TWINS.note(KernelCall(kernel, kind, structure, tuple(map(_abstract, leaves)),
                                  bool(jax.config.jax_enable_x64)))
        return out

    return noted


def install() -> None:
    """Wraps the raw kernels where the backend's registration looks them up at each call."""
    import importlib

    for module_name, name, kind in _KERNELS:
        module = importlib.import_module(module_name)
        setattr(module, name, _noting(getattr(module, name), kind))
