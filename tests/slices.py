"""Slices of parametrized products, for CI's time: cases in which every pair of values of any two
parameters meets at least once (all-pairs testing), so that an implementation meets every dtype,
every block size and every layout, but not in every combination.

KERNELHUB_TEST_WHOLE_PRODUCTS=1 runs every product whole.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

import pytest

_PARAM = type(pytest.param(None))  # pytest's ParameterSet, without its private module

WHOLE_PRODUCTS = os.environ.get("KERNELHUB_TEST_WHOLE_PRODUCTS") == "1"


def all_pairs_indices(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Index tuples into axes of these sizes, in product order, meeting every pair of indices of
    any two axes; chosen greedily (each next case the first that meets the most unmet pairs)."""
    product = list(itertools.product(*map(range, sizes)))
    if WHOLE_PRODUCTS or len(sizes) < 3:  # two axes: every pair is the whole product
        return product

    def pairs(case):
        return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}

    unmet = set().union(*map(pairs, product))
    chosen = set()
    while unmet:
        best = max(product, key=lambda case: len(pairs(case) & unmet))
        chosen.add(best)
        unmet -= pairs(best)
    return sorted(chosen)


def all_pairs(*axes: Sequence) -> list:
    """pytest params over the product of `axes` (values or pytest.param of one value each) that
    meet every pair of values of any two axes; ids joined from the values' ids."""
    def value_and_id(value):
        if isinstance(value, _PARAM):
            return value.values[0], value.id
        return value, getattr(value, "__name__", None) or str(value)

    axes = [[value_and_id(value) for value in axis] for axis in axes]
    return [pytest.param(*(axis[i][0] for axis, i in zip(axes, case)),
                         id="-".join(str(axis[i][1]) for axis, i in zip(axes, case)))
            for case in all_pairs_indices([len(axis) for axis in axes])]


def each_value_once(first: Sequence, second: Sequence, turn: int = 0) -> list:
    """pytest params pairing two axes (values or pytest.param of one value each) so that each
    value of each meets some value of the other, not every pair: as many cases as the longer
    axis, the i-th taking first[i] and second[i + turn], cycling. `turn` shifts which values
    meet (two tests over the same axes meet other pairs)."""
    def value_and_id(value):
        if isinstance(value, _PARAM):
            return value.values[0], value.id
        return value, getattr(value, "__name__", None) or str(value)

    first, second = [value_and_id(v) for v in first], [value_and_id(v) for v in second]
    cases = [(first[i % len(first)], second[(i + turn) % len(second)])
             for i in range(max(len(first), len(second)))]
    return [pytest.param(a, b, id=f"{a_id}-{b_id}") for (a, a_id), (b, b_id) in cases]
