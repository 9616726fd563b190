"""tests/slices.py: the sliced products still meet every pair of values, and are whole on demand."""

from __future__ import annotations

import itertools

import pytest

import slices


@pytest.mark.parametrize("sizes", [(3, 3, 2, 3), (3, 2, 2), (4, 3, 2), (5, 3, 3, 2, 2)])
def test_every_pair_of_values_of_any_two_axes_meets(sizes, monkeypatch):
    monkeypatch.setattr(slices, "WHOLE_PRODUCTS", False)
    cases = slices.all_pairs_indices(sizes)
    assert len(set(cases)) == len(cases) < len(list(itertools.product(*map(range, sizes))))
    for i, j in itertools.combinations(range(len(sizes)), 2):
        assert {(case[i], case[j]) for case in cases} == set(
            itertools.product(range(sizes[i]), range(sizes[j]))), (i, j)


def test_two_axes_and_whole_products_are_the_product(monkeypatch):
    monkeypatch.setattr(slices, "WHOLE_PRODUCTS", False)
    assert slices.all_pairs_indices((3, 4)) == list(itertools.product(range(3), range(4)))
    monkeypatch.setattr(slices, "WHOLE_PRODUCTS", True)
    assert len(slices.all_pairs_indices((3, 3, 2))) == 18


def test_params_carry_each_values_id():
    params = slices.all_pairs([pytest.param("a", id="first")], [1, 2], [None])
    assert [p.id for p in params] == ["first-1-None", "first-2-None"]
    assert [p.values for p in params] == [("a", 1, None), ("a", 2, None)]


@pytest.mark.parametrize("first, second, turn", [(3, 5, 0), (4, 2, 1), (3, 3, 2)])
def test_each_value_once_meets_every_value_of_both_axes(first, second, turn):
    cases = slices.each_value_once(list(range(first)), [f"v{j}" for j in range(second)], turn=turn)
    assert len(cases) == max(first, second)
    assert {case.values[0] for case in cases} == set(range(first))
    assert {case.values[1] for case in cases} == {f"v{j}" for j in range(second)}
    assert len({case.id for case in cases}) == len(cases)
