"""Threshold rules: a metric crossing for N consecutive evaluations alerts (and acts); falling
back resolves the alert."""
from __future__ import annotations

import pytest

from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.support.live import local_client


@pytest.fixture
def api(db_url):
    with local_client(create_app(Settings(database_url=db_url, open_mode=True), upgrade_schema=False)) as c:
        yield c


def post_steps(api, run_id, seq, steps, **series):
    """One batch of several steps; `align__kl_k3=[...]` posts key `align/kl_k3`."""
    r = api.post(f"/api/v1/runs/{run_id}/metrics",
                 json={"client_id": "c", "seq": seq, "steps": steps, "series": {k.replace("__", "/"): v for k, v in series.items()}})
    assert r.status_code == 200, r.text


def post(api, run_id, seq, step, **series):
    post_steps(api, run_id, seq, [step], **{k: [v] for k, v in series.items()})


def open_alerts(api, run_id):
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
    keys = {r["key"]: r for r in rules if r["builtin"] and r["kind"] == "threshold"}
    assert keys["align/prompt_rerender_mismatch_frac"]["action"] == "pause"
    assert keys["align/kl_k3"]["threshold"] == 0.01 and keys["align/kl_k3"]["severity"] == "warning"
    post(api, rid, 1, 1, align__kl_k3=0.02)
    alerts = open_alerts(api, rid)
    assert [a["severity"] for a in alerts] == ["warning"]
    assert api.get(f"/api/v1/runs/{rid}/control").json()["state"] == "running"  # warning: alert only
    assert {r["keep_firing_for"] for r in rules if r["builtin"]} == {10}
    shapes = {(r["key"], r["kind"]): r for r in rules if r["builtin"] and r["kind"] != "threshold"}
    assert shapes[("align/kl_k3", "baseline")]["threshold"] == 0.015 and shapes[("align/kl_k3", "baseline")]["per_worker"]
    assert shapes[("align/kl_k3", "sawtooth")]["threshold"] == 8.0 and shapes[("align/kl_k3", "sawtooth")]["window"] == 25
    for seq in range(2, 12):  # ten clean batches: still firing (a healthy worker's batch is no all-clear)
        assert len(open_alerts(api, rid)) == 1, seq
        post(api, rid, seq, seq, align__kl_k3=0.001)
    assert len(open_alerts(api, rid)) == 1
    post(api, rid, 12, 12, align__kl_k3=0.001)  # the eleventh: resolved
    assert open_alerts(api, rid) == []


def test_a_builtin_alert_holds_while_one_bad_worker_posts_between_clean_ones(api):
    """Three rollout workers post align/* under the same keys; one renders prompts wrongly. Its
    alert must not resolve on each healthy batch and fire again on the next bad one."""
    rid = api.post("/api/v1/runs", json={"name": "one-bad-of-three"}).json()["id"]
    for seq in range(1, 31):
        post(api, rid, seq, seq, align__prompt_rerender_mismatch_frac=1.0 if seq % 3 == 0 else 0.0)
    [alert] = api.get(f"/api/v1/runs/{rid}/alerts").json()["alerts"]
    assert alert["status"] == "firing"
    events = api.get(f"/api/v1/alerts/{alert['id']}/events").json()["events"]
    assert [e["action"] for e in events] == ["fired"]


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


@pytest.mark.parametrize("how", ["disable", "delete"])
def test_a_rule_that_goes_away_resolves_its_open_alert(api, how):
    rid = api.post("/api/v1/runs", json={"name": f"gone-{how}"}).json()["id"]
    rule = api.post(f"/api/v1/runs/{rid}/rules", json={"key": "loss", "comparison": ">", "threshold": 1.0}).json()
    post(api, rid, 1, 1, loss=2.0)
    assert len(open_alerts(api, rid)) == 1
    if how == "disable":
        assert api.patch(f"/api/v1/rules/{rule['id']}", json={"enabled": False}).status_code == 200
    else:
        assert api.delete(f"/api/v1/rules/{rule['id']}").status_code == 204
    assert open_alerts(api, rid) == []  # nothing would ever evaluate it again


def test_a_mismatch_mid_batch_is_caught_though_the_batch_ends_clean(api):
    """The hooks send several steps per batch: a built-in error rule judges every one of them.
    (It judged only the batch's newest point: a bad step 12 followed by a clean step 14 passed.)"""
    rid = api.post("/api/v1/runs", json={"name": "mid-batch"}).json()["id"]
    post_steps(api, rid, 1, [10, 11, 12, 13, 14], align__decode_mismatch_frac=[0.0, 0.0, 0.25, 0.0, 0.0])
    [alert] = open_alerts(api, rid)
    assert alert["severity"] == "error" and alert["detail"]["value"] == 0.25
    assert alert["detail"]["steps"] == [10, 14] and "max of steps 10-14=0.25 > 0" in alert["title"]
    assert api.get(f"/api/v1/runs/{rid}/control").json()["state"] == "paused"
    for seq in range(2, 13):  # resolved after more than ten clean batches (docs/design.md, "Rules")
        assert len(open_alerts(api, rid)) == 1
        post_steps(api, rid, seq, [13 + 2 * seq, 14 + 2 * seq], align__decode_mismatch_frac=[0.0, 0.0])
    assert open_alerts(api, rid) == []


def test_a_falling_rule_judges_the_lowest_point_of_a_batch(api):
    rid = api.post("/api/v1/runs", json={"name": "falling"}).json()["id"]
    api.post(f"/api/v1/runs/{rid}/rules", json={"key": "reward", "comparison": "<", "threshold": 0.0})
    post_steps(api, rid, 1, [1, 2, 3], reward=[0.5, 0.4, 0.6])
    assert open_alerts(api, rid) == []
    post_steps(api, rid, 2, [4, 5, 6], reward=[0.5, -0.2, 0.6])
    [alert] = open_alerts(api, rid)
    assert alert["detail"]["value"] == -0.2 and "min of steps 4-6=-0.2 < 0" in alert["title"]
