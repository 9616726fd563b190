"""Ops implemented by other ops: for each backend, an implementation made of that backend's.

ragged_dot_general and ragged_dot (contract: kernelhub/ops/ragged_dot.py) are grouped matmuls
under transposes, reshapes and vmaps (kernelhub/_grouped_matmul/ragged_modes.py). For every
(platform, backend) that implements both grouped_matmul and transposed_grouped_matmul,
`register_ragged_dots` gives each an implementation that calls exactly those two, with their
priority and requirements; so forcing `pallas` runs ragged_dot on the Pallas kernels, and an
exported ragged_dot holds each target's. kernelhub/_loader.py calls it after the backends.
"""

from __future__ import annotations

from kernelhub._composite.ragged_dot import register_ragged_dots

__all__ = ["register_ragged_dots"]
