"""backend/detect/workers.py: the workers view's pure parts, table-tested."""
from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from paritywatch.backend.store.alerts import heartbeat_key
from paritywatch.backend.detect import workers as view
from paritywatch.backend.detect.parity import mismatch_digest, mismatch_key


def test_group_labels_put_the_trainer_first_and_go_past_z():
    digests = [f"d{i}" for i in range(30)]
    labels = view.group_labels(digests, trainer_digest="d5")
    assert labels["d5"] == "A" and labels["d0"] == "B" and labels["d4"] == "F" and labels["d6"] == "G"
    assert labels["d25"] == "Z" and labels["d26"] == "AA" and labels["d29"] == "AD"
    assert view.group_labels(["x", "y"], None) == {"x": "A", "y": "B"}


@pytest.mark.parametrize("side, version, trainer, expected", [
    ("rollout", 7, 10, 3), ("rollout", 10, 10, 0), ("rollout", 12, 10, -2),  # ahead: a trainer that restarted
    ("rollout", None, 10, None), ("rollout", 7, None, None), ("trainer", 7, 10, None),
])
def test_lag(side, version, trainer, expected):
    assert view.lag(side, version, trainer) == expected


def test_alerts_concern_the_processes_they_name():
    comps = [NS(id=1, fingerprint_digest="good"), NS(id=2, fingerprint_digest="bad"), NS(id=3, fingerprint_digest=None)]
    mismatch = NS(dedup_key=mismatch_key("good", "bad"))
    lost = NS(dedup_key=heartbeat_key(3))
    rule = NS(dedup_key="rule:7")
    out = view.alerts_by_component([mismatch, lost, rule], comps)
    assert out == {1: [], 2: [mismatch], 3: [lost]}
    assert mismatch_digest(mismatch_key("a", "b")) == "b" and mismatch_digest("heartbeat:3") is None


def test_a_mismatch_alert_concerns_the_processes_it_lists():
    """Its key names processor digests; a worker that reported sampling_params has another
    fingerprint digest, so the alert's component list decides."""
    comps = [NS(id=1, fingerprint_digest="good+sampling"), NS(id=2, fingerprint_digest="bad+sampling")]
    mismatch = NS(dedup_key=mismatch_key("good", "bad"), detail={"component_ids": [2]})
    assert view.alerts_by_component([mismatch], comps) == {1: [], 2: [mismatch]}


def _points(level: float, n: int = 10) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n, dtype=np.int64), np.full(n, level)


def test_one_bad_replica_among_identical_ones_ranks_first():
    points = {cid: _points(0.001) for cid in range(1, 100)}
    points[42] = _points(0.5)
    ranked, median = view.rank_outliers(points, top=3)
    assert ranked[0].component_id == 42 and ranked[0].score > 5 and median == pytest.approx(0.001)
    assert [o.score for o in ranked[1:]] == [0.0, 0.0]


def test_spread_workers_score_by_robust_deviation():
    points = {cid: _points(1.0 + 0.01 * (cid % 5)) for cid in range(50)}
    points[7] = _points(2.0)
    ranked, _ = view.rank_outliers(points, top=len(points))
    assert ranked[0].component_id == 7
    assert max(o.score for o in ranked[1:]) < 3 < ranked[0].score
    assert view.rank_outliers({}, 5) == ([], None)
    assert [o.score for o in view.rank_outliers({1: _points(3.0), 2: _points(3.0)}, 2)[0]] == [0.0, 0.0]


def test_bucket_means():
    st = np.array([5, 0, 1, 9, 10, 10], dtype=np.int64)
    vs = np.array([5.0, 0.0, 1.0, 9.0, 10.0, 12.0])
    assert view.bucket_means(st, vs, origin=0, width=5) == {
        "step": [0, 5, 10], "mean": [0.5, 7.0, 11.0], "min": [0.0, 5.0, 10.0], "max": [1.0, 9.0, 12.0], "count": [2, 2, 2]}
    assert view.bucket_means(np.empty(0, np.int64), np.empty(0), 0, 1)["step"] == []
