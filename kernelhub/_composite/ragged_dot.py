"""ragged_dot_general and ragged_dot from one backend's grouped matmuls (see __init__.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from kernelhub._core import registry as _registry
from kernelhub._core.dispatch import Pinned
from kernelhub._core.registry import KernelSpec
from kernelhub.ops import GROUPED_MATMUL, TRANSPOSED_GROUPED_MATMUL
from kernelhub.ops import ragged_dot as contract
from kernelhub._grouped_matmul.ragged_modes import plan, run


def _implementations(gmm: Callable[..., Any], tgmm: Callable[..., Any]):
    def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                           preferred_element_type=None, group_offset=None, out_sharding=None,
                           activation=None):
        del precision  # met by the kernels' float32 accumulation
        p = plan(lhs.shape, rhs.shape, ragged_dot_dimension_numbers, group_sizes.shape[-1])
        out = run(p, lhs, rhs, group_sizes, group_offset, preferred_element_type, gmm, tgmm,
                  activation)
        return out if out_sharding is None else jax.sharding.reshard(out, out_sharding)

    def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
                   group_offset=None, out_sharding=None, activation=None):
        return ragged_dot_general(lhs, rhs, group_sizes, contract.BASIC_DIMENSION_NUMBERS,
                                  precision, preferred_element_type, group_offset, out_sharding,
                                  activation)

    return ragged_dot_general, ragged_dot


def _both(first: KernelSpec, second: KernelSpec) -> Callable[[], str | None]:
    def requirement() -> str | None:
        return first.unavailable_reason() or second.unavailable_reason()

    return requirement


def register_ragged_dots() -> None:
    tgmm_specs = {(s.platform, s.backend): s for s in _registry.implementations(TRANSPOSED_GROUPED_MATMUL)}
    for gmm in _registry.implementations(GROUPED_MATMUL):
        tgmm = tgmm_specs.get((gmm.platform, gmm.backend))
        if tgmm is None:
            continue
        general, simple = _implementations(Pinned(gmm), Pinned(tgmm))
        how = dict(priority=max(gmm.priority, tgmm.priority), requirement=_both(gmm, tgmm),
                   interpret_only=gmm.interpret_only or tgmm.interpret_only,
                   features=gmm.features & tgmm.features,
                   residuals=gmm.residuals if gmm.residuals == tgmm.residuals else None)
        _registry.register(contract.NAME, gmm.platform, gmm.backend, **how)(general)
        _registry.register(contract.SIMPLE_NAME, gmm.platform, gmm.backend, **how)(simple)
