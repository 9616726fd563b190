"""Turns a contract function (annotated signature + docstring) into a registered op."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

from beartype import beartype
from jaxtyping import jaxtyped

from kernelhub._registry import OpDefinition, define_op


def define_from_contract(
    contract: Callable[..., Any], prepare: Callable[[inspect.BoundArguments], dict[str, Any]]
) -> OpDefinition:
    """Declares the op named like `contract`, checked against its annotations.

    jaxtyping checks that the annotated axes agree across arguments (m, k, the group axes) and
    beartype checks the types. The return annotation is not checked here: the implementations'
    outputs are what the tests compare against the reference.
    """
    signature = inspect.signature(contract)
    # Contract modules may use postponed annotations (strings): resolve them in the contract's
    # own namespace, since the checker below lives in this module.
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
    return define_op(
        OpDefinition(
            name=contract.__name__,
            signature=signature,
            prepare=prepare,
            typecheck=jaxtyped(typechecker=beartype)(stub),
            doc=contract.__doc__ or "",
        )
    )
