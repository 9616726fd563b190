"""Every Pallas kernel the suite interprets is lowered for its chip too, once per distinct call.

The interpreters run a kernel's program on this host without the passes that lower it for its
chip: Mosaic GPU's interpreter has no layout inference and checks neither TMA's rules nor the
shared-memory limit, Pallas's Triton interpreter runs jax operations where the Triton lowering
takes only some, and Pallas's TPU interpreter skips Mosaic's block and layout rules. So a kernel
can pass every interpreted test here and still fail to lower on its chip: three such Mosaic GPU
faults were found by hand on 2026-11-29, none by a test. While a test runs, each interpreted raw
kernel call of the Mosaic GPU, Triton and Pallas TPU backends (the forward's and the weight
gradient's) is noted with its operands' shapes and dtypes and every static argument; after the
test the same call with `interpret=False` is exported for its platform, cuda or tpu, which runs
the backend's lowering from a CPU (Mosaic GPU's and Mosaic TPU's to their custom calls, with
jax.export's default checks; Triton's to Triton IR, whose custom call is not export-stable, hence
that check disabled), and a call that fails, or lowers to no kernel of its backend, fails the
test that made it. What only the chip's compiler sees (PTX, Mosaic GPU's and libtpu's own
compiles) is left to a GPU and to the TPU ahead-of-time tests (kernelhub/_verify).

Only on a CPU host: on a GPU the suites run the compiled kernels themselves. Calls with a
symbolic size (shape-polymorphic export) are not noted: they are lowered where they are made.
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
from kernelhub._core.shapes import is_static
from kernelhub._verify import cuda_lowering

# (module, raw kernel, the kernel kind kernelhub.export.kernels_by_platform counts it as, and
# the platform it is lowered for)
_KERNELS = (
    ("kernelhub._pallas.mosaic_gpu.grouped_matmul", "raw_grouped_matmul", "mosaic_gpu", "cuda"),
    ("kernelhub._pallas.mosaic_gpu.transposed_grouped_matmul", "raw_transposed_grouped_matmul",
     "mosaic_gpu", "cuda"),
    ("kernelhub._pallas.gpu.grouped_matmul", "raw_grouped_matmul", "triton", "cuda"),
    ("kernelhub._pallas.gpu.transposed_grouped_matmul", "raw_transposed_grouped_matmul",
     "triton", "cuda"),
    ("kernelhub._pallas.tpu.grouped_matmul", "grouped_matmul", "mosaic", "tpu"),
    ("kernelhub._pallas.tpu.transposed_grouped_matmul", "transposed_grouped_matmul", "mosaic",
     "tpu"),
)


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One interpreted call, as what it takes to make it again on abstract operands."""

    kernel: Callable[..., Any]
    kind: str  # "mosaic_gpu", "triton" or "mosaic" (TPU)
    platform: str  # "cuda" or "tpu"
    structure: Any  # the treedef of (args, kwargs)
    leaves: tuple  # a jax.ShapeDtypeStruct for each array, the value itself for the rest
    x64: bool

    def describe(self) -> str:
        shown = [_Shown(f"{leaf.dtype}{list(leaf.shape)}") if _is_spec(leaf) else leaf
                 for leaf in self.leaves]
        args, kwargs = jax.tree.unflatten(self.structure, shown)
        listed = [*map(repr, args), *(f"{name}={value!r}" for name, value in kwargs.items())]
        return f"{self.kind} {self.kernel.__name__}({', '.join(listed)})"

    def export(self) -> jax.export.Exported:
        arrays = [leaf for leaf in self.leaves if _is_spec(leaf)]

        def compiled(*operands):
            given = iter(operands)
            leaves = [next(given) if _is_spec(leaf) else leaf for leaf in self.leaves]
            args, kwargs = jax.tree.unflatten(self.structure, leaves)
            return self.kernel(*args, **kwargs, interpret=False)

        # lowering_for: as kernelhub's own calls lower for the platform (jax 0.11's Triton
        # lowering asks the host which GPU it compiles for).
        with jax.enable_x64(self.x64), jax_internals.lowering_for(self.platform):
            if self.kind == "triton":
                return cuda_lowering.export_for_cuda(compiled, arrays)
            return jax.export.export(jax.jit(compiled), platforms=[self.platform])(*arrays)


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
        self.lowered = 0  # calls lowered to a kernel of their backend

    def note(self, call: KernelCall) -> None:
        key = (call.kind, call.kernel.__name__, call.structure, tuple(
            (leaf.shape, str(leaf.dtype)) if _is_spec(leaf) else repr(leaf)
            for leaf in call.leaves), call.x64)
        with self._lock:
            if key not in self._seen:
                self._seen.add(key)
                self._pending.append(call)

    def lower(self) -> list[str]:
        """Exports each call noted since the last time for its platform; what failed, described."""
        with self._lock:
            pending, self._pending = self._pending, []
        failures = []
        for call in pending:
            try:
                exported = call.export()
            except Exception as error:  # noqa: BLE001  (each failure is reported, with its call)
                failures.append(f"{call.describe()}: {type(error).__name__}: {error}")
                continue
            if not kernelhub.export.kernels_by_platform(exported)[call.platform].get(call.kind):
                failures.append(f"{call.describe()}: lowered with no {call.kind} kernel")
            else:
                self.lowered += 1
        return failures


TWINS = Twins()


def _noting(kernel: Callable[..., Any], kind: str, platform: str) -> Callable[..., Any]:
    @functools.wraps(kernel)
    def noted(*args, interpret: Any = False, **kwargs):
        out = kernel(*args, interpret=interpret, **kwargs)
        # Noted once it ran (a call refused before it runs has no twin to lower); interpret is
        # True or the interpreter's parameters (the TPU one's InterpretParams).
        if interpret is not False:
            leaves, structure = jax.tree.flatten((args, kwargs))
            abstract = tuple(map(_abstract, leaves))
            if all(is_static(size) for leaf in abstract if _is_spec(leaf) for size in leaf.shape):
                TWINS.note(KernelCall(kernel, kind, platform, structure, abstract,
                                      bool(jax.config.jax_enable_x64)))
        return out

    return noted


def install() -> None:
    """Wraps the raw kernels where each backend's registration looks them up at each call."""
    import importlib

    for module_name, name, kind, platform in _KERNELS:
        module = importlib.import_module(module_name)
        setattr(module, name, _noting(getattr(module, name), kind, platform))


def lowered_for_a_forward_with_gradients(platform: str) -> tuple[int, list[str]]:
    """For the twins' own tests: a small gmm forward with both gradients on `platform`'s
    interpreted kernels, called twice; how many distinct calls that lowered, and what failed."""
    import jax.numpy as jnp

    TWINS.lower()  # whatever the test's setup noted: not what this counts
    before = TWINS.lowered
    rng = np.random.default_rng(7)
    lhs = jnp.asarray(rng.standard_normal((37, 24)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((3, 24, 10)), jnp.bfloat16)
    sizes = jnp.asarray([13, 0, 22], jnp.int32)
    gmm = kernelhub.get("grouped_matmul", platform=platform)

    for _ in range(2):  # two programs making the same calls: lowered once
        def forward_and_gradients(lhs, rhs):
            out, pullback = jax.vjp(
                lambda l, r: gmm(l, r, sizes, preferred_element_type=jnp.float32), lhs, rhs)
            return out, pullback(jnp.ones_like(out))

        jax.jit(forward_and_gradients)(lhs, rhs)
    failures = TWINS.lower()
    return TWINS.lowered - before, failures
