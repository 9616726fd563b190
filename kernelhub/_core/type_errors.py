"""One-line errors for arguments that do not fit an op's annotations.

jaxtyping and beartype report a mismatch in 25-30 lines: every parameter, every annotation.
The op's caller needs one: which argument, what was expected, what came, and the fix when it
is obvious. `explain` works that out again from the annotations (the checker's report stays
attached as the exception's cause).
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import jax.numpy as jnp
from beartype.door import is_bearable

from kernelhub._core.errors import ShapeError


def explain(op: str, signature: inspect.Signature, hints: dict[str, Any], args: tuple,
            kwargs: dict[str, Any]) -> Exception | None:
    """A TypeError (a ShapeError where only a shape is wrong) for the first argument that does
    not fit, or None when no single argument or pair of them explains the checker's
    complaint."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    for name, value in bound.arguments.items():
        hint = hints.get(name)
        if hint is not None and not _fits(value, hint):
            suggestion = _suggestion(value, hint)
            # Only a shape is wrong (the rank, or a fixed axis length): lax calls that a TypeError
            error = ShapeError if suggestion.startswith(_SHAPE_SUGGESTIONS) else TypeError
            return error(f"{name} must be {_expected(hint)}, got {_described(value)}{suggestion} "
                         f"({op})")
    return _dimension_conflict(op, bound.arguments, hints)


_SHAPE_SUGGESTIONS = ("; reshape it to", "; it needs", "; its shape must be")


def _fits(value: Any, hint: Any) -> bool:
    try:
        return is_bearable(value, hint)
    except Exception:  # noqa: BLE001  (a hint beartype cannot judge alone: not the culprit)
        return True


def _members(hint: Any) -> list[Any]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [m for member in typing.get_args(hint) for m in _members(member)]
    return [hint]


def _is_array_hint(hint: Any) -> bool:
    return hasattr(hint, "dim_str") and hasattr(hint, "dtypes")


def _expected(hint: Any) -> str:
    described, seen = [], set()
    for member in _members(hint):
        if member is type(None):
            text = "None"
        elif _is_array_hint(member):
            kind = member.__name__.split("[")[0].lower()
            kind = "an array" if kind == "shaped" else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} array"
            text = kind if member.dim_str.strip() == "..." else f"{kind} of shape {_shape_of(member)}"
        elif isinstance(member, type) and hasattr(member, "described"):
            text = member.described
        elif isinstance(member, type) and member.__module__.startswith("kernelhub"):
            text = f"a kernelhub.{member.__name__}"
        elif isinstance(member, type):
            text = member.__name__
        else:
            text = str(member)
        if text not in seen:
            seen.add(text)
            described.append(text)
    return " or ".join(described)


def _shape_of(hint: Any) -> str:
    names = hint.dim_str.split()
    return "[" + ", ".join(names) + "]" if names else "[] (a scalar)"


def _described(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype} array of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _suggestion(value: Any, hint: Any) -> str:
    arrays = [m for m in _members(hint) if _is_array_hint(m)]
    if not arrays:
        return ""
    if isinstance(value, (list, tuple)):
        return "; pass an array (jnp.asarray(...))"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return ""
    fixed = [m for m in arrays if all(not a.startswith("*") and a != "..." for a in m.dim_str.split())]
    if fixed and all(len(m.dim_str.split()) != len(shape) for m in fixed):
        expected = fixed[-1]  # the most axes: a [1]-shaped offset over a scalar one
        names = expected.dim_str.split()
        if len(names) == 2 and len(shape) > 2:
            return f"; reshape it to {_shape_of(expected)}, e.g. x.reshape(-1, x.shape[-1])"
        return f"; it needs {len(names)} axes {_shape_of(expected)}, not {len(shape)}"
    for member in fixed:
        names = member.dim_str.split()
        if len(names) == len(shape) and any(a.isdigit() and int(a) != n for a, n in zip(names, shape)):
            return f"; its shape must be {_shape_of(member)}"
    kinds = {m.__name__.split("[")[0].lower() for m in arrays}
    if "integer" in kinds and not jnp.issubdtype(dtype, jnp.integer):
        return "; cast it: x.astype(jnp.int32)"
    if "float" in kinds and not jnp.issubdtype(dtype, jnp.floating):
        return "; cast it: x.astype(jnp.float32) (or bfloat16)"
    return ""


def _dimension_conflict(op: str, arguments: dict[str, Any], hints: dict[str, Any]) -> Exception | None:
    """The first named axis two arguments give different sizes."""
    seen: dict[str, tuple[int, str, tuple[int, ...]]] = {}
    for name, value in arguments.items():
        shape = getattr(value, "shape", None)
        if shape is None or name not in hints:
            continue
        for member in _members(hints[name]):
            if not _is_array_hint(member):
                continue
            axes = member.dim_str.split()
            if len(axes) != len(shape) or any(a.startswith("*") or a == "..." for a in axes):
                continue
            for axis, size in zip(axes, shape):
                if axis == "_" or axis.isdigit():
                    continue
                if axis in seen and seen[axis][0] != size:
                    other_size, other, other_shape = seen[axis]
                    return ShapeError(
                        f"{name} has {axis}={size} (shape {tuple(shape)}), but {other} has "
                        f"{axis}={other_size} (shape {other_shape}): they must agree ({op})")
                seen.setdefault(axis, (int(size), name, tuple(shape)))
            break
    return None

