"""Scale blocks in the Mosaic GPU kernels (what they mean: kernelhub/_grouped_matmul/
contraction_scales.py).

Three kinds run in the kernels:
- Blocks along k (ContractionScales: the forward of a call with scale blocks). Each step lies
  inside one block of every scaled operand; its sums, in accumulators of their own, are
  multiplied by the step's row scales (lhs) and column scales (the group's rhs) and added to
  float32 totals carried in registers (scale_fitting.within_scale_block), in one compute warpgroup
  or in each of two (gmm_warp_specialized.py). The other two run in one compute warpgroup:
- Blocks of the weights along gmm's output columns (OutputBlockScales' rhs: the lhs gradient of
  such a call, whose weights meet the cotangent along their other axis). An output tile lies
  inside one block (scale_fitting.within_output_block), so the weights' scales for it vary along k
  only: each step's lhs tile, in float32, is multiplied by the block's scales for the step as it
  is copied to shared memory, and the 8-bit weights are multiplied as stored (converted per
  tile to float32 where the tiling's `upcast` applies).
- In tgmm, blocks of lhs along k, its output rows (OutputBlockScales' lhs: the weight gradient of
  such a call, the activations transposed [k, m] meeting the cotangent). An output tile's rows lie
  inside one block (scale_fitting.within_output_block), so its activations' scales vary along the
  summed rows only: each chunk's 8-bit lhs tile, converted to float32 (the tiling's upcast), is
  multiplied by its block's scales for the chunk's rows in the pass that selects them, beside the
  cotangent in float32.
Every other case is widened to float32 before the kernel (contraction_scales.dequantized):
blocks along gmm lhs's rows, tgmm's blocks along the summed rows or of rhs, blocks of both kinds
in one call, and blocks shorter than a wgmma step or than an output tile's least rows or
columns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernelhub._grouped_matmul import contraction_scales
from kernelhub._grouped_matmul.contraction_scales import (NO_SCALES, ContractionScales,
                                                          OutputBlockScales)
from kernelhub._grouped_matmul.problem import Problem
from kernelhub._pallas.mosaic_gpu import kernel_parts, scale_fitting
from kernelhub._pallas.mosaic_gpu.kernel_parts import padded


class Plan(NamedTuple):
    """Which scale blocks a call takes into its kernel.

    scales: those along gmm's k (NO_SCALES for none).
    tile_block: the block along the output columns (gmm's weights) or rows (tgmm's lhs) when
      lhs tiles are scaled, or None.
    tile_scales: then the scales as [G, column blocks, k] (gmm) or [row blocks, m] (tgmm),
      float32.
    """

    scales: ContractionScales
    tile_block: int | None = None
    tile_scales: jax.Array | None = None
    # Whether the call had scale blocks at all (some perhaps widened first): its tiles are then
    # wider than its table key's types say (config.from_tiling's `wider_than_key`).
    blocks_given: bool = True

    @property
    def in_kernel(self) -> bool:
        """Whether the kernel applies scale blocks itself."""
        return bool(self.scales.arrays) or self.tile_block is not None

    @property
    def scale_block(self) -> int | None:
        """For config.from_tiling: the length every block along k is made of."""
        return self.scales.common_block if self.scales.arrays else None


NOTHING = Plan(NO_SCALES, blocks_given=False)
WIDENED = Plan(NO_SCALES)  # every block widened before the kernel


def planned(lhs: jax.Array, rhs: jax.Array, scales: ContractionScales | None,
            output_blocks: OutputBlockScales | None, transpose_rhs: bool,
            problem_of: Callable[[jax.Array, jax.Array], Problem]
            ) -> tuple[jax.Array, jax.Array, Problem, Plan]:
    """(lhs, rhs, their problem, the plan): operands whose blocks the kernel does not take
    widened first, and lhs in float32 where its tiles are scaled."""
    along_k = scales is not None and bool(scales.arrays)
    across = output_blocks is not None and bool(output_blocks.arrays)
    if across:
        plan, lhs = _output_columns(lhs, rhs, output_blocks, transpose_rhs, problem_of,
                                    along_k)
        if plan is None:
            lhs, rhs = contraction_scales.dequantized(lhs, rhs, output_blocks, tgmm=False,
                                                      transpose_rhs=transpose_rhs)
        else:
            return lhs, rhs, problem_of(lhs, rhs), plan
    problem = problem_of(lhs, rhs)
    if not along_k:
        return lhs, rhs, problem, WIDENED if across else NOTHING
    if scale_fitting.scale_steps_fit(problem, scales.common_block):
        return lhs, rhs, problem, Plan(scales)
    lhs, rhs = contraction_scales.dequantized(lhs, rhs, scales, tgmm=False,
                                              transpose_rhs=transpose_rhs)
    return lhs, rhs, problem_of(lhs, rhs), WIDENED


def _output_columns(lhs, rhs, output_blocks: OutputBlockScales, transpose_rhs: bool,
                    problem_of, along_k: bool) -> tuple[Plan | None, jax.Array]:
    """The plan for blocks of the weights along the output columns with lhs in float32 (and
    that lhs), or None where the kernel does not take them (module docstring)."""
    if along_k or output_blocks.lhs is not None or not jnp.issubdtype(lhs.dtype, jnp.floating):
        return None, lhs
    if jnp.dtype(lhs.dtype).itemsize == 1:
        return None, lhs
    wide = lhs.astype(jnp.float32)
    if not scale_fitting.output_block_fits(problem_of(wide, rhs), output_blocks.rhs_block):
        return None, lhs
    # [G, column blocks, k], whichever way the weights lie.
    tile_scales = output_blocks.rhs.astype(jnp.float32)
    if not transpose_rhs:
        tile_scales = jnp.swapaxes(tile_scales, 1, 2)
    return Plan(NO_SCALES, output_blocks.rhs_block, tile_scales), wide


def planned_tgmm(lhs: jax.Array, rhs: jax.Array, scales: ContractionScales | None,
                 output_blocks: OutputBlockScales | None,
                 problem_of: Callable[[jax.Array, jax.Array], Problem]
                 ) -> tuple[jax.Array, jax.Array, Problem, Plan]:
    """`planned` for tgmm: lhs [k, m] with blocks along k taken into the kernel (rhs in
    float32), every other kind widened first."""
    along_m = scales is not None and bool(scales.arrays)
    if along_m:
        lhs, rhs = contraction_scales.dequantized(lhs, rhs, scales, tgmm=True)
    if output_blocks is None or not output_blocks.arrays:
        return lhs, rhs, problem_of(lhs, rhs), WIDENED if along_m else NOTHING
    if (output_blocks.rhs is None and jnp.dtype(lhs.dtype).itemsize == 1
            and jnp.issubdtype(rhs.dtype, jnp.floating) and jnp.dtype(rhs.dtype).itemsize > 1):
        wide = rhs.astype(jnp.float32)
        problem = problem_of(lhs, wide)
        if scale_fitting.output_block_fits(problem, output_blocks.lhs_block):
            return lhs, wide, problem, Plan(NO_SCALES, output_blocks.lhs_block,
                                            output_blocks.lhs.astype(jnp.float32))
    lhs, rhs = contraction_scales.dequantized(lhs, rhs, output_blocks, tgmm=True)
    return lhs, rhs, problem_of(lhs, rhs), WIDENED


def kernel_arrays(plan: Plan, transpose_rhs: bool, k_tiles: int, bk: int, m_p: int, k_p: int,
                  halves: int, n_p: int, interleaved: bool) -> list[jax.Array]:
    """The plan's scale arrays as the kernel reads them, in this order: lhs's step scales
    [k steps, m_p], rhs's [G, k steps, columns laid out as the kernel's weights], the weights'
    tile scales [G, column blocks, k_p]. `transpose_rhs` is the call's (the scales' layout)."""
    arrays = []
    scales = plan.scales
    if scales.lhs is not None:
        arrays.append(padded(_per_step(scales.lhs, 1, scales.lhs_block, k_tiles, bk).T,
                             {1: m_p}))
    if scales.rhs is not None:
        rhs = jnp.swapaxes(scales.rhs, 1, 2) if transpose_rhs else scales.rhs  # [G, k, n]
        per_step = _per_step(rhs, 1, scales.rhs_block, k_tiles, bk)
        if interleaved:
            per_step = kernel_parts.concatenated(per_step, 2)
        arrays.append(kernel_parts.halves_padded(per_step, 2, halves, n_p))
    if plan.tile_scales is not None:
        arrays.append(padded(plan.tile_scales, {2: k_p}))
    return arrays


def added_step(totals: tuple, multiply: Callable[[tuple], None], shape: tuple[int, int],
               multiplied, rows: Callable[[], jax.Array] | None,
               columns: Callable[[int], jax.Array] | None) -> tuple:
    """`totals` (float32, one per accumulator of a scaled-steps gmm) plus one k step's sums,
    each scaled: `multiply(accumulators)` issues the step's products into fresh accumulators
    of `shape`; `rows()` reads the step's row scales [rows], `columns(i)` accumulator i's
    column scales [columns] (each None where that operand has no scale blocks)."""
    from jax.experimental import pallas as pl

    def step_sums(*accumulators):
        multiply(accumulators)
        # Reading the sums waits for the products: the step's tiles are free after it.
        return tuple(kernel_parts.sums(acc) for acc in accumulators)

    sums = pl.run_scoped(step_sums, *[kernel_parts.accumulator(shape, multiplied)
                                      for _ in totals])
    row_scales = None if rows is None else kernel_parts.broadcast_rows(rows(), shape)
    updated = []
    for index, (total, part) in enumerate(zip(totals, sums)):
        if row_scales is not None:
            part = part * row_scales
        if columns is not None:
            part = part * kernel_parts.broadcast_columns(columns(index), shape)
        updated.append(total + part)
    return tuple(updated)


def _per_step(scale: jax.Array, axis: int, block: int, k_tiles: int, bk: int) -> jax.Array:
    """A scale array with blocks along `axis`, as one float32 vector per contraction step
    (each step lies inside one block: scale_fitting.within_scale_block)."""
    return jnp.take(scale.astype(jnp.float32), np.arange(k_tiles) * bk // block, axis=axis)
