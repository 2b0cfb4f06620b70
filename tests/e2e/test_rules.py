"""Threshold rules: a metric crossing for N consecutive evaluations alerts (and acts); falling
back resolves the alert."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from backend.main import create_app
from backend.settings import Settings


@pytest.fixture
def api(db_url):
    with TestClient(create_app(Settings(database_url=db_url), upgrade_schema=False)) as c:
        yield c


def post(api, run_id, seq, step, **series):  # noqa: ANN001
    r = api.post(f"/api/v1/runs/{run_id}/metrics",
                 json={"client_id": "c", "seq": seq, "steps": [step], "series": {k.replace("__", "/"): [v] for k, v in series.items()}})
    assert r.status_code == 200, r.text


def open_alerts(api, run_id):  # noqa: ANN001
    return api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]


def test_rule_needs_n_consecutive_breaches_then_pauses_and_resolves(api):
    run = api.post("/api/v1/runs", json={"name": "r"}).json()
    rid = run["id"]
    rule = api.post(f"/api/v1/runs/{rid}/rules", json={
        "key": "loss", "aggregate": "mean", "window": 2, "comparison": ">", "threshold": 1.0,
        "consecutive": 3, "severity": "error", "action": "pause"}).json()
    post(api, rid, 1, 1, loss=0.5)
    post(api, rid, 2, 2, loss=2.0)   # mean(0.5, 2.0) = 1.25 > 1: streak 1
    post(api, rid, 3, 3, loss=2.0)   # streak 2
    assert open_alerts(api, rid) == []
    post(api, rid, 4, 4, loss=2.0)   # streak 3: fire and pause
    alerts = open_alerts(api, rid)
    assert len(alerts) == 1 and alerts[0]["kind"] == "metric_threshold"
    assert alerts[0]["detail"]["rule_id"] == rule["id"] and alerts[0]["detail"]["value"] == pytest.approx(2.0)
    assert api.get(f"/api/v1/runs/{rid}/control").json()["state"] == "paused"
    post(api, rid, 5, 5, loss=2.0)   # still breached: same alert, no duplicate
    assert len(open_alerts(api, rid)) == 1
    post(api, rid, 6, 6, loss=0.0)   # mean(2.0, 0.0) = 1.0, not > 1: resolved
    assert open_alerts(api, rid) == []
    events = api.get(f"/api/v1/alerts/{alerts[0]['id']}/events").json()["events"]
    assert [e["action"] for e in events] == ["fired", "auto_resolved"]


def test_builtin_align_rules(api):
    rid = api.post("/api/v1/runs", json={"name": "r"}).json()["id"]
    rules = api.get(f"/api/v1/runs/{rid}/rules").json()["rules"]
    keys = {r["key"]: r for r in rules if r["builtin"]}
    assert keys["align/prompt_rerender_mismatch_frac"]["action"] == "pause"
    assert keys["align/kl_k3"]["threshold"] == 0.01 and keys["align/kl_k3"]["severity"] == "warning"
    post(api, rid, 1, 1, align__kl_k3=0.02)
    alerts = open_alerts(api, rid)
    assert [a["severity"] for a in alerts] == ["warning"]
    assert api.get(f"/api/v1/runs/{rid}/control").json()["state"] == "running"  # warning: alert only
    post(api, rid, 2, 2, align__kl_k3=0.001)
    assert open_alerts(api, rid) == []


def test_project_default_rules_apply_to_every_run(api):
    api.post("/api/v1/projects/p/rules", json={"key": "reward", "comparison": "<", "threshold": 0.0})
    a = api.post("/api/v1/runs", json={"name": "a", "project": "p"}).json()["id"]
    b = api.post("/api/v1/runs", json={"name": "b", "project": "other"}).json()["id"]
    post(api, a, 1, 1, reward=-1.0)
    post(api, b, 2, 1, reward=-1.0)
    assert len(open_alerts(api, a)) == 1 and open_alerts(api, b) == []


def test_manual_acknowledge_and_resolve(api):
    rid = api.post("/api/v1/runs", json={"name": "r"}).json()["id"]
    post(api, rid, 1, 1, align__kl_k3=0.5)
    alert = open_alerts(api, rid)[0]
    acked = api.post(f"/api/v1/alerts/{alert['id']}/acknowledge", json={"note": "looking"}).json()
    assert acked["status"] == "acknowledged"
    resolved = api.post(f"/api/v1/alerts/{alert['id']}/resolve", json={}).json()
    assert resolved["status"] == "resolved"
    assert api.post(f"/api/v1/alerts/{alert['id']}/acknowledge", json={}).status_code == 409
    # the condition still holds: the next evaluation fires a new alert with a fresh lifecycle
    post(api, rid, 2, 2, align__kl_k3=0.5)
    again = open_alerts(api, rid)
    assert len(again) == 1 and again[0]["id"] != alert["id"]


def test_rule_validation(api):
    rid = api.post("/api/v1/runs", json={"name": "r"}).json()["id"]
    for bad in ({"key": "x", "comparison": "!=", "threshold": 1}, {"key": "x", "comparison": ">"},
                {"key": "", "comparison": ">", "threshold": 1}, {"key": "x", "comparison": ">", "threshold": 1, "window": 0}):
        assert api.post(f"/api/v1/runs/{rid}/rules", json=bad).status_code == 422, bad
