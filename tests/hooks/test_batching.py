"""Columnar batch building and value cleaning (pure functions of the worker)."""
from __future__ import annotations

import math

import pytest

from trainer_hooks.worker import ColumnBatch, clean_value


def test_points_at_one_step_share_a_row_and_missing_values_are_null() -> None:
    batch = ColumnBatch(max_points=100)
    assert batch.add(1, {"loss": 1.0})
    assert batch.add(1, {"kl": 0.1})          # same step, new key: same row
    assert batch.add(2, {"loss": 0.9})
    assert batch.add(3, {"kl": 0.3})
    assert batch.columns() == ([1, 2, 3], {"loss": [1.0, 0.9, None], "kl": [0.1, None, 0.3]})
    assert batch.points == 4


def test_the_same_key_twice_at_one_step_stays_two_points() -> None:
    batch = ColumnBatch(max_points=100)
    batch.add(5, {"loss": 1.0})
    batch.add(5, {"loss": 2.0})
    assert batch.columns() == ([5, 5], {"loss": [1.0, 2.0]})


def test_an_entry_that_would_pass_the_point_limit_is_refused() -> None:
    batch = ColumnBatch(max_points=3)
    assert batch.add(0, {"a": 1.0, "b": 2.0})
    assert not batch.add(1, {"a": 1.0, "b": 2.0})
    assert batch.points == 2 and batch.columns()[0] == [0]


def test_the_cell_limit_counts_the_nulls_of_sparse_keys() -> None:
    batch = ColumnBatch(max_points=1000, max_cells=12)
    for step in range(3):
        assert batch.add(step, {f"key{step}": 1.0})  # 3 rows x 3 keys = 9 cells
    assert not batch.add(3, {"key3": 1.0})           # 4 x 4 = 16 > 12


def test_a_single_oversized_entry_is_still_accepted_into_an_empty_batch() -> None:
    batch = ColumnBatch(max_points=1)
    assert batch.add(0, {"a": 1.0, "b": 2.0})


@pytest.mark.parametrize("value, expected", [(1, 1.0), (True, 1.0), ("2.5", 2.5), (None, None),
                                             (math.nan, None), (math.inf, None), (-math.inf, None)])
def test_clean_value(value, expected) -> None:
    assert clean_value(value) == expected


def test_clean_value_rejects_non_numbers() -> None:
    with pytest.raises((TypeError, ValueError)):
        clean_value("loss")
    with pytest.raises((TypeError, ValueError)):
        clean_value([1.0])
