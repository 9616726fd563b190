"""One kernel call of one pass, and the tiling it runs with.

A differentiated grouped matmul runs a kernel per pass (forward, lhs_gradient, rhs_gradient:
kernelhub/_grouped_matmul/tilings.py). `KernelCall` is such a call as the tiling choice and the
autotuner see it: the implementation's tuning space, the op and pass, its `Problem`, its arrays
and a way to run it with any tiling. `run` makes the call with the tiling it gets, in this
order: the caller's entry for its pass, the tuning table in force, the table shipped for this
device kind, the backend's heuristic (kernelhub/_grouped_matmul/tables.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from kernelhub._grouped_matmul import scale_folding, tables
from kernelhub._grouped_matmul.epilogue import NO_EPILOGUE, Epilogue, KernelEpilogue
from kernelhub._grouped_matmul.problem import Problem, gmm_problem, tgmm_problem
from kernelhub._grouped_matmul.tilings import Tilings, in_pass


@dataclasses.dataclass(frozen=True)
class TuningSpace:
    """What a backend offers the tuner, beside its kernels.

    candidates(problem) -> tilings to time (each a tuple the backend's `tiling` takes);
    default(problem) -> the tiling its heuristic picks, as such a tuple;
    accepts(tiling, problem, epilogue) -> whether a tiling tuned for a nearby shape, without
      a fused epilogue, is legal for this problem under `epilogue` (a gated unit's second
      weight tile may not fit beside a tiling that the plain call's does);
    times_epilogue(epilogue, transpose_rhs) -> whether a table's time for a gmm call's kernel
    problem is also the call's time under that fused epilogue, with the weights laid out as
    the call has them. Tables are tuned without epilogues; a backend that does more for one (a
    copy of an operand) says False, and such a call then has no measured time
    (kernelhub/_grouped_matmul/measured.py);
    folds_scales: whether the kernels take quantized operands with their scales folded
    (kernelhub/_grouped_matmul/scale_folding.py; registration sets it): `candidates`,
    `default` and `accepts` are then asked about the problem those kernels get
    (KernelCall.kernel_problem), not the key's.
    """

    implementation: str
    candidates: Callable[[Problem], Sequence[tuple[int, ...]]]
    default: Callable[[Problem], tuple[int, ...]]
    accepts: Callable[[tuple[int, ...], Problem, Epilogue], bool] = (
        lambda tiling, problem, epilogue=None: True)
    times_epilogue: Callable[[Epilogue, bool], bool] = lambda epilogue, transpose_rhs: True
    folds_scales: bool = False


# Arrays of a call: (lhs, rhs, group_sizes, group_offset, existing_out); every other argument
# of the raw kernel is fixed by the call.
Arrays = tuple[Any, Any, Any, Any, Any]


@dataclasses.dataclass(frozen=True, eq=False)
class KernelCall:
    """A raw kernel call of one pass: `run(tiling)` makes it with `tiling`, and `with_arrays`
    gives the same call on other arrays of the same shapes (the tuner's timing copies)."""

    space: TuningSpace
    op: str
    pass_name: str
    problem: Problem
    arrays: Arrays
    invoke: Callable[[Arrays, Any], jax.Array]
    # Whether the tables' entry for this call's key times it (TuningSpace.times_epilogue).
    timed_by_tables: bool = True
    # The fused epilogue the kernel runs (a table's tiling must suit it: TuningSpace.accepts).
    epilogue: Epilogue = NO_EPILOGUE.spec

    def run(self, tiling: Any) -> jax.Array:
        return self.invoke(self.arrays, tiling)

    @property
    def kernel_problem(self) -> Problem:
        """The problem the kernel multiplies: `problem` (which the tuning key names) with the
        types of the operands a quantized operand's scale is folded into (float32), where the
        backend folds them; a tiling is judged and drawn for it (a tables' tiling for bf16
        x int8 may not fit the float32 tiles of that call's lhs gradient)."""
        if not self.space.folds_scales:
            return self.problem
        return scale_folding.folded_problem(self.problem, self.arrays[0], self.arrays[1])

    def key(self, device: str | None = None) -> tables.TuningKey:
        return tables.TuningKey.of(device or tables.device_kind(), self.space.implementation,
                                   self.op, self.pass_name, self.problem)

    def with_arrays(self, arrays: Arrays) -> KernelCall:
        return dataclasses.replace(self, arrays=arrays)


def gmm_call(space: TuningSpace, op: str, pass_name: str, raw: Callable, lhs, rhs, group_sizes,
             preferred_element_type, group_offset, existing_out, transpose_rhs: bool,
             epilogue: KernelEpilogue = NO_EPILOGUE) -> KernelCall:
    problem = gmm_problem(lhs, rhs, group_sizes, preferred_element_type,
                          existing_out is not None, transpose_rhs)
    # Only a call with an epilogue passes one: a raw kernel without that option serves the rest.
    options = {} if epilogue.is_identity else {"epilogue": epilogue}

    def invoke(arrays: Arrays, tiling: Any) -> jax.Array:
        lhs, rhs, group_sizes, group_offset, existing_out = arrays
        return raw(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                   existing_out, transpose_rhs, **options)

    return KernelCall(space, op, pass_name, problem,
                      (lhs, rhs, group_sizes, group_offset, existing_out), invoke,
                      timed_by_tables=space.times_epilogue(epilogue.spec, transpose_rhs),
                      epilogue=epilogue.spec)


def tgmm_call(space: TuningSpace, op: str, pass_name: str, raw: Callable, lhs, rhs, group_sizes,
              preferred_element_type, group_offset, num_actual_groups, existing_out) -> KernelCall:
    problem = tgmm_problem(lhs, rhs, group_sizes, preferred_element_type,
                           existing_out is not None, num_actual_groups)

    def invoke(arrays: Arrays, tiling: Any) -> jax.Array:
        lhs, rhs, group_sizes, group_offset, existing_out = arrays
        return raw(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                   num_actual_groups, existing_out)

    return KernelCall(space, op, pass_name, problem,
                      (lhs, rhs, group_sizes, group_offset, existing_out), invoke)


def run(tilings: Tilings, call: KernelCall) -> jax.Array:
    """Makes `call` with the tiling its pass gets; a kernel's tiling error names the pass."""
    tables.observe(call)
    tiling = tables.choose(tilings.for_pass(call.pass_name), tilings.tuning, call)
    try:
        return call.run(tiling)
    except ValueError as error:
        if tiling is None or not str(error).startswith("tiling"):
            raise
        raise in_pass(error, call.pass_name) from None
