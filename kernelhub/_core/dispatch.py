"""Selecting an implementation: forced, or one per target at lowering time.

Order of authority: an explicit `platform=`/`backend=` given to `get` or `resolve`, then the
KERNELHUB_PLATFORM environment variable (read once, when kernelhub is first used), then the best
available implementation for the target the computation is lowered for. A forced backend pins
one implementation; a forced platform alone chooses within it per target. What cannot be
served is an error, never a silent fallback. A call carries one choice per target and XLA keeps
the one it lowers for (kernelhub/_core/lowering.py), so an exported function holds each
target's own kernel.
"""

from __future__ import annotations

import difflib
import functools
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import jax

from kernelhub._core import explicit_sharding, jax_internals, lowering, measured_choice
from kernelhub._core import registry as _registry
from kernelhub._core import runtime_checks as _runtime_checks
from kernelhub._core import value_checks
from kernelhub._core.registry import Backend, KernelSpec, NoImplementationError, Platform

PLATFORM_VARIABLE = "KERNELHUB_PLATFORM"

__all__ = ["NoImplementationError", "get", "resolve"]


_environment: tuple[str, Platform | None] | None = None  # (the variable as read, its platform)


def platform_from_environment() -> Platform | None:
    """The platform forced by KERNELHUB_PLATFORM, or None when it is unset or empty.

    Read once, when kernelhub is first used: jax.jit keeps what it traced, so a value that could
    change later would leave functions traced before on the old one without a word. A changed
    value is an error at the next call, as is an invalid one.
    """
    global _environment
    raw = os.environ.get(PLATFORM_VARIABLE, "").strip()
    if _environment is None:
        _environment = (raw, _platform_named(raw))
    elif raw != _environment[0]:
        raise ValueError(
            f"{PLATFORM_VARIABLE} changed from {_environment[0]!r} to {raw!r} after kernelhub read "
            f"it; it is read once, when kernelhub is first used, because functions jax.jit traced "
            f"before would keep the old choice: set it before the program starts, or force one "
            f"call with kernelhub.get(op, platform=...)")
    return _environment[1]


def reread_environment() -> None:
    """Forgets what KERNELHUB_PLATFORM said, so that the next call reads it again (for tests
    that set it; jitted functions keep what they traced)."""
    global _environment, _environment_reads
    _environment = None
    _environment_reads += 1  # and eager calls' remembered selections with it


_environment_reads = 0


@functools.lru_cache(maxsize=32)
def _platform_named(value: str) -> Platform | None:
    value = value.strip()
    if not value:
        return None
    return _registry.as_platform(value, argument=PLATFORM_VARIABLE)


def running_backend(arrays: Iterable[Any] = ()) -> Backend:
    """The backend a call on `arrays` runs on: their devices when committed, else jax's default."""
    platforms = set()
    for array in arrays:
        if isinstance(array, jax.Array) and not isinstance(array, jax.core.Tracer):
            if getattr(array, "committed", False):
                platforms.update(device.platform for device in array.devices())
    if len(platforms) > 1:
        raise ValueError(f"inputs are committed to devices of several platforms: {sorted(platforms)}")
    name = platforms.pop() if platforms else jax.default_backend()
    return _registry.backend_of_target(name)


def resolve(
    op: Any,
    platform: Platform | str | None = None,
    backend: Backend | str | None = None,
    *,
    arrays: Iterable[Any] = (),
    features: Iterable[str] = (),
) -> KernelSpec:
    """The implementation a call of `op` would use now.

    With `backend`, the one a call lowered for that backend uses (also when this host has no
    such device); without, the one for the devices of `arrays` (committed ones), else jax's
    default backend. With `features` (say ["quantized"]), the one for a call using them. See
    the module docstring for the order of authority.
    """
    name = _registry.op_definition(op).name
    forced_platform, source = _forced_platform(platform)
    if backend is not None:
        target = _registry.as_backend(backend)
        if target is Backend.ANY:
            raise ValueError("backend='any' names no hardware; use tpu, gpu or cpu")
        backend_forced = True
    else:
        target = running_backend(arrays)
        backend_forced = False
    return _select(name, forced_platform, target, backend_forced, source, _registry.version(),
                   frozenset(features))


def _forced_platform(platform: Platform | str | None) -> tuple[Platform | None, str]:
    """The platform a call is forced to (the argument, else KERNELHUB_PLATFORM, else None) and
    where that came from, for messages."""
    if platform is not None:
        return _registry.as_platform(platform), "platform argument"
    forced = platform_from_environment()
    if forced is None:  # (every unforced traced call comes here: no message to build)
        return None, ""
    return forced, f"{PLATFORM_VARIABLE}={os.environ.get(PLATFORM_VARIABLE, '').strip()}"


@functools.lru_cache(maxsize=256)
def _select(op: str, forced_platform: Platform | None, target: Backend, backend_forced: bool,
            source: str, registry_version: int,
            features: frozenset[str] = frozenset()) -> KernelSpec:
    del registry_version  # part of the cache key only
    candidates = [
        spec
        for spec in _registry.implementations(op)
        if spec.backend in (target, Backend.ANY)
        and (forced_platform is None or spec.platform is forced_platform)
        and (forced_platform is not None or not spec.interpret_only)
    ]
    lacking = [spec for spec in candidates if not features <= spec.features]
    candidates = [spec for spec in candidates if features <= spec.features]
    usable = [spec for spec in candidates if _usable(spec, backend_forced)]
    if usable:
        # A kernel written for this backend beats a portable one of the same priority.
        return max(usable, key=lambda s: (s.priority, s.backend is not Backend.ANY))

    wanted = f"backend={target.value}" + ("" if forced_platform is None else
                                          f", platform={forced_platform.value} (from {source})")
    reasons = [f"{s.platform.value}/{s.backend.value}: {s.unavailable_reason()}" for s in candidates]
    reasons += [f"{s.platform.value}/{s.backend.value} does not support "
                f"{', '.join(sorted(features - s.features))}" for s in lacking]
    if features:
        wanted += f", with {', '.join(sorted(features))}"
    others = [f"{s.platform.value}/{s.backend.value}" for s in _registry.implementations(op)]
    detail = ("; ".join(reasons) if reasons else "none is registered") + (
        f". Registered for {op}: {', '.join(others) or 'none'}")
    raise NoImplementationError(f"no implementation of {op} for {wanted}: {detail}")


def _usable(spec: KernelSpec, backend_forced: bool) -> bool:
    """Whether `spec` may serve the call.

    With a forced backend the call is lowered for hardware that may be absent here (ahead-of-time
    compilation), so only the implementation's own requirements (its imports) count.
    """
    reason = spec.unavailable_reason()
    if reason is None:
        return True
    return backend_forced and reason.startswith(_registry.NO_DEVICE_PREFIX)


@functools.lru_cache(maxsize=256)
def per_target(op: str, registry_version: int, within: Platform | None = None,
               features: frozenset[str] = frozenset(), forced_by: str | None = None,
               running: Backend | None = None) -> lowering.Choices:
    """The choice for every target (a reason where there is none, raised if lowered there):
    the best of all implementations, or of those written in `within`, with the faster ones
    measurements name (`alternates`). Every target but the one the call runs on (`running`) is
    lowered ahead of time, so only there must the device be present.

    With `forced_by` (where the forced platform `within` came from: the argument or
    KERNELHUB_PLATFORM), the forced platform's implementation for each target, no alternates.
    So Triton forced on a CPU host and exported for cuda holds the Triton kernel for cuda and
    its interpreter for cpu, and lowering it for a TPU is an error."""
    entries, alternates = [], []
    for target in lowering.TARGETS:
        backend = _registry.backend_of_target(target)
        try:
            choice = _select(op, within, backend, backend is not running,
                             forced_by or "platform argument", registry_version, features)
        except NoImplementationError as error:
            choice = str(error)
        entries.append((target, choice))
        if isinstance(choice, KernelSpec) and forced_by is None:
            others = measured_choice.alternates(choice, _serving(op, within, backend, features))
            if others:
                alternates.append((target, others))
    return lowering.Choices(tuple(entries), tuple(alternates))


def _serving(op: str, within: Platform | None, backend: Backend,
             features: frozenset[str]) -> list[KernelSpec]:
    """The implementations registered for `backend` (or any) that have `features`."""
    return [spec for spec in _registry.implementations(op)
            if spec.backend in (backend, Backend.ANY) and features <= spec.features
            and (within is None or spec.platform is within)]


def choices(op: str, platform: Platform | None, backend: Backend | None,
            arrays: Iterable[Any] = (),
            features: frozenset[str] = frozenset()) -> lowering.Choices:
    """What a call lowers for each target: with a forced backend, one pinned implementation;
    with a forced platform only, that platform's implementation for each target."""
    forced, source = _forced_platform(platform)
    if forced is None and backend is None:
        return per_target(op, _registry.version(), None, features)
    if backend is not None:
        return lowering.Choices.pinned(
            resolve(op, platform, backend, arrays=arrays, features=features))
    return per_target(op, _registry.version(), forced, frozenset(features), source,
                      running_backend(arrays))


class Dispatched:
    """The callable `get` returns: checks the contract, selects, and calls an implementation."""

    def __init__(self, op: str, platform: Platform | None, backend: Backend | None):
        definition = _registry.op_definition(op)
        self._op = definition.name
        self._platform = platform
        self._backend = backend
        self._plans: dict[Any, _Plan] = {}
        self.__signature__ = definition.signature
        self.__doc__ = definition.doc
        self.__name__ = self.__qualname__ = definition.name

    @property
    def _definition(self) -> _registry.OpDefinition:
        return _registry.op_definition(self._op)

    def __repr__(self) -> str:
        forced = [f"{k}={v.value}" for k, v in (("platform", self._platform), ("backend", self._backend)) if v]
        return f"kernelhub.get({self._definition.name!r}{''.join(', ' + f for f in forced)})"

    def resolve(self, *arrays: Any, features: Iterable[str] = ()) -> KernelSpec:
        return resolve(self._definition.name, self._platform, self._backend, arrays=arrays,
                       features=features)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value_checks.report_arrived()
        definition = self._definition
        try:
            arguments = definition.bind(args, kwargs)
        except TypeError as error:
            raise _binding_error(definition, kwargs, error) from None
        key = _plan_key(definition, arguments)
        plan = None if key is None else self._plans.get(key)
        if plan is not None and plan.confirmed:
            if definition.check_values is not None:
                definition.check_values(arguments)
            return plan.run(self, arguments)
        definition.typecheck(**arguments)
        _reads.values = False
        prepared = definition.prepare(dict(arguments))
        if definition.check_values is not None:  # it skips tracers: their values are unknown
            definition.check_values(arguments)
        concrete = not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(arguments))
        features = definition.features_of(prepared)
        layout, arrays = lowering.split(prepared)
        if concrete:
            self._check_runs_here(arrays, features)
        chosen = self._choices(arrays, features)
        if definition.runtime_check is not None and _runtime_checks.enabled():
            definition.runtime_check(arguments)  # the values as given, before any narrowing
        mesh = (explicit_sharding.explicit_mesh(arrays)
                if explicit_sharding.has_rule(definition.name) else None)
        if mesh is not None:  # each device calls the implementation on its blocks
            return explicit_sharding.call(definition.name, chosen, prepared, mesh)
        if key is not None and concrete and not _reads.values:
            self._remember(key, plan, _Plan.of(self, arguments, layout, arrays, chosen, features))
        return lowering.call_split(definition.name, chosen, layout, arrays)

    def _remember(self, key: Any, seen: _Plan | None, plan: _Plan) -> None:
        """Keeps `plan` for `key`; it serves calls once a second call has made the same one."""
        if seen is not None and seen.same_as(plan):
            plan.confirm()
        if len(self._plans) >= _PLANS_PER_OP:
            self._plans.clear()
        self._plans[key] = plan

    def _check_runs_here(self, arrays: list[Any], features: frozenset[str]) -> None:
        """An eager call pinned to hardware this host lacks (backend="tpu" on a CPU, say) cannot
        run; that pin exists for lowering and export. Say so, and what runs here, rather than
        let the kernel fail inside Pallas or Triton."""
        if self._backend not in (Backend.TPU, Backend.GPU):
            return
        here = running_backend(arrays)
        if here is self._backend:
            return
        op = self._definition.name
        try:
            runnable = resolve(op, self._platform, here, arrays=arrays, features=features)
        except NoImplementationError:
            runnable = resolve(op, None, here, arrays=arrays, features=features)
        raise ValueError(
            f"{self!r} is for lowering and export on a host without a {self._backend.value} "
            f"(jax.jit(fn).lower(...), kernelhub.export): called eagerly, it would run on this "
            f"host's {here.value}. Here, kernelhub.get({op!r}, platform="
            f"{runnable.platform.value!r}) runs the {runnable.platform.value} kernels"
            f"{' in interpret mode' if runnable.interpret_only else ''}")

    def _chooses_by_arrays(self) -> bool:
        """Whether the choice depends on where the arrays are (committed devices)."""
        forced = self._platform is not None or platform_from_environment() is not None
        return forced and self._backend is None

    def _choices(self, arrays: list[Any], features: frozenset[str]) -> lowering.Choices:
        return choices(self._definition.name, self._platform, self._backend, arrays, features)


# Remembered preparations per op and forcing, before the oldest are forgotten.
_PLANS_PER_OP = 256
_reads = threading.local()  # whether the running `prepare` read an array's numbers


def note_values_read() -> None:
    """Called by an op's `validate` when it read the numbers of an array argument (to decide a
    static value, say): the preparation of this call is then not reused for later calls."""
    _reads.values = True


def _plan_key(definition: _registry.OpDefinition, arguments: dict[str, Any]) -> Any:
    """What a call's preparation depends on, when it can be reused (else None): each argument's
    type and, for a jax array, its shape and dtype, for anything else its value; the context."""
    if definition.prepare_reads_values or _runtime_checks.enabled():
        return None
    array_type = _concrete_array_type()
    context = None if definition.context is None else definition.context()
    # KERNELHUB_PLATFORM is not looked at: it is read once (a change is an error at the next
    # call that is validated), and forgetting it (reread_environment) forgets the plans too.
    # The mesh in force: under explicit mesh axes, calls are split over its devices.
    key = [context, _registry.version(), _environment_reads, jax.sharding.get_abstract_mesh()]
    append = key.append
    for value in arguments.values():
        kind = type(value)
        if kind is array_type:
            append(value.aval)
        elif isinstance(value, jax.Array):  # a tracer: this call is traced, and not remembered
            return None
        else:
            try:
                hash(value)
            except TypeError:  # numpy arrays, lists: converted anew by every preparation
                return None
            append(kind)
            append(value)
    return tuple(key)


@functools.cache
def _concrete_array_type() -> type:
    return jax_internals.concrete_array_type()


class _Plan:
    """A call's preparation, to run later calls whose arguments look the same: where each of
    the implementation's arrays comes from (an argument, or a constant of the preparation),
    the layout of the rest, and the selection."""

    def __init__(self, layout: lowering.Layout, sources: tuple[tuple[str | None, Any], ...],
                 chosen: lowering.Choices | None, features: frozenset[str],
                 run: Callable[[list[Any]], Any] | None):
        self.layout, self.sources, self.chosen, self.features = layout, sources, chosen, features
        self._run = run
        self.confirmed = False

    @classmethod
    def of(cls, dispatched: Dispatched, arguments: dict[str, Any], layout: lowering.Layout,
           arrays: list[Any], chosen: lowering.Choices, features: frozenset[str]) -> _Plan:
        names = {id(value): name for name, value in arguments.items()}
        sources = []
        for array in arrays:
            name = names.get(id(array))
            sources.append((name, None) if name is not None else (None, array))
        by_arrays = dispatched._chooses_by_arrays()
        run = None
        if not by_arrays:
            constants = {i: array for i, (name, array) in enumerate(sources) if name is None}
            run = lowering.eager(dispatched._op, chosen, layout, constants)
        return cls(layout, tuple(sources), None if by_arrays else chosen, features, run)

    def same_as(self, other: _Plan) -> bool:
        return (self.layout == other.layout and self.chosen == other.chosen
                and self.features == other.features and len(self.sources) == len(other.sources)
                and all(a[0] == b[0] and a[1] is b[1] for a, b in zip(self.sources, other.sources)))

    def confirm(self) -> None:
        self.confirmed = True

    def run(self, dispatched: Dispatched, arguments: dict[str, Any]) -> Any:
        if self._run is not None:  # the constants are inside its executable
            return self._run([arguments[name] for name, _ in self.sources if name is not None])
        arrays = [constant if name is None else arguments[name] for name, constant in self.sources]
        chosen = dispatched._choices(arrays, self.features)
        return lowering.call_split(dispatched._op, chosen, self.layout, arrays)


# Keywords users bring from other libraries, and what kernelhub does instead.
_FOREIGN_KEYWORDS = {
    "interpret": "to run a kernel in interpret mode as megablox's interpret=True does, force its "
                 "platform: kernelhub.get(op, platform='pallas') or KERNELHUB_PLATFORM=pallas "
                 "(docs/migrating.md)",
    "implementation": "to choose an implementation as tokamax's implementation= does, use "
                      "kernelhub.get(op, platform=...) or KERNELHUB_PLATFORM (docs/migrating.md)",
}


def _binding_error(definition: _registry.OpDefinition, kwargs: dict[str, Any],
                   error: TypeError) -> TypeError:
    """A TypeError that starts with the argument at fault."""
    parameters = list(definition.signature.parameters)
    for name in kwargs:
        if name not in parameters:
            hint = _FOREIGN_KEYWORDS.get(name)
            if hint is None:
                close = difflib.get_close_matches(name, parameters, n=1)
                hint = f"did you mean {close[0]}?" if close else f"its arguments are {', '.join(parameters)}"
            return TypeError(f"{name}: {definition.name} has no such argument; {hint}")
    return TypeError(f"{definition.name}: {error}")


class WithinPlatform(Dispatched):
    """Chooses per target among the implementations of one platform, whatever
    KERNELHUB_PLATFORM says: for collectives that exist only in XLA and must not be made
    unavailable by a platform forced for the kernels."""

    def _choices(self, arrays: list[Any], features: frozenset[str]) -> lowering.Choices:
        del arrays
        return per_target(self._op, _registry.version(), self._platform, features)


@functools.lru_cache(maxsize=None)
def within_platform(op: str, platform: Platform) -> Callable[..., Any]:
    return WithinPlatform(op, platform, None)


class Pinned(Dispatched):
    """Calls one given implementation for every target, whatever the rules would pick: for
    tests that must reach each implementation (kernelhub.testing)."""

    def __init__(self, spec: KernelSpec):
        super().__init__(spec.op, spec.platform, spec.backend)
        self._spec = spec

    def __repr__(self) -> str:
        return f"kernelhub pinned to {self._spec.op} {self._spec.platform.value}/{self._spec.backend.value}"

    def resolve(self, *arrays: Any, features: Iterable[str] = ()) -> KernelSpec:
        del arrays, features
        return self._spec

    def _choices(self, arrays: list[Any], features: frozenset[str]) -> lowering.Choices:
        del arrays
        missing = features - self._spec.features
        if missing:
            raise NoImplementationError(
                f"{self._spec.platform.value}/{self._spec.backend.value} does not support "
                f"{', '.join(sorted(missing))} for {self._spec.op}")
        return lowering.Choices.pinned(self._spec)


@functools.lru_cache(maxsize=None)
def _cached_get(op: str, platform: Platform | None, backend: Backend | None) -> Dispatched:
    return Dispatched(op, platform, backend)


def get(op: Any, platform: Platform | str | None = None,
        backend: Backend | str | None = None) -> Callable[..., Any]:
    """A callable for `op` (its name or entry point) that selects its implementation each time
    it is called or traced; with `platform` or `backend` it always uses the one they force."""
    name = _registry.op_definition(op).name
    if backend is not None and _registry.as_backend(backend) is Backend.ANY:
        raise ValueError("backend='any' names no hardware; use tpu, gpu or cpu")
    return _cached_get(
        name,
        _registry.as_platform(platform) if platform is not None else None,
        _registry.as_backend(backend) if backend is not None else None,
    )
