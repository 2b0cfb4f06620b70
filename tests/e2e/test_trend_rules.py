"""Trend rules through the API: per-worker series posted as `<worker>/<key>`, one worker's log-prob
difference steps up after a weight sync while staying far below any fixed threshold; the trend
rule names that worker, the others stay silent."""
from __future__ import annotations

import numpy as np
import pytest

from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.support.live import local_client

KEY = "rollout/logp_diff_mean"
WORKERS = [f"worker{i}" for i in range(4)]
BAD, SYNC_STEP = "worker2", 160


@pytest.fixture
def api(db_url):
    with local_client(create_app(Settings(database_url=db_url, open_mode=True), upgrade_schema=False)) as c:
        yield c


def worker_series(rng: np.random.Generator, worker: str, steps: int) -> np.ndarray:
    values = 0.015 + rng.normal(0, 0.003, steps)
    if worker == BAD:
        values[SYNC_STEP:] += 0.015  # stale weights after the sync: still under 0.05
    return values


def post_all(api, run_id: int, series: dict[str, np.ndarray], batch: int = 10) -> None:
    steps = len(next(iter(series.values())))
    for seq, start in enumerate(range(0, steps, batch), start=1):
        body = {"client_id": "trend", "seq": seq, "steps": list(range(start + 1, start + batch + 1)),
                "series": {k: v[start:start + batch].tolist() for k, v in series.items()}}
        r = api.post(f"/api/v1/runs/{run_id}/metrics", json=body)
        assert r.status_code == 200, r.text


def test_per_worker_trend_rule_names_the_worker_that_stepped_and_a_fixed_threshold_misses_it(api):
    run_id = api.post("/api/v1/runs", json={"name": "trend"}).json()["id"]
    trend_rule = api.post(f"/api/v1/runs/{run_id}/rules", json={
        "key": KEY, "kind": "trend", "window": 20, "comparison": ">", "threshold": 8, "per_worker": True,
        "min_change": 0.005, "severity": "warning"}).json()
    assert (trend_rule["kind"], trend_rule["per_worker"], trend_rule["min_change"]) == ("trend", True, 0.005)
    api.post(f"/api/v1/runs/{run_id}/rules", json={"key": KEY, "comparison": ">", "threshold": 0.05,
                                                    "per_worker": True}).raise_for_status()
    rng = np.random.default_rng(7)
    series = {f"{w}/{KEY}": worker_series(rng, w, 260) for w in WORKERS}
    assert max(v.max() for v in series.values()) < 0.05
    post_all(api, run_id, series)

    alerts = api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]
    assert [(a["kind"], a["detail"]["key"], a["detail"]["worker_id"]) for a in alerts] == [
        ("metric_trend", f"{BAD}/{KEY}", BAD)]
    alert = alerts[0]
    assert alert["detail"]["rule_id"] == trend_rule["id"] and alert["detail"]["score"] >= 8
    assert SYNC_STEP < alert["step"] <= SYNC_STEP + 30
    assert "rose from" in alert["title"] and "its noise" in alert["title"]


def test_trend_rule_fires_on_the_run_series_and_refuses_a_score_of_zero(api):
    run_id = api.post("/api/v1/runs", json={"name": "trend-run"}).json()["id"]
    bad = api.post(f"/api/v1/runs/{run_id}/rules", json={"key": KEY, "kind": "trend", "comparison": ">",
                                                          "threshold": 0, "window": 20})
    assert bad.status_code == 422
    rule = api.post(f"/api/v1/runs/{run_id}/rules", json={"key": KEY, "kind": "trend", "comparison": ">",
                                                           "threshold": 8, "window": 20}).json()
    assert api.patch(f"/api/v1/rules/{rule['id']}", json={"threshold": -1}).status_code == 422
    values = np.concatenate([np.full(100, 0.011), np.linspace(0.011, 0.036, 300)])
    values += np.random.default_rng(3).normal(0, 0.003, len(values))
    post_all(api, run_id, {KEY: values, "loss": np.ones(len(values))})
    alerts = api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]
    assert [(a["kind"], a["detail"]["key"], a["detail"]["worker_id"]) for a in alerts] == [("metric_trend", KEY, None)]
    assert alerts[0]["detail"]["test"] == "drift"


def test_per_worker_threshold_rule_raises_one_alert_per_worker_and_resolves_each(api):
    run_id = api.post("/api/v1/runs", json={"name": "per-worker-threshold"}).json()["id"]
    api.post(f"/api/v1/runs/{run_id}/rules", json={"key": "align/kl_k3", "comparison": ">", "threshold": 0.05,
                                                    "per_worker": True}).raise_for_status()

    def post(seq: int, **by_worker: float) -> None:
        r = api.post(f"/api/v1/runs/{run_id}/metrics", json={"client_id": "pw", "seq": seq, "steps": [seq], "series": {
            f"{w}/align/kl_k3": [v] for w, v in by_worker.items()}})
        assert r.status_code == 200, r.text

    def firing() -> list[tuple[str, str]]:
        alerts = api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]
        return sorted((a["detail"]["worker_id"], a["title"].split(" ")[0]) for a in alerts)

    post(1, worker0=0.01, worker1=0.2, worker2=0.3)
    assert firing() == [("worker1", "worker1/align/kl_k3"), ("worker2", "worker2/align/kl_k3")]
    post(2, worker0=0.01, worker1=0.01, worker2=0.3)  # worker1 recovers; worker2 stays one alert
    assert firing() == [("worker2", "worker2/align/kl_k3")]
