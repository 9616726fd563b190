"""Reading a dtype argument: one of a few allowed, or an error that names the argument."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def dtype_among(name: str, value: Any, allowed: Collection[np.dtype], described: str) -> np.dtype:
    """`value` as a dtype in `allowed`, else a TypeError saying `name` must be `described`."""
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        raise TypeError(f"{name} must be a dtype ({described}), got {value!r}") from None
    if dtype not in allowed:
        raise TypeError(f"{name} must be {described}, got {dtype}")
    return dtype


def promoted(*dtypes: Any) -> np.dtype:
    """jax's standard promotion of `dtypes` (bfloat16 with float32 is float32), whatever
    promotion mode the caller runs under: as jax.lax does, a kernel's dtypes are decided by the
    contract, not by the user's `jax.numpy_dtype_promotion("strict")`, which refuses them."""
    with jax.numpy_dtype_promotion("standard"):
        return np.dtype(jnp.result_type(*dtypes))
