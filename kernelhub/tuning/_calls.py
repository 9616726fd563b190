"""One kernel call as the tuner sees it: which implementation, op and pass, the problem's shape
and dtypes, the key a table files it under, and a way to run it with another tiling."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from kernelhub.quantization import QuantizedArray

# The kernels a grouped matmul and its gradients run.
GMM = "gmm"
GMM_TRANSPOSED_RHS = "gmm_t"  # rhs laid out [G, n, k]
TGMM = "tgmm"


@dataclasses.dataclass(frozen=True, order=True)
class KernelProblem:
    """The exact problem of one kernel call. `m` is the grouped axis (gmm's rows, tgmm's summed
    rows), `k` the other contraction or input axis, `n` the output's columns."""

    kernel: str
    m: int
    k: int
    n: int
    num_groups: int
    local_groups: int
    lhs_dtype: str
    rhs_dtype: str
    out_dtype: str
    has_existing: bool


@dataclasses.dataclass(frozen=True)
class TuningSpace:
    """What an implementation offers the tuner.

    candidates(problem) -> tilings to time (each a tuple the implementation's `tiling` takes);
    default(problem) -> the tiling its heuristic picks, as such a tuple;
    accepts(tiling, problem) -> whether a tiling tuned for a nearby shape is legal here.
    """

    implementation: str
    candidates: Callable[[KernelProblem], Sequence[tuple[int, ...]]]
    default: Callable[[KernelProblem], tuple[int, ...]]
    accepts: Callable[[tuple[int, ...], KernelProblem], bool] = lambda tiling, problem: True


def _bucket(size: int) -> int:
    """The power of two at or above `size`: shapes within a factor of two share an entry."""
    return 1 << max(int(size) - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True, order=True)
class TuningKey:
    """What a tuned tiling is filed under: where and in which pass the kernel runs, and its
    problem with m, k and n rounded up to powers of two. The group counts are exact and, with m,
    describe the group sizes coarsely (their mean). The sizes themselves are data, unknown when
    a call is traced; a table is tuned for one distribution of them, which its entries record."""

    device_kind: str
    implementation: str
    op: str
    pass_name: str
    problem: KernelProblem

    @classmethod
    def of(cls, device_kind: str, implementation: str, op: str, pass_name: str,
           problem: KernelProblem) -> TuningKey:
        bucketed = dataclasses.replace(problem, m=_bucket(problem.m), k=_bucket(problem.k),
                                       n=_bucket(problem.n))
        return cls(device_kind, implementation, op, pass_name, bucketed)

    def describe(self) -> str:
        p = self.problem
        return (f"{self.op} {self.pass_name} ({p.kernel} {p.m}x{p.k}x{p.n}, "
                f"{p.local_groups}/{p.num_groups} groups, {p.lhs_dtype} x {p.rhs_dtype} -> "
                f"{p.out_dtype}) on {self.implementation}, {self.device_kind}")


def dtype_name(operand: Any) -> str:
    """An operand's stored dtype: a quantized operand's values' dtype."""
    values = operand.values if isinstance(operand, QuantizedArray) else operand
    return np.dtype(values.dtype).name


def device_kind() -> str:
    """The kind of device jax runs on here ("cpu", "NVIDIA H100 80GB HBM3", "TPU v5 lite")."""
    return jax.devices()[0].device_kind


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
    problem: KernelProblem
    arrays: Arrays
    invoke: Callable[[Arrays, Any], jax.Array]

    def run(self, tiling: Any) -> jax.Array:
        return self.invoke(self.arrays, tiling)

    def key(self, device: str | None = None) -> TuningKey:
        return TuningKey.of(device or device_kind(), self.space.implementation, self.op,
                            self.pass_name, self.problem)

    def with_arrays(self, arrays: Arrays) -> KernelCall:
        return dataclasses.replace(self, arrays=arrays)


def gmm_call(space: TuningSpace, op: str, pass_name: str, raw: Callable, lhs, rhs, group_sizes,
             preferred_element_type, group_offset, existing_out, transpose_rhs: bool) -> KernelCall:
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    problem = KernelProblem(GMM_TRANSPOSED_RHS if transpose_rhs else GMM, m, k, n,
                            group_sizes.shape[0], rhs.shape[0], dtype_name(lhs), dtype_name(rhs),
                            np.dtype(preferred_element_type).name, existing_out is not None)

    def invoke(arrays: Arrays, tiling: Any) -> jax.Array:
        lhs, rhs, group_sizes, group_offset, existing_out = arrays
        return raw(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                   existing_out, transpose_rhs)

    return KernelCall(space, op, pass_name, problem,
                      (lhs, rhs, group_sizes, group_offset, existing_out), invoke)


def tgmm_call(space: TuningSpace, op: str, pass_name: str, raw: Callable, lhs, rhs, group_sizes,
              preferred_element_type, group_offset, num_actual_groups, existing_out) -> KernelCall:
    k, m = lhs.shape
    num_groups = group_sizes.shape[0]
    problem = KernelProblem(TGMM, m, k, rhs.shape[1], num_groups, num_actual_groups or num_groups,
                            dtype_name(lhs), dtype_name(rhs),
                            np.dtype(preferred_element_type).name, existing_out is not None)

    def invoke(arrays: Arrays, tiling: Any) -> jax.Array:
        lhs, rhs, group_sizes, group_offset, existing_out = arrays
        return raw(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                   num_actual_groups, existing_out)

    return KernelCall(space, op, pass_name, problem,
                      (lhs, rhs, group_sizes, group_offset, existing_out), invoke)
