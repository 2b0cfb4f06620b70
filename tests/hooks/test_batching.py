"""Columnar batch building, and the wire contract's value rules as the hooks apply them (pure)."""
from __future__ import annotations

import math

import pytest

from trainer_hooks.batch import ColumnBatch, clean_entry
from trainer_hooks.contract import metric_value


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


@pytest.mark.parametrize("value, expected", [(1, 1.0), (2.5, 2.5), (None, None),
                                             (math.nan, None), (math.inf, None), (-math.inf, None)])
def test_metric_value(value, expected) -> None:
    assert metric_value(value) == expected


@pytest.mark.parametrize("value", ["2.5", "loss", True, False, [1.0], b"1", 1j, {"a": 1}])
def test_metric_value_refuses_what_the_server_rejects(value) -> None:
    """The server takes JSON numbers only: text is not a number, and neither is a bool."""
    with pytest.raises(TypeError):
        metric_value(value)


def test_numpy_and_torch_numbers_pass_but_their_bools_do_not() -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert metric_value(np.float32(0.5)) == 0.5 and metric_value(np.int64(3)) == 3.0
    assert metric_value(np.array(1.25)) == 1.25 and metric_value(torch.tensor(2.0)) == 2.0
    assert metric_value(np.float64("nan")) is None
    for truth in (np.bool_(True), np.array(True), torch.tensor(True)):
        with pytest.raises(TypeError):
            metric_value(truth)
    with pytest.raises(TypeError):
        metric_value(torch.tensor([1.0, 2.0]))  # torch raises RuntimeError; the rule says TypeError


def test_clean_entry_drops_bad_metrics_one_by_one_and_a_bad_step_whole() -> None:
    entry = clean_entry(3, {"loss": 0.5, "flag": True, "text": "2.5", "": 1.0, "x" * 201: 1.0, "nan": math.nan})
    assert entry.step == 3 and entry.values == {"loss": 0.5}
    assert sorted(str(key) for key, _ in entry.problems) == sorted(["flag", "text", "", "x" * 201])
    for step in (-1, 2**53 + 1, 1.0, "3", True):
        bad = clean_entry(step, {"loss": 1.0, "kl": 0.0})
        assert bad.step is None and bad.values == {} and len(bad.problems) == 2
    assert clean_entry(2**53, {"a": 1}).values == {"a": 1.0}
