"""What the autotuner may change in the XLA loops: the largest row chunk (`tiling[0]`), and for
tgmm's kernel the rows per group of its batched head (`tiling[3]`).

The loops' other chunk sizes are fixed (kernelhub/_xla/_row_chunks.py says why: each size is
compiled code of its own). The largest chunk trades matmul efficiency on big groups against
padding and masking on small ones, and for tgmm how many passes over the [k, n] sum a group
costs. The head sums every group's first rows in one batched matmul, padding smaller groups:
with even sizes the heuristic's capacity (the even share) finishes every group there, with
skewed ones most of its slots are padding and the large groups' rest still loops. Both depend
on the group sizes, which only a measurement sees. k and n of the tuple are not used; the
candidates carry the problem's own.
"""

from __future__ import annotations

from kernelhub._xla._row_chunks import (
    DEFAULT_LARGEST_CHUNK, head_capacity, head_rows, largest_chunk)
from kernelhub._grouped_matmul.passes import TuningSpace
from kernelhub._grouped_matmul.problem import Kernel, Problem

LARGEST_CHUNKS = (64, 128, 256, 512, 1024, 2048)
# Head rows tried besides none: powers of two from this up to twice the even share.
SMALLEST_HEAD = 8


def _default(problem: Problem) -> tuple[int, ...]:
    k, n = max(problem.k, 1), max(problem.n, 1)
    if problem.kernel is Kernel.TGMM:
        return (DEFAULT_LARGEST_CHUNK, k, n, head_capacity(problem.m, problem.num_groups))
    return (DEFAULT_LARGEST_CHUNK, k, n)


def _heads(problem: Problem) -> list[int]:
    even_share = problem.m // max(problem.num_groups, 1)
    heads, rows = [0], SMALLEST_HEAD
    while rows <= min(2 * even_share, problem.m):
        heads.append(rows)
        rows *= 2
    return heads


def _candidates(problem: Problem) -> list[tuple[int, ...]]:
    # A chunk above the rows is the same code as the rows' own power of two.
    chunks = [rows for rows in LARGEST_CHUNKS if rows < 2 * max(problem.m, 1)]
    default = _default(problem)
    found = [(rows, *default[1:]) for rows in chunks]
    if problem.kernel is Kernel.TGMM:
        # Each knob varied with the other at its default: a cross, not the whole product,
        # keeps tuning to minutes (each candidate is a compile and a few timed runs).
        found += [(*default[:3], head) for head in _heads(problem)]
    return list(dict.fromkeys(found))


def _accepts(tiling: tuple[int, ...], problem: Problem, epilogue: object = None) -> bool:
    # (A fused epilogue changes no rule of these kernels' tilings.)
    try:
        largest_chunk(tiling, problem.m, problem.k, problem.n)
        head_rows(tiling, problem.m, problem.k, problem.n, problem.num_groups)
    except ValueError:
        return False
    return True


SPACE = TuningSpace("xla", _candidates, _default, _accepts)
