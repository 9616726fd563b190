"""The one way a backend's grouped matmuls become implementations of both ops.

A backend supplies raw forward kernels (arguments as the contracts hand them on, no autodiff of
their own) and its tuning space; `register_grouped_matmuls` adds, once for all backends:

1. the empty-shape results (kernelhub/_grouped_matmul/prologue.py), so kernels see no empty axis;
2. with `fold_scales`, quantized operands' per-row and per-column scales applied around the
   kernels (kernelhub/_grouped_matmul/scale_folding.py), for kernels that take int8 and fp8
   arrays with `scales=`/`output_blocks=` (int4 and float4_e2m1fn ones too, for a backend
   with the quantized_4bit feature); without it the kernels take QuantizedArrays;
3. exact gradients built from the same kernels, each pass with its own tiling
   (kernelhub/_grouped_matmul/autodiff.py);
4. jax.jit with the contracts' static arguments, and registration of both ops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import jax

from kernelhub._core.registry import Backend, Platform, register
from kernelhub._grouped_matmul import names
from kernelhub._grouped_matmul.autodiff import Differentiable, differentiable
from kernelhub._grouped_matmul.passes import TuningSpace
from kernelhub._grouped_matmul.prologue import RawKernel, guarded
from kernelhub._grouped_matmul.scale_folding import folded

GMM_STATIC = ("preferred_element_type", "tiling", "transpose_rhs", "activation", "glu",
              "glu_layout")
TGMM_STATIC = ("preferred_element_type", "tiling", "num_actual_groups")


def implementations(raw_gmm: RawKernel, raw_tgmm: RawKernel, space: TuningSpace, *,
                    fold_scales: bool) -> Differentiable:
    """Both ops, jitted and differentiable, from a backend's raw kernels (steps 1-4 but the
    registration): also for variants a backend offers beside its registered ones."""
    if fold_scales:
        raw_gmm, raw_tgmm = folded(raw_gmm, raw_tgmm)
        space = dataclasses.replace(space, folds_scales=True)
    ops = differentiable(*guarded(raw_gmm, raw_tgmm), space)
    return Differentiable(
        jax.jit(ops.grouped_matmul, static_argnames=GMM_STATIC),
        jax.jit(ops.transposed_grouped_matmul, static_argnames=TGMM_STATIC))


def register_grouped_matmuls(platform: Platform | str, backend: Backend | str,
                             raw_gmm: RawKernel, raw_tgmm: RawKernel, space: TuningSpace, *,
                             features: Iterable[str], fold_scales: bool, priority: int = 0,
                             requirement: Callable[[], str | None] | None = None,
                             interpret_only: bool = False) -> Differentiable:
    """Registers grouped_matmul and transposed_grouped_matmul for (platform, backend) and
    returns them. The ops must be declared (importing kernelhub.ops does)."""
    ops = implementations(raw_gmm, raw_tgmm, space, fold_scales=fold_scales)
    # Every backend's VJP is the kit's (autodiff.py): the same residuals for the same arguments.
    how = dict(features=tuple(features), interpret_only=interpret_only, residuals=names.KIT_VJP)
    if requirement is not None:
        how["requirement"] = requirement
    register(names.GROUPED_MATMUL, platform, backend, priority, **how)(ops.grouped_matmul)
    register(names.TRANSPOSED_GROUPED_MATMUL, platform, backend, priority,
             **how)(ops.transposed_grouped_matmul)
    return ops
