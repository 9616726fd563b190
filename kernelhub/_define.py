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

from kernelhub import _registry, _type_errors

Validate = Callable[[dict[str, Any]], dict[str, Any] | None]


def define_op(contract: Callable[..., Any] | None = None, /, *, validate: Validate | None = None,
              name: str | None = None,
              runtime_check: Callable[[dict[str, Any]], None] | None = None,
              features: Callable[[dict[str, Any]], Iterable[str]] | None = None) -> Any:
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
        called with what `validate` returned when a call is traced, to check values that are
        not known then (say, with `jax.debug.callback`).
      features: called with what `validate` returned; gives the names of the optional
        features the call uses (say "quantized" for quantized operands). Only implementations
        registered with every one of them (`register(..., features=...)`) serve the call.

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
        definition = _registry.add_op(_registry.OpDefinition(
            name=name or contract.__name__,
            signature=inspect.signature(contract),
            prepare=_normaliser(validate),
            typecheck=_checker(contract, name or contract.__name__),
            doc=inspect.getdoc(contract) or "",
            runtime_check=runtime_check,
            features=features,
        ))
        return _entry_point(contract, definition)

    if contract is not None:
        return declare(contract)
    return declare


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
    from kernelhub._dispatch import get  # noqa: PLC0415  (the dispatcher imports the registry)

    dispatched = get(definition.name)

    @functools.wraps(contract)
    def op(*args: Any, **kwargs: Any) -> Any:
        return dispatched(*args, **kwargs)

    setattr(op, _registry.OP_NAME_ATTRIBUTE, definition.name)
    return op
