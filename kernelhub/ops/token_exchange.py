"""The contract of `token_exchange`: every device sends each other device a run of its rows.

This is the collective of expert parallelism with routed tokens: rows sorted by the device that
owns their expert go there, and the results come back the same way. One implementation per
backend: `jax.lax.ragged_all_to_all` where XLA implements it (TPU, GPU), and a fixed-capacity
`jax.lax.all_to_all` everywhere else (XLA:CPU has no ragged all-to-all).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Integer, Shaped

from kernelhub._core import value_checks
from kernelhub._core.define import define_op
from kernelhub.ops import _checks
from kernelhub._grouped_matmul.groups import running_sum

NAME = "token_exchange"

ArrayIn = jax.Array | np.ndarray


class ExchangedRows(NamedTuple):
    """What `token_exchange` returns on each device."""

    received: Shaped[jax.Array, "devices capacity features"]
    received_sizes: Integer[jax.Array, "devices"]
    dropped: Integer[jax.Array, ""]


def _axis_size(axis_name: Any) -> int:
    if not isinstance(axis_name, str):
        raise TypeError(
            f"axis_name must be a str naming a mesh axis, got {type(axis_name).__name__}")
    try:
        return jax.lax.axis_size(axis_name)
    except NameError:
        raise ValueError(
            f"axis_name={axis_name!r} is not a bound mesh axis here: call {NAME} inside "
            f"jax.shard_map over a mesh that has this axis"
        ) from None


def _run_bounds(name: str, value: Any, devices: int) -> jax.Array:
    array = _checks.as_array(value)
    if not jnp.issubdtype(array.dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype (int32), got {array.dtype}")
    if array.shape != (devices,):
        raise ValueError(
            f"{name} must have shape ({devices},), one entry per device of the mesh axis, got "
            f"{array.shape}"
        )
    if _checks.is_concrete(value):
        value_checks.check_values(lambda host: _non_negative(name, host), value, call=NAME)
    return _checks.as_int32(array)


def _non_negative(name: str, host: np.ndarray) -> None:
    if np.any(host < 0):
        bad = np.flatnonzero(host < 0)[:5].tolist()
        raise ValueError(f"{name} must be >= 0; negative at devices {bad}")


def _check_runs_fit(send_sizes: Any, send_offsets: Any, rows: int) -> None:
    """With concrete values: every run must end within the rows."""
    if not _checks.is_concrete(send_sizes) or not _checks.is_concrete(send_offsets):
        return

    def check(sizes: np.ndarray, *offsets: np.ndarray) -> None:
        sizes = np.asarray(sizes, np.int64)
        starts = np.cumsum(sizes) - sizes if not offsets else np.asarray(offsets[0], np.int64)
        past = np.flatnonzero(starts + sizes > rows)
        if past.size:
            raise ValueError(
                f"send_sizes and send_offsets must keep every run within the {rows} rows of "
                f"rows; the runs to devices {past[:5].tolist()} end past it")

    value_checks.check_values(check, send_sizes,
                              *(() if send_offsets is None else (send_offsets,)), call=NAME)


def _prepare(arguments: dict[str, Any]) -> dict[str, Any]:
    rows = _checks.as_array(arguments["rows"])
    if not (jnp.issubdtype(rows.dtype, jnp.floating) or jnp.issubdtype(rows.dtype, jnp.integer)):
        raise TypeError(f"rows must have a float or integer dtype, got {rows.dtype}")
    capacity = arguments["capacity"]
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise TypeError(
            f"capacity must be a positive int (rows per pair of devices), got {capacity!r}")
    devices = _axis_size(arguments["axis_name"])
    send_sizes = _run_bounds("send_sizes", arguments["send_sizes"], devices)
    if arguments["send_offsets"] is None:
        send_offsets = running_sum(send_sizes) - send_sizes
    else:
        send_offsets = _run_bounds("send_offsets", arguments["send_offsets"], devices)
    _check_runs_fit(arguments["send_sizes"], arguments["send_offsets"], rows.shape[0])
    return dict(rows=rows, send_sizes=send_sizes, capacity=int(capacity),
                axis_name=arguments["axis_name"], send_offsets=send_offsets)


@define_op(validate=_prepare)
def token_exchange(
    rows: Shaped[ArrayIn, "rows features"],
    send_sizes: Integer[ArrayIn, "devices"],
    capacity: int,
    axis_name: str,
    send_offsets: Integer[ArrayIn, "devices"] | None = None,
) -> ExchangedRows:
    """Sends rows[send_offsets[p] : send_offsets[p] + send_sizes[p]] to device p, for every p.

    Called on every device of the mesh axis `axis_name` at once (inside `jax.shard_map`), as any
    collective. Buffers have a fixed size: at most `capacity` rows travel from one device to
    another, and the rows past it are counted in `dropped`, never lost silently.

    Args:
      rows: [rows, features] of any float or integer dtype: what this device sends.
      send_sizes: [devices] integers >= 0, devices = the size of the mesh axis `axis_name`. How
        many rows go to each device (this device included).
      capacity: static int >= 1, the most rows one device receives from one other. See
        `kernelhub.parallel.safe_capacity` for a size that can never overflow.
      axis_name: the mesh axis the exchange runs over.
      send_offsets: [devices] integers >= 0, where each device's run starts in `rows`. None
        means the runs are packed in device order: the exclusive cumulative sum of send_sizes.
        Requires send_offsets[p] + send_sizes[p] <= rows.

    Returns:
      ExchangedRows(received, received_sizes, dropped), on each device:
        received: [devices, capacity, features] of rows' dtype. received[s, :received_sizes[s]]
          are the rows device s sent here, in their order; every other entry is exactly 0.
        received_sizes: [devices] int32, min(send_sizes, capacity) of each sender for this
          device.
        dropped: int32 scalar, the rows this device did not send because a run exceeded
          `capacity` (sum over p of send_sizes[p] - min(send_sizes[p], capacity)). Sum it over
          the axis for the global count.

    Gradients: exact for rows (the cotangent of a received row flows back to the row sent, a
    dropped row gets 0); the sizes take none.

    Raises:
      TypeError or ValueError naming the argument for bad ranks, dtypes, a capacity that is not
      a positive int, an axis_name not bound here, a send_sizes or send_offsets length that is
      not the axis size, and (when the values are concrete) negative sizes or offsets and runs
      past the end of rows. Under jit the runs are clamped to rows, so bad sizes give
      unspecified values but never out-of-bounds memory access.
    """
