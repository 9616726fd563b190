"""The registry: which implementations exist for which (op, platform, backend).

An op is declared once with `kernelhub.define_op` (kernelhub/_core/define.py), kernelhub's own
by their contract modules (kernelhub/ops, loaded by kernelhub/_loader.py); an implementation
joins with `register`. Nothing here selects (kernelhub/_core/dispatch.py), and nothing here
knows an op by name: kernelhub's ops are declared exactly as a user's are.

Three words, three things: a *platform* is the language a kernel is written in (pallas, triton,
mosaic, xla); a *backend* is the hardware an implementation runs on (tpu, gpu, cpu, or any); a
*target* is a place jax lowers for (cpu, cuda, rocm, tpu: kernelhub/_core/lowering.py).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import jax


class Platform(enum.StrEnum):
    """The kernel language an implementation is written in."""

    PALLAS = "pallas"  # Pallas lowered through Mosaic for TPU
    TRITON = "triton"  # Pallas lowered through Triton for GPUs
    MOSAIC = "mosaic"  # Pallas lowered through Mosaic GPU (Hopper)
    XLA = "xla"


class Backend(enum.StrEnum):
    """The hardware an implementation runs on; ANY runs wherever JAX does."""

    TPU = "tpu"
    GPU = "gpu"
    CPU = "cpu"
    ANY = "any"


def as_platform(value: Platform | str, *, argument: str = "platform") -> Platform:
    """Parses a platform name, raising a ValueError naming `argument` and the valid names (and
    saying so when the name is a backend's or a target's: where, not what language)."""
    try:
        return _parse_enum(Platform, value, argument)
    except ValueError as error:
        name = value.strip().lower()
        if name in {*Backend, *BACKEND_ALIASES}:
            raise ValueError(f"{error}: {name!r} names hardware (a backend), and a platform is the "
                             f"kernels' language; to pick by hardware use backend=") from None
        raise


# jax's names for where it lowers or runs that name one backend: both of jax's GPU targets are
# kernelhub's gpu ("gpu" itself is also jax's device platform name for either).
BACKEND_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def as_backend(value: Backend | str, *, argument: str = "backend") -> Backend:
    """Parses a backend name (or jax's cuda or rocm, which mean gpu), raising a ValueError
    naming `argument` and the valid names."""
    return _parse_enum(Backend, value, argument, BACKEND_ALIASES)


def _parse_enum(kind: type[enum.StrEnum], value: Any, argument: str,
                aliases: dict[str, str] | None = None):
    """One rule for every name kernelhub reads (arguments, KERNELHUB_PLATFORM, the command):
    case and surrounding spaces do not matter, and `aliases` map other names onto members."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a string or {kind.__name__}, got {type(value).__name__}")
    aliases = aliases or {}
    name = value.strip().lower()
    try:
        return kind(aliases.get(name, name))
    except ValueError:
        valid = ", ".join(member.value for member in kind)
        also = f" (or {', '.join(f'{a} for {b}' for a, b in aliases.items())})" if aliases else ""
        raise ValueError(f"{argument}={value!r} is not one of: {valid}{also}") from None


class NoImplementationError(ValueError):
    """No implementation fits what was asked (a forced platform or backend, or none registered)."""


@dataclasses.dataclass(frozen=True)
class OpDefinition:
    """What `define_op` declares: an op's name and the one signature its implementations share.

    `bind` takes a call's positional and keyword arguments and returns them by name, defaults
    filled in (raising TypeError as Python does). `prepare` takes them, already type-checked
    against the signature, and returns the keyword arguments every implementation receives,
    validated and normalised.
    """

    name: str
    signature: inspect.Signature
    bind: Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]
    prepare: Callable[[dict[str, Any]], dict[str, Any]]
    typecheck: Callable[..., Any]
    doc: str
    # With kernelhub.runtime_checks() on: called with the arguments by name as given (before
    # `prepare` converts them), to attach host checks of values not known while tracing.
    runtime_check: Callable[[dict[str, Any]], None] | None = None
    # The optional features a call uses (say "quantized"), from its prepared arguments: only
    # implementations registered with all of them serve it.
    features: Callable[[dict[str, Any]], frozenset[str]] | None = None
    # Called with the arguments by name of every call, after `prepare`, to check the values of
    # those that are not tracers: what types and shapes do not show (kernelhub/_core/value_checks.py: without waiting
    # on a device).
    check_values: Callable[[dict[str, Any]], None] | None = None
    # Whether `prepare` may read the numbers in array arguments. When it does not, an eager call
    # whose arguments look like an earlier one's (types, shapes, dtypes, other values) reuses
    # that call's preparation (kernelhub/_core/dispatch.py); `context` then gives what else
    # `prepare` reads (a table in force, say), as a hashable value.
    prepare_reads_values: bool = True
    context: Callable[[], Any] | None = None
    # The seconds measured for one implementation's share of a call on this host's device, or
    # None where nothing was measured: called when a call is lowered for this host's device,
    # with the arguments by name (arrays as abstract values) and a function that traces that
    # implementation's share. The dispatcher lowers the fastest measured implementation
    # (kernelhub/_core/measured_choice.py).
    measured: Callable[[dict[str, Any], Callable[[], Any]], float | None] | None = None

    def features_of(self, prepared: dict[str, Any]) -> frozenset[str]:
        return frozenset() if self.features is None else frozenset(self.features(prepared))


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One registered implementation.

    `requirement` returns None when the implementation can be used on this host for its backend,
    or a sentence saying why not (a missing package, no such device here).
    `interpret_only` marks implementations that emulate another backend's kernel on the CPU: they
    run only when forced, never as a default choice.
    `features` names the optional features of the op (OpDefinition.features) it implements.
    `residuals` names the VJP code it shares with other implementations (kernelhub/_core/
    lowering.py: residuals), or is None.
    """

    op: str
    platform: Platform
    backend: Backend
    priority: int
    # Compared (by identity): a spec replaced under the same key is another spec to caches.
    fn: Callable[..., Any] = dataclasses.field(repr=False)
    requirement: Callable[[], str | None] = dataclasses.field(repr=False, compare=False)
    interpret_only: bool = False
    features: frozenset[str] = frozenset()
    # The op's trailing parameters the function leaves out (registered before the op grew
    # them): calls reach it only with their defaults (`arguments_for`).
    omitted: tuple[tuple[str, Any], ...] = ()
    residuals: str | None = None

    def arguments_for(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """`arguments` without the parameters this function leaves out; a NoImplementationError
        when one of them holds anything but its default (the op's features route such calls
        elsewhere, so this guards ops whose features do not cover a new parameter)."""
        if not self.omitted:
            return arguments
        kept = dict(arguments)
        for name, default in self.omitted:
            value = kept.pop(name, default)
            if value is not default and not (_plain(value) and value == default):
                raise NoImplementationError(
                    f"{self.op} for platform={self.platform.value}, backend={self.backend.value} "
                    f"takes no {name!r} (its function has no such parameter), got {value!r}")
        return kept

    def unavailable_reason(self) -> str | None:
        return self.requirement()

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None)))


def _always() -> None:
    return None


NO_DEVICE_PREFIX = "no device"

# The hardware of each target, and of jax's device platforms ("gpu" names cuda and rocm alike).
_TARGET_TO_BACKEND = {"cpu": Backend.CPU, "gpu": Backend.GPU, "cuda": Backend.GPU,
                      "rocm": Backend.GPU, "tpu": Backend.TPU}


def backend_of_target(name: str) -> Backend:
    """The backend of a target or of a jax device platform (cpu, gpu, cuda, rocm, tpu)."""
    try:
        return _TARGET_TO_BACKEND[name]
    except KeyError:
        raise ValueError(f"kernelhub has no backend for the jax platform {name!r}") from None


def needs_device(backend: Backend | str) -> Callable[[], str | None]:
    """A requirement met when this host's jax runs on a device of `backend`.

    Only the default backend's devices are looked at: asking jax for another platform's devices
    would start that runtime (libtpu, when installed on a host without a TPU, probes for one).
    The reason starts with NO_DEVICE_PREFIX: the dispatcher lets a forced backend through it,
    since lowering for absent hardware (ahead-of-time compilation) needs no device.
    """
    backend = as_backend(backend)

    def requirement() -> str | None:
        here = {backend_of_target(device.platform) for device in jax.devices()}
        if backend not in here:
            return f"{NO_DEVICE_PREFIX} of type {backend.value} on this host"
        return None

    return requirement


_OPS: dict[str, OpDefinition] = {}
_KERNELS: dict[str, dict[tuple[Platform, Backend], KernelSpec]] = {}
_version = 0  # bumped by every change, so that cached selections know when to look again


def version() -> int:
    """A number that changes whenever an op or an implementation is added or removed."""
    return _version


def _changed() -> None:
    global _version
    _version += 1


def add_op(definition: OpDefinition) -> OpDefinition:
    """Declares an op (through `kernelhub.define_op`); a name can be declared once."""
    if definition.name in _OPS:
        raise ValueError(f"op {definition.name!r} is already defined")
    _OPS[definition.name] = definition
    _KERNELS[definition.name] = {}
    _changed()
    return definition


def remove_op(op: Any) -> None:
    """Forgets an op and its implementations (for tests that declare ops of their own)."""
    name = op_definition(op).name
    del _OPS[name], _KERNELS[name]
    _changed()


OP_NAME_ATTRIBUTE = "__kernelhub_op__"


def op_name(op: Any) -> str:
    """The name of `op`: a string, or the entry point `define_op` returned."""
    name = getattr(op, OP_NAME_ATTRIBUTE, op)
    if not isinstance(name, str):
        raise TypeError(
            f"op must be an op's name or the function kernelhub.define_op returned, got "
            f"{type(op).__name__}")
    return name


def op_definition(op: Any) -> OpDefinition:
    """The definition of `op`, or a ValueError listing the known ops."""
    name = op_name(op)
    try:
        return _OPS[name]
    except KeyError:
        known = ", ".join(sorted(_OPS)) or "(none)"
        raise ValueError(
            f"unknown op {name!r}; known ops: {known}. A new op is declared with "
            f"kernelhub.define_op before implementations are registered for it") from None


def register(
    op: Any,
    platform: Platform | str,
    backend: Backend | str,
    priority: int = 0,
    *,
    requirement: Callable[[], str | None] = _always,
    interpret_only: bool = False,
    features: Iterable[str] = (),
    residuals: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator adding an implementation of `op` (its name, or the function `define_op`
    returned) for (platform, backend).

    `features` names the optional features of the op this implementation supports (say
    "quantized"); a call that uses a feature goes only to implementations that list it.

    The function must have the op's signature (names, order, kinds and defaults), but for
    trailing parameters with defaults that it may leave out (an implementation written before
    the op grew them); it is then called only with those parameters at their defaults. Registering
    the same (op, platform, backend) twice is an error, and so is an op nobody declared.

    `residuals` is a name for implementations whose VJPs keep residuals of the same types for
    the same arguments, because they share their VJP code (kernelhub's grouped matmuls share the
    kit's): a differentiated call then traces one of them, not each, to type the residuals it
    hands from the forward pass to the backward pass, and each is checked when it is lowered.
    """
    definition = op_definition(op)
    platform = as_platform(platform)
    backend = as_backend(backend)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    if isinstance(features, str) or not all(isinstance(f, str) for f in features):
        raise TypeError(f"features must be a collection of names (strings), got {features!r}")
    features = frozenset(features)
    if residuals is not None and not isinstance(residuals, str):
        raise TypeError(f"residuals must be a name (a string) or None, got {residuals!r}")

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        omitted = _check_same_signature(definition, fn)
        table = _KERNELS[definition.name]
        if (platform, backend) in table:
            raise ValueError(
                f"{definition.name} already has an implementation for platform={platform.value}, "
                f"backend={backend.value}"
            )
        table[(platform, backend)] = KernelSpec(
            definition.name, platform, backend, priority, fn, requirement, interpret_only,
            features, omitted, residuals)
        _changed()
        return fn

    return add


def unregister(op: Any, platform: Platform | str, backend: Backend | str) -> KernelSpec | None:
    """Removes an implementation and returns it (None when there was none): for tests, and
    for replacing one at run time."""
    removed = _KERNELS[op_definition(op).name].pop((as_platform(platform), as_backend(backend)), None)
    _changed()
    return removed


def restore(spec: KernelSpec) -> None:
    """Puts back an implementation `unregister` returned, replacing any under its key."""
    _KERNELS[op_definition(spec.op).name][(spec.platform, spec.backend)] = spec
    _changed()


def implementations(op: Any) -> list[KernelSpec]:
    """The registered implementations of `op`, best first within each backend."""
    table = _KERNELS[op_definition(op).name]
    return sorted(table.values(), key=lambda s: (s.backend.value, -s.priority, s.platform.value))


def op_names() -> list[str]:
    """The names of all defined ops."""
    return sorted(_OPS)


def _check_same_signature(definition: OpDefinition,
                          fn: Callable[..., Any]) -> tuple[tuple[str, Any], ...]:
    """Raises a TypeError where `fn`'s signature departs from the op's; returns the trailing
    parameters (name, default) it leaves out."""
    expected = list(definition.signature.parameters.values())
    got = list(inspect.signature(fn).parameters.values())
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
    for position, (want, have) in enumerate(zip(expected, got)):
        if want.name != have.name:
            raise TypeError(
                f"{where} does not match the signature of {definition.name}: parameter "
                f"{position} is {have.name!r}, expected {want.name!r}"
            )
        if want.kind != have.kind:
            raise TypeError(
                f"{where}: parameter {want.name!r} is {have.kind.description}, expected "
                f"{want.kind.description} as in {definition.name}"
            )
        if want.default is not have.default and want.default != have.default:
            raise TypeError(
                f"{where}: parameter {want.name!r} defaults to {have.default!r}, expected "
                f"{want.default!r} as in {definition.name}"
            )
    left_out = expected[len(got):]
    if len(got) > len(expected) or any(p.default is inspect.Parameter.empty for p in left_out):
        names = [p.name for p in expected]
        raise TypeError(
            f"{where} has {len(got)} parameters, {definition.name} has {len(expected)}: {names} "
            f"(only trailing parameters with defaults may be left out)"
        )
    return tuple((p.name, p.default) for p in left_out)
