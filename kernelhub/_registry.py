"""The registry: which implementations exist for which (op, platform, backend).

An op is declared once by its contract module (``kernelhub.ops``) with `define_op`; an
implementation joins with `register`. Nothing here selects: that is `kernelhub._dispatch`.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable
from typing import Any

import jax


class Platform(enum.StrEnum):
    """The kernel language an implementation is written in."""

    PALLAS = "pallas"
    TRITON = "triton"
    XLA = "xla"


class Backend(enum.StrEnum):
    """The hardware an implementation runs on; ANY runs wherever JAX does."""

    TPU = "tpu"
    GPU = "gpu"
    CPU = "cpu"
    ANY = "any"


def as_platform(value: Platform | str, *, argument: str = "platform") -> Platform:
    """Parses a platform name, raising a ValueError naming `argument` and the valid names."""
    return _parse_enum(Platform, value, argument)


def as_backend(value: Backend | str, *, argument: str = "backend") -> Backend:
    """Parses a backend name, raising a ValueError naming `argument` and the valid names."""
    return _parse_enum(Backend, value, argument)


def _parse_enum(kind: type[enum.StrEnum], value: Any, argument: str):
    if isinstance(value, kind):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a string or {kind.__name__}, got {type(value).__name__}")
    try:
        return kind(value.strip().lower())
    except ValueError:
        valid = ", ".join(member.value for member in kind)
        raise ValueError(f"{argument}={value!r} is not one of: {valid}") from None


@dataclasses.dataclass(frozen=True)
class OpDefinition:
    """What an op's contract module declares: its name and the one signature all share.

    `prepare` takes the bound call arguments (already type-checked against the signature) and
    returns the keyword arguments every implementation receives, validated and normalised.
    """

    name: str
    signature: inspect.Signature
    prepare: Callable[[inspect.BoundArguments], dict[str, Any]]
    typecheck: Callable[..., Any]
    doc: str


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One registered implementation.

    `requirement` returns None when the implementation can be used on this host for its backend,
    or a sentence saying why not (a missing package, no such device here).
    `interpret_only` marks implementations that emulate another backend's kernel on the CPU: they
    run only when forced, never as a default choice.
    """

    op: str
    platform: Platform
    backend: Backend
    priority: int
    fn: Callable[..., Any] = dataclasses.field(repr=False, compare=False)
    requirement: Callable[[], str | None] = dataclasses.field(repr=False, compare=False)
    interpret_only: bool = False

    def unavailable_reason(self) -> str | None:
        return self.requirement()

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None


def _always() -> None:
    return None


NO_DEVICE_PREFIX = "no device"

# jax names several GPU platforms; kernelhub's backends group them.
_JAX_PLATFORM_TO_BACKEND = {"cpu": Backend.CPU, "gpu": Backend.GPU, "cuda": Backend.GPU,
                            "rocm": Backend.GPU, "tpu": Backend.TPU}


def backend_of_jax_platform(name: str) -> Backend:
    """The backend of a jax platform name (cpu, gpu, cuda, rocm, tpu)."""
    try:
        return _JAX_PLATFORM_TO_BACKEND[name]
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
        here = {backend_of_jax_platform(device.platform) for device in jax.devices()}
        if backend not in here:
            return f"{NO_DEVICE_PREFIX} of type {backend.value} on this host"
        return None

    return requirement


_OPS: dict[str, OpDefinition] = {}
_KERNELS: dict[str, dict[tuple[Platform, Backend], KernelSpec]] = {}


def define_op(definition: OpDefinition) -> OpDefinition:
    """Declares an op; called once by its contract module."""
    existing = _OPS.get(definition.name)
    if existing is not None and existing is not definition:
        raise ValueError(f"op {definition.name!r} is already defined")
    _OPS[definition.name] = definition
    _KERNELS.setdefault(definition.name, {})
    return definition


def op_definition(op: str) -> OpDefinition:
    """The definition of `op`, or a ValueError listing the known ops."""
    if not isinstance(op, str):
        raise TypeError(f"op must be a string naming an op, got {type(op).__name__}")
    try:
        return _OPS[op]
    except KeyError:
        known = ", ".join(sorted(_OPS)) or "(none)"
        raise ValueError(f"unknown op {op!r}; known ops: {known}") from None


def register(
    op: str,
    platform: Platform | str,
    backend: Backend | str,
    priority: int = 0,
    *,
    requirement: Callable[[], str | None] = _always,
    interpret_only: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator adding an implementation of `op` for (platform, backend).

    The function must have the op's signature (names, order, kinds and defaults); registering
    the same (op, platform, backend) twice is an error.
    """
    definition = op_definition(op)
    platform = as_platform(platform)
    backend = as_backend(backend)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        _check_same_signature(definition, fn)
        table = _KERNELS[op]
        if (platform, backend) in table:
            raise ValueError(
                f"{op} already has an implementation for platform={platform.value}, "
                f"backend={backend.value}"
            )
        table[(platform, backend)] = KernelSpec(
            op, platform, backend, priority, fn, requirement, interpret_only
        )
        return fn

    return add


def unregister(op: str, platform: Platform | str, backend: Backend | str) -> None:
    """Removes an implementation (for tests and for replacing one at run time)."""
    _KERNELS[op_definition(op).name].pop((as_platform(platform), as_backend(backend)), None)


def implementations(op: str) -> list[KernelSpec]:
    """The registered implementations of `op`, best first within each backend."""
    table = _KERNELS[op_definition(op).name]
    return sorted(table.values(), key=lambda s: (s.backend.value, -s.priority, s.platform.value))


def op_names() -> list[str]:
    """The names of all defined ops."""
    return sorted(_OPS)


def _check_same_signature(definition: OpDefinition, fn: Callable[..., Any]) -> None:
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
    if len(got) != len(expected):
        names = [p.name for p in expected]
        raise TypeError(
            f"{where} has {len(got)} parameters, {definition.name} has {len(expected)}: {names}"
        )
