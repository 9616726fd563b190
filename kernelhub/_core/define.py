"""Declaring an op: `kernelhub.define_op`, the one way every op comes into being.

    @kernelhub.define_op(validate=check_arguments)
    def swiglu(gate: Float[Array, "m n"], up: Float[Array, "m n"]) -> Float[Array, "m n"]:
        \"\"\"silu(gate) * up, elementwise.\"\"\"

The contract function gives the op its name, its signature (with jaxtyping shapes where given,
checked on every call) and its documentation; its body is never run. What `define_op` returns
is the op's entry point: calling it selects an implementation and runs it, exactly like
`kernelhub.grouped_matmul`. Implementations then join with `kernelhub.register`.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Iterable
from typing import Any

from beartype import beartype
from jaxtyping import jaxtyped

from kernelhub._core import registry as _registry
from kernelhub._core import type_errors as _type_errors
from kernelhub._core.dispatch import get

Validate = Callable[[dict[str, Any]], dict[str, Any] | None]


def define_op(contract: Callable[..., Any] | None = None, /, *, validate: Validate | None = None,
              name: str | None = None,
              runtime_check: Callable[[dict[str, Any]], None] | None = None,
              features: Callable[[dict[str, Any]], Iterable[str]] | None = None,
              check_values: Callable[[dict[str, Any]], None] | None = None,
              validate_reads_values: bool = True,
              context: Callable[[], Any] | None = None,
              measured: Callable[[dict[str, Any], Callable[[], Any]], float | None] | None = None,
              ) -> Any:
    """Declares an op from its contract function; use as `@define_op` or `@define_op(...)`.

    Args:
      contract: a function whose signature, annotations and docstring are the op's. Every
        implementation must have the same parameters (names, order, kinds, defaults).
      validate: called with the call's arguments by name (defaults filled in, types already
        checked against the annotations); raises TypeError/ValueError naming a bad argument,
        and returns the arguments the implementations receive (normalised: arrays converted,
        defaults resolved), or None to pass them on unchanged. Arrays in what it returns are
        the call's operands; every other value must be hashable (it is static under jit).
      name: the op's name; the contract function's name by default.
      runtime_check: with `kernelhub.runtime_checks()` on (or KERNELHUB_RUNTIME_CHECKS=1),
        called with the call's arguments by name as given (before `validate` converts them)
        when a call is traced, to check values that are not known then (say, with
        `jax.debug.callback`).
      features: called with what `validate` returned; gives the names of the optional
        features the call uses (say "quantized" for quantized operands). Only implementations
        registered with every one of them (`register(..., features=...)`) serve the call.
      check_values: called with the call's arguments by name (as given, defaults filled) on
        every call, after `validate`: for checks of the numbers in arrays. Tracers (inside jit)
        have none to check: skip them. Raise a ValueError naming the argument.
      validate_reads_values: whether `validate` reads the numbers in array arguments. Say
        False when it does not (it may read their types, shapes and dtypes, and the other
        arguments): an eager call whose arguments look like an earlier one's then skips
        `validate` and the selection, and reuses theirs (`check_values` still runs).
      context: with validate_reads_values=False, what else `validate` reads (a setting in
        force, say), as a hashable value; calls under another context are validated again.
      measured: how fast an implementation ran a call, for choosing among implementations
        per call. Called when a call is lowered for this host's own device and another
        implementation could serve it too, with the call's arguments by name (arrays as
        abstract values) and `trace`, a function without arguments that traces one
        implementation's share of the call (the whole call, or a half of its VJP). Returns the
        seconds measured on this device for that share, or None where nothing was measured.
        When the default implementation and others have measurements, the fastest lowers.
        A forced platform or backend is never overridden.

    Returns:
      The op's entry point: a function with the contract's signature and docstring that
      dispatches to the best implementation for where it runs (see kernelhub.get).

    Raises:
      ValueError if an op of that name is already defined; TypeError for a contract that is
      not a function.
    """

    def declare(contract: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(contract):
            raise TypeError(f"define_op needs a contract function, got {type(contract).__name__}")
        signature = inspect.signature(contract)
        definition = _registry.add_op(_registry.OpDefinition(
            name=name or contract.__name__,
            signature=signature,
            bind=_binder(signature),
            prepare=_normaliser(validate),
            typecheck=_checker(contract, name or contract.__name__),
            doc=inspect.getdoc(contract) or "",
            runtime_check=runtime_check,
            features=features,
            check_values=check_values,
            prepare_reads_values=bool(validate_reads_values),
            context=context,
            measured=measured,
        ))
        return _entry_point(contract, definition)

    if contract is not None:
        return declare(contract)
    return declare


def _binder(signature: inspect.Signature) -> Callable[[tuple, dict], dict[str, Any]]:
    """Binds a call's arguments to `signature` by name, defaults filled in: the common case
    (named parameters only, none missing or given twice) without inspect's general machinery,
    which costs several microseconds an eager call would pay every time."""
    parameters = list(signature.parameters.values())
    simple = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters)
    positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
    names = tuple(p.name for p in parameters)
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}

    def general(args: tuple, kwargs: dict) -> dict[str, Any]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        if len(args) > len(positional):
            return general(args, kwargs)
        arguments = dict(zip(positional, args))
        for key, value in kwargs.items():
            if key in arguments or key not in defaults and key not in names:
                return general(args, kwargs)
            arguments[key] = value
        if len(arguments) < len(names):
            for key in names:
                if key not in arguments:
                    if key not in defaults:
                        return general(args, kwargs)
                    arguments[key] = defaults[key]
        # In the signature's order whatever the call's: the order is part of what an eager
        # call's remembered preparation is found by.
        return {key: arguments[key] for key in names} if kwargs else arguments

    return bind if simple else general


def _normaliser(validate: Validate | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    if validate is None:
        return dict
    if not callable(validate):
        raise TypeError(f"validate must be a function of the arguments by name, got {validate!r}")

    def prepare(arguments: dict[str, Any]) -> dict[str, Any]:
        normalised = validate(dict(arguments))
        return dict(arguments) if normalised is None else dict(normalised)

    return prepare


def _checker(contract: Callable[..., Any], op: str) -> Callable[..., None]:
    """A function with the contract's annotations and no body, checked by jaxtyping + beartype.

    jaxtyping checks that named axes agree across arguments (m, k, the group axes); beartype
    checks the types. The return annotation is not checked: the outputs are what tests compare
    against references.
    """
    signature = inspect.signature(contract)
    # Annotations may be postponed (strings): resolve them in the contract's own namespace.
    hints = typing.get_type_hints(contract, include_extras=True)
    hints.pop("return", None)
    checked = signature.replace(
        parameters=[p.replace(annotation=hints.get(p.name, p.annotation))
                    for p in signature.parameters.values()],
        return_annotation=inspect.Signature.empty,
    )

    def stub(*args: Any, **kwargs: Any) -> None:
        return None

    stub.__name__ = stub.__qualname__ = contract.__name__
    stub.__module__ = contract.__module__
    stub.__signature__ = checked  # type: ignore[attr-defined]
    stub.__annotations__ = hints
    full_report = jaxtyped(typechecker=beartype)(stub)

    def check(*args: Any, **kwargs: Any) -> None:
        try:
            full_report(*args, **kwargs)
        except TypeError as report:  # jaxtyping's and beartype's errors are TypeErrors
            concise = _type_errors.explain(op, signature, hints, args, kwargs)
            if concise is None:
                raise
            raise concise from report

    return _remembering(check)


_REMEMBERED = 4096


def _remembering(check: Callable[..., None]) -> Callable[..., None]:
    """`check`, skipped for calls whose arguments look like ones that passed before.

    The checks depend on the arguments' types, and on arrays' shapes and dtypes only, so an
    eager loop calling an op with one set of shapes pays for them once.
    """
    passed: set[Any] = set()

    def run(*args: Any, **kwargs: Any) -> None:
        key = _appearance(args, kwargs)
        if key is not None and key in passed:
            return
        check(*args, **kwargs)
        if key is not None:
            if len(passed) >= _REMEMBERED:
                passed.clear()
            passed.add(key)

    return run


def _appearance(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """What the checks see of the arguments, or None when a value cannot be remembered."""
    key = []
    for name, value in (*((None, a) for a in args), *kwargs.items()):
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            key.append((name, type(value), tuple(value.shape), value.dtype))
            continue
        try:
            hash(value)
        except TypeError:
            return None
        key.append((name, type(value), value))
    return tuple(key)


def _entry_point(contract: Callable[..., Any], definition: _registry.OpDefinition) -> Callable[..., Any]:
    dispatched = get(definition.name)

    @functools.wraps(contract)
    def op(*args: Any, **kwargs: Any) -> Any:
        return dispatched(*args, **kwargs)

    setattr(op, _registry.OP_NAME_ATTRIBUTE, definition.name)
    return op
