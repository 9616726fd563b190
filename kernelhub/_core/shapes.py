"""Static and symbolic dimensions: shape-polymorphic export (jax.export.symbolic_shape) gives
arrays dimensions that are no int, which every layer that sizes something by them must tell
apart."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def is_static(size: Any) -> bool:
    """Whether an array dimension is a number rather than a symbolic dimension."""
    return isinstance(size, (int, np.integer))


def symbolic_shapes(tree: Any) -> list[tuple[Any, ...]]:
    """The shapes, among the arrays and jax.ShapeDtypeStructs of `tree` (QuantizedArrays
    included, by their leaves), that hold a symbolic dimension."""
    return [tuple(leaf.shape) for leaf in jax.tree.leaves(tree)
            if not all(is_static(size) for size in getattr(leaf, "shape", ()))]
