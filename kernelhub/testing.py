"""Checking that every implementation of an op agrees with a reference: "every backend agrees".

    from kernelhub import testing

    report = testing.check_implementations(
        swiglu,                                  # the op (its entry point or name)
        reference=lambda gate, up: gate / (1 + np.exp(-gate)) * up,   # float64 inputs
        problems=lambda rng: testing.Case(rng.normal(size=(8, 16)), rng.normal(size=(8, 16))),
    )
    report.assert_ok()                           # or print(report)

Every implementation that can run on this machine is called (the interpret-mode kernels
included): forward as a user calls it, and, for ops with floating inputs, through `jax.vjp` and
its pullback under one `jax.jit`; each result is compared with the reference computed in
float64 on the same inputs. The report gives, per implementation, the worst error of each
output and gradient next to the tolerance of its dtype.

The error of a result `a` against the reference `e` is max |a - e| / (|e| + rms(e)): relative
where values are large, and relative to the result's typical size where they are near 0, so
that the rounding of a long sum passes and a wrong row, group or sign does not. A NaN or Inf
must appear where the reference has it; integer results must be equal.

Needs no pytest; hypothesis only when `problems` is a hypothesis strategy.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernelhub import _loader
from kernelhub._core import dispatch as _dispatch
from kernelhub._core import registry as _registry
from kernelhub._core.registry import Backend, KernelSpec

__all__ = [
    "Case", "Report", "check_implementations", "default_tolerance", "relative_error",
    "runnable_implementations",
]

# Interpret-mode kernels emulate every grid step in Python: they get fewer drawn problems.
DEFAULT_EXAMPLES = 20
DEFAULT_INTERPRET_EXAMPLES = 5


class Case:
    """One problem: the arguments of one call of the op, as a user would pass them."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.args = args
        self.kwargs = kwargs
        self.label = ""

    def named(self, label: str) -> Case:
        """This case, shown as `label` in reports (say, how to draw it again)."""
        self.label = label
        return self

    def __repr__(self) -> str:
        if self.label:
            return self.label
        parts = [_describe(a) for a in self.args] + [f"{k}={_describe(v)}" for k, v in self.kwargs.items()]
        return f"Case({', '.join(parts)})"


def _describe(value: Any) -> str:
    if isinstance(value, (jax.Array, np.ndarray)):
        if value.size <= 16 and np.issubdtype(value.dtype, np.integer):
            return f"{value.dtype}{list(np.asarray(value).tolist())}"
        return f"{value.dtype}{list(value.shape)}"
    return repr(value)


def runnable_implementations(op: Any) -> list[KernelSpec]:
    """Every implementation of `op` that can run on this machine's default backend, the
    interpret-mode ones included."""
    _loader.load()
    here = _dispatch.running_backend()
    return [spec for spec in _registry.implementations(op)
            if spec.backend in (here, Backend.ANY) and spec.available]


# float32 on an NVIDIA GPU: 8 TF32 epsilons (default_tolerance says why).
TF32_TOLERANCE = 2.0**-7


def default_tolerance(dtype: Any) -> float:
    """The error allowed for a result of `dtype` (see the module docstring for the measure).

    16-bit floats: two roundings' worth (2 eps). float32: 2e-5, or 2**-7 (7.8e-3) on an NVIDIA
    GPU, whose float32 dots default to TF32: 10 stored mantissa bits, so each product carries
    up to 2**-10 of input rounding, and the worst element of a sum that partly cancels reached
    3.2e-3 on an H100 (2026-11-25). float64: 1e-12.
    """
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return 0.0
    eps = float(jnp.finfo(dtype).eps)
    if eps > 1e-6:
        return 2 * eps
    if eps < 1e-12:
        return 1e-12
    return TF32_TOLERANCE if jax.default_backend() == "gpu" else 2e-5


def relative_error(actual: Any, expected: Any) -> float:
    """max |a - e| / (|e| + rms(e)); inf where a NaN, an Inf or an integer does not match."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return math.inf
    if not jnp.issubdtype(e.dtype, jnp.inexact) and not jnp.issubdtype(a.dtype, jnp.inexact):
        return 0.0 if np.array_equal(a, e) else math.inf
    a, e = a.astype(np.float64), e.astype(np.float64)
    finite = np.isfinite(e)
    if not np.array_equal(np.where(finite, 0.0, a), np.where(finite, 0.0, e), equal_nan=True):
        return math.inf  # a NaN or Inf of the reference's missing, or in the wrong place
    if not np.isfinite(a[finite]).all():
        return math.inf
    if not finite.any():
        return 0.0
    scale = float(np.sqrt(np.mean(e[finite] ** 2))) or 1.0
    return float(np.max(np.abs(a[finite] - e[finite]) / (np.abs(e[finite]) + scale)))


@dataclasses.dataclass
class Result:
    """The worst error of one quantity (an output, or the gradient of one argument)."""

    quantity: str
    worst_error: float = 0.0
    tolerance: float = 0.0
    worst_case: str = ""

    @property
    def ok(self) -> bool:
        return self.worst_error <= self.tolerance

    def add(self, error: float, tolerance: float, case: str) -> None:
        # Keep the case that uses the largest share of its own tolerance.
        share = error / tolerance if tolerance else (0.0 if error == 0 else math.inf)
        current = (self.worst_error / self.tolerance if self.tolerance else
                   (0.0 if self.worst_error == 0 else math.inf))
        if not self.worst_case or share > current:
            self.worst_error, self.tolerance, self.worst_case = error, tolerance, case


@dataclasses.dataclass
class ImplementationReport:
    spec: KernelSpec
    cases: int = 0
    results: dict[str, Result] = dataclasses.field(default_factory=dict)
    failures: list[str] = dataclasses.field(default_factory=list)  # exceptions, failed checks

    @property
    def name(self) -> str:
        return f"{self.spec.platform.value}/{self.spec.backend.value}" + (
            " (interpret)" if self.spec.interpret_only else "")

    @property
    def ok(self) -> bool:
        return (self.cases > 0 and not self.failures
                and all(r.ok for r in self.results.values()))

    def record(self, quantity: str, error: float, tolerance: float, case: str) -> None:
        self.results.setdefault(quantity, Result(quantity)).add(error, tolerance, case)


@dataclasses.dataclass
class Report:
    """Per implementation: how many cases ran, each quantity's worst error, and what failed."""

    op: str
    implementations: list[ImplementationReport]

    @property
    def ok(self) -> bool:
        return bool(self.implementations) and all(i.ok for i in self.implementations)

    def assert_ok(self) -> None:
        """Raises AssertionError with the whole report when an implementation disagrees."""
        if not self.implementations:
            raise AssertionError(f"no implementation of {self.op} can run here")
        if not self.ok:
            raise AssertionError(f"implementations of {self.op} disagree with the reference\n{self}")

    def __str__(self) -> str:
        from rich.console import Console  # noqa: PLC0415  (only when printed)
        from rich.table import Table  # noqa: PLC0415

        table = Table(title=f"{self.op} against its reference")
        for column in ("implementation", "cases", "result", "worst error", "tolerance", "ok"):
            table.add_column(column)
        for impl in self.implementations:
            for result in impl.results.values():
                table.add_row(impl.name, str(impl.cases), result.quantity,
                              f"{result.worst_error:.2e}", f"{result.tolerance:.1e}",
                              "yes" if result.ok else f"NO: {result.worst_case}")
            for failure in impl.failures:
                table.add_row(impl.name, str(impl.cases), "failure", "", "", failure)
            if not impl.cases:
                table.add_row(impl.name, "0", "-", "", "", "NO: no case ran")
        console = Console(width=160, record=True, file=_Discard())
        console.print(table)
        return console.export_text()


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


Problems = Iterable[Case] | Callable[[np.random.Generator], Case] | Any  # or a hypothesis strategy
Tolerance = Callable[[Any], float] | Mapping[Any, float]


def check_implementations(
    op: Any,
    reference: Callable[..., Any],
    problems: Problems,
    *,
    reference_vjp: Callable[..., Mapping[str, Any]] | None = None,
    gradients: bool = True,
    check: Callable[[dict[str, Any], Any], None] | None = None,
    implementations: Sequence[KernelSpec] | None = None,
    examples: int | Callable[[KernelSpec], int] | None = None,
    tolerance: Tolerance | None = None,
    seed: int = 0,
) -> Report:
    """Runs every implementation of `op` on `problems` and compares it with `reference`.

    Args:
      op: the op, as its name or the entry point `kernelhub.define_op` returned.
      reference: called with every argument of the op by keyword (defaults filled in; floating
        arrays as float64 numpy arrays, integer ones as numpy arrays) and returns what the op
        returns (same tree of arrays), computed independently: loops, numpy, a dense jnp form.
      problems: the cases. A list (or other iterable) of `Case`, each run on every
        implementation; a function `rng -> Case`, called `examples` times per implementation
        with a seeded numpy Generator; or a hypothesis strategy of `Case`.
      reference_vjp: `reference_vjp(cotangent, /, **arguments) -> {name: gradient}` for the
        floating array arguments, in float64. When None, the reference is differentiated with
        jax in float64 (it must then be written with jax.numpy): jitted, or op by op when it
        reads a value on the host.
      gradients: whether to check `jax.vjp` too (for ops with floating array arguments).
      check: called as `check(arguments, output)` on every forward result, for properties
        beyond closeness (exact zeros, dtypes); an AssertionError it raises is a failure.
      implementations: those to run; every one runnable here by default.
      examples: drawn cases per implementation, for functions and strategies (default 20,
        5 for interpret-mode kernels), or a function of the KernelSpec giving it.
      tolerance: the allowed error for a result's dtype: a function or a dict from dtype
        (default `default_tolerance`).
      seed: seeds drawn cases and the output cotangents.

    Returns:
      A Report; `report.assert_ok()` raises with the table when anything disagrees.
    """
    _loader.load()
    definition = _registry.op_definition(op)
    specs = list(runnable_implementations(definition.name) if implementations is None else implementations)
    allowed = _tolerance_function(tolerance)
    fixed_cases = _fixed_cases(problems)
    reports = []
    for spec in specs:
        report = ImplementationReport(spec)
        pinned = _dispatch.Pinned(spec)

        def run(case: Case, index: int, report=report, pinned=pinned) -> None:
            report.cases += 1
            try:
                _check_case(definition, pinned, case, index, report, reference, reference_vjp,
                            gradients, check, allowed, seed)
            except Exception as error:  # noqa: BLE001  (reported per implementation, not raised)
                report.failures.append(f"{case!r}: {type(error).__name__}: {error}")

        if fixed_cases is not None:
            for index, case in enumerate(fixed_cases):
                run(case, index)
        else:
            count = _examples(examples, spec)
            _draw(problems, count, seed, run)
        reports.append(report)
    return Report(definition.name, reports)


def _tolerance_function(tolerance: Tolerance | None) -> Callable[[Any], float]:
    if tolerance is None:
        return default_tolerance
    if callable(tolerance):
        return tolerance
    table = {jnp.dtype(k): float(v) for k, v in tolerance.items()}
    return lambda dtype: table.get(jnp.dtype(dtype), default_tolerance(dtype))


def _fixed_cases(problems: Problems) -> list[Case] | None:
    if callable(problems) or _is_strategy(problems):
        return None
    cases = list(problems)
    for case in cases:
        if not isinstance(case, Case):
            raise TypeError(f"problems must hold kernelhub.testing.Case values, got {type(case).__name__}")
    return cases


def _is_strategy(value: Any) -> bool:
    try:
        from hypothesis.strategies import SearchStrategy  # noqa: PLC0415
    except ImportError:
        return False
    return isinstance(value, SearchStrategy)


def _examples(examples: int | Callable[[KernelSpec], int] | None, spec: KernelSpec) -> int:
    if examples is None:
        return DEFAULT_INTERPRET_EXAMPLES if spec.interpret_only else DEFAULT_EXAMPLES
    return int(examples(spec) if callable(examples) else examples)


def _draw(problems: Problems, count: int, seed: int, run: Callable[[Case, int], None]) -> None:
    if not _is_strategy(problems):
        for index in range(count):
            run(problems(np.random.default_rng([seed, index])), index)
        return
    from hypothesis import HealthCheck, given, settings  # noqa: PLC0415

    counter = itertools.count()

    @settings(max_examples=count, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(problems)
    def draw(case: Case) -> None:
        run(case, next(counter))

    draw()


def _float_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray)) and jnp.issubdtype(value.dtype, jnp.inexact)


def _in_float64(value: Any) -> Any:
    if _float_array(value):
        return np.asarray(value).astype(np.float64)
    if isinstance(value, (jax.Array, np.ndarray)):
        return np.asarray(value)
    return value


def _check_case(definition, pinned, case: Case, index: int, report: ImplementationReport,
                reference, reference_vjp, gradients: bool, check, allowed, seed: int) -> None:
    try:
        bound = definition.signature.bind(*case.args, **case.kwargs)
    except TypeError as error:
        raise TypeError(f"the case does not fit the signature of {definition.name}: {error}") from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    reference_arguments = {name: _in_float64(value) for name, value in arguments.items()}
    label = repr(case)

    output = pinned(**arguments)
    with jax.enable_x64(True):  # a jax.numpy reference computes in float64 too
        expected = jax.tree.map(np.asarray, reference(**reference_arguments))
    _compare(report, "output", output, expected, allowed, label)
    if check is not None:
        check(arguments, output)

    differentiable = [name for name, value in arguments.items() if _float_array(value)]
    if not gradients or not differentiable:
        return

    rng = np.random.default_rng([seed, index, 1])
    cotangent = jax.tree.map(lambda leaf: _cotangent_like(leaf, rng), output)  # the forward's tree
    grads = dict(zip(differentiable,
                     _pullback_of(pinned.resolve(), arguments, differentiable, cotangent)))
    for name in differentiable:
        if grads[name].dtype != jnp.asarray(arguments[name]).dtype:
            raise TypeError(f"the gradient of {name} has dtype {grads[name].dtype}, the "
                            f"argument's is {jnp.asarray(arguments[name]).dtype}")
    cotangent64 = jax.tree.map(_in_float64, cotangent)
    if reference_vjp is not None:
        with jax.enable_x64(True):
            want = reference_vjp(cotangent64, **reference_arguments)
    else:
        want = _differentiated_reference(reference, reference_arguments, differentiable, cotangent64)
    for name in differentiable:
        if want.get(name) is not None:
            _compare(report, f"gradient of {name}", grads[name], want[name], allowed, label)


def _cotangent_like(leaf: jax.Array, rng: np.random.Generator) -> jax.Array:
    if not jnp.issubdtype(leaf.dtype, jnp.inexact):
        return np.zeros(leaf.shape, jax.dtypes.float0)
    return jnp.asarray(rng.standard_normal(leaf.shape), leaf.dtype)


def _pullback_of(spec: KernelSpec, arguments: dict[str, Any], differentiable: list[str],
                 cotangent: Any) -> tuple:
    """jax.vjp of the pinned implementation with respect to the `differentiable` arguments,
    pulled back from `cotangent`, as one jitted program: one compilation, where running them
    eagerly compiles the forward with its residuals and the backward apart. Cases of the same
    shapes and static arguments share it."""
    leaves, structure = jax.tree.flatten(cotangent)
    # float0 leaves (integer outputs) are no jit arguments: made inside from their shapes.
    float0_shapes = tuple(leaf.shape if leaf.dtype == jax.dtypes.float0 else None
                          for leaf in leaves)
    given = [leaf for leaf, shape in zip(leaves, float0_shapes) if shape is None]
    primals = [jnp.asarray(arguments[name]) for name in differentiable]
    # jax arrays are traced; anything else (numpy arrays included) is a constant of the program.
    arrays = {name: value for name, value in arguments.items()
              if name not in differentiable and isinstance(value, jax.Array)}
    statics = tuple((name, value) for name, value in arguments.items()
                    if name not in differentiable and name not in arrays)
    layout = dict(spec=spec, names=tuple(differentiable), structure=structure,
                  float0_shapes=float0_shapes)
    try:
        hash(statics)
    except TypeError:  # an unhashable constant (a numpy array): a program for this case alone
        return jax.jit(functools.partial(_pullback, statics=statics, **layout))(
            primals, arrays, given)
    return _shared_pullback(primals, arrays, given, statics=statics, **layout)


def _pullback(primals, arrays, given, *, spec, names, structure, float0_shapes, statics):
    pinned = _dispatch.Pinned(spec)

    def of(*values):
        return pinned(**dict(statics), **arrays, **dict(zip(names, values)))

    supplied = iter(given)
    leaves = [next(supplied) if shape is None else np.zeros(shape, jax.dtypes.float0)
              for shape in float0_shapes]
    return jax.vjp(of, *primals)[1](jax.tree.unflatten(structure, leaves))


_shared_pullback = jax.jit(
    _pullback, static_argnames=("spec", "names", "structure", "float0_shapes", "statics"))


def _differentiated_reference(reference, arguments: dict[str, Any], differentiable: list[str],
                              cotangent: Any) -> dict[str, Any]:
    with jax.enable_x64(True):
        def of(*values):
            return reference(**{**arguments, **{n: v for n, v in zip(differentiable, values)}})

        primals = [jnp.asarray(arguments[n]) for n in differentiable]
        try:
            try:
                # Jitted: one compilation of the reference and one of its pullback, not one
                # per operation. A reference that reads on the host a value it computed with
                # jax from its other arguments (int(jnp.sum(sizes))) cannot be jitted; op by
                # op those values are concrete.
                _, pullback = jax.vjp(jax.jit(of), *primals)
            except jax.errors.ConcretizationTypeError:
                _, pullback = jax.vjp(of, *primals)
        except (TypeError, jax.errors.TracerArrayConversionError) as error:
            raise TypeError(
                "the reference cannot be differentiated by jax (write it with jax.numpy, or pass "
                f"reference_vjp, or gradients=False): {error}") from None
        cotangent = jax.tree.map(lambda c: c if c.dtype == jax.dtypes.float0 else jnp.asarray(c), cotangent)
        return {n: np.asarray(g) for n, g in zip(differentiable, pullback(cotangent))}


def _compare(report: ImplementationReport, quantity: str, actual: Any, expected: Any,
             allowed: Callable[[Any], float], label: str) -> None:
    got, want = jax.tree.leaves(actual), jax.tree.leaves(expected)
    if len(got) != len(want):
        raise ValueError(f"{quantity}: the implementation returned {len(got)} arrays, the "
                         f"reference {len(want)}")
    for position, (a, e) in enumerate(zip(got, want)):
        name = quantity if len(got) == 1 else f"{quantity} {position}"
        if np.shape(a) != np.shape(e):
            raise ValueError(f"{name}: shape {np.shape(a)}, the reference's is {np.shape(e)}")
        report.record(name, relative_error(a, e), allowed(jnp.asarray(a).dtype), label)

