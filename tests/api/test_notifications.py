"""Grouped notifications, silences and every webhook event type, through the API and real HTTP
deliveries to a local receiver. Background threads are off: the test runs the notifier with an
injected clock (`Notifier.run_once(now)`) and the dispatcher by hand, so what is sent when is
exactly what the test says."""
from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from paritywatch.backend.control import run_state
from paritywatch.backend.main import create_app
from paritywatch.backend.models import utcnow
from paritywatch.backend.settings import Settings
from tests.support.live import WebhookReceiver, local_client

WAIT, INTERVAL, TIMEOUT = 5.0, 60.0, 60.0


@pytest.fixture
def app(db_url):
    settings = Settings(database_url=db_url, open_mode=True, run_background_workers=False, heartbeat_timeout_s=TIMEOUT,
                        allow_loopback_webhooks=True, webhook_group_wait_s=WAIT, webhook_group_interval_s=INTERVAL,
                        public_url="https://pw.example.org")
    return create_app(settings, upgrade_schema=False)


@pytest.fixture
def api(app):
    with local_client(app) as c:
        yield c


@pytest.fixture
def rx():
    with WebhookReceiver() as receiver:
        yield receiver


class Clock:
    """Runs the notifier and the dispatcher as if `t` seconds had passed since the test began."""

    def __init__(self, app):
        self.app, self.t0 = app, utcnow()

    def notify(self, t: float) -> int:
        sent = self.app.state.notifier.run_once(self.t0 + timedelta(seconds=t))
        while self.app.state.dispatcher.run_once():
            pass
        return sent

    def elapsed(self) -> float:
        """Wall-clock seconds since the clock began: alerts fire at wall-clock time, not at `t`."""
        return (utcnow() - self.t0).total_seconds()

    def sweep(self, t: float) -> None:
        with self.app.state.effects.write(self.app.state.db) as s:
            run_state.sweep(s, TIMEOUT, now=self.t0 + timedelta(seconds=t))


def hook(api, url: str, **extra) -> dict:
    r = api.post("/api/v1/webhooks", json={"url": url, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def workers(api, run_name: str, n: int, project: str = "default") -> tuple[int, list[int]]:
    run_id = api.post("/api/v1/runs", json={"name": run_name, "project": project}).json()["id"]
    ids = [api.post(f"/api/v1/runs/{run_id}/components", json={"side": "rollout", "worker_id": f"w{i:03d}"}).json()["id"]
           for i in range(n)]
    return run_id, ids


def alert_bodies(rx) -> list[dict]:
    return [r.json for r in rx.accepted() if r.json["type"].startswith("alert.")]


def test_200_silent_workers_are_one_message_then_changes_then_all_resolved(api, app, rx):
    # Alerts fire at wall-clock time while the test's clock is injected; a 30 s group wait and 20 s
    # margins keep the timeline true even when writing 200 alerts takes seconds on a loaded machine.
    wait, margin = 30.0, 20.0
    hook(api, rx.url, events=["alert.firing", "alert.resolved"], group_wait_s=wait)
    run_id, ids = workers(api, "big", 200)
    clock = Clock(app)  # after the registrations: the sweep's "silent for the timeout" counts from here
    clock.sweep(TIMEOUT + 1)  # every worker silent: 200 alerts, one per cause
    assert len(api.get(f"/api/v1/runs/{run_id}/alerts", params={"limit": 1000}).json()["alerts"]) == 200
    assert clock.notify(wait - margin) == 0  # group wait
    assert clock.notify(wait + margin) == 1
    assert clock.notify(wait + margin + 1) == 0
    [first] = alert_bodies(rx)
    data = first["data"]
    assert first["type"] == "alert.firing" and data["status"] == "firing"
    assert data["counts"] == {"firing": 200, "resolved": 0, "silenced": 0}
    assert data["workers_total"] == 200 and data["workers"][:3] == ["w000", "w001", "w002"]
    assert data["summary"].startswith("[FIRING] 200 heartbeat_lost alerts in default/big: "
                                      "workers w000, w001, w002, w003, w004 and 195 more")
    assert data["reason"] == "200 alert(s) firing" and len(data["alerts"]) == 20
    assert data["group"]["labels"] == {"run_id": run_id, "kind": "heartbeat_lost"}
    assert data["run"] == {"id": run_id, "name": "big", "project": "default", "state": "crashed",
                           "url": f"https://pw.example.org/#/runs/{run_id}"}

    for cid in ids[:50]:  # 50 come back: one message, after the group interval
        api.post(f"/api/v1/runs/{run_id}/components/{cid}/heartbeat")
    assert clock.notify(wait + margin + 10) == 0
    assert clock.notify(wait + margin + INTERVAL + 2) == 1
    second = alert_bodies(rx)[1]["data"]
    assert second["counts"]["resolved"] == 50 and second["counts"]["firing"] == 150
    assert second["reason"] == "50 resolved"
    for cid in ids:  # the run ends cleanly: everything resolves, one last message
        api.post(f"/api/v1/runs/{run_id}/components/{cid}/close")
    assert api.get(f"/api/v1/runs/{run_id}").json()["control"]["state"] == "finished"
    assert clock.notify(wait + margin + 2 * INTERVAL + 3) == 1
    last = alert_bodies(rx)[2]
    assert last["type"] == "alert.resolved" and last["data"]["reason"] == "all 150 resolved"
    assert clock.notify(10_000) == 0
    assert len({r.headers["webhook-id"] for r in rx.accepted()}) == len(rx.accepted()) == 3


def test_alerts_that_resolve_inside_the_group_wait_are_never_sent(api, app, rx):
    hook(api, rx.url, events=["alert.firing", "alert.resolved"])
    run_id, ids = workers(api, "blip", 3)
    clock = Clock(app)
    clock.sweep(TIMEOUT + 1)
    for cid in ids:
        api.post(f"/api/v1/runs/{run_id}/components/{cid}/heartbeat")
    assert clock.notify(WAIT + 1) == 0 and rx.received == []


def test_a_clean_finish_sends_nothing_even_to_a_webhook_that_wants_everything(api, app, rx):
    hook(api, rx.url)  # no event list: every event type
    clock = Clock(app)
    run_id = api.post("/api/v1/runs", json={"name": "clean"}).json()["id"]
    comps = [api.post(f"/api/v1/runs/{run_id}/components", json={"side": side, "worker_id": w}).json()["id"]
             for side, w in [("rollout", "r0"), ("rollout", "r1"), ("trainer", "t0")]]
    for cid in comps:
        api.post(f"/api/v1/runs/{run_id}/components/{cid}/close")
    assert api.get(f"/api/v1/runs/{run_id}").json()["control"]["state"] == "finished"
    clock.sweep(TIMEOUT + 1)
    assert clock.notify(10_000) == 0 and rx.received == []


def test_run_control_and_acknowledged_events_are_delivered(api, app, rx):
    """Issue 17.3: a webhook subscribed to run.control and alert.acknowledged got nothing."""
    hook(api, rx.url, events=["run.control", "alert.acknowledged"])
    clock = Clock(app)
    run_id = api.post("/api/v1/runs", json={"name": "ctl", "project": "p"}).json()["id"]
    api.post(f"/api/v1/runs/{run_id}/control", json={"action": "pause", "reason": "checking"})
    api.post(f"/api/v1/runs/{run_id}/control", json={"action": "resume", "reason": "fine"})
    api.post(f"/api/v1/runs/{run_id}/rules", json={"key": "loss", "comparison": ">", "threshold": 1.0})
    api.post(f"/api/v1/runs/{run_id}/metrics", json={"client_id": "c", "seq": 0, "steps": [1], "series": {"loss": [9.0]}})
    alert = api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"][0]
    assert api.post(f"/api/v1/alerts/{alert['id']}/acknowledge", json={"note": "on it"}).status_code == 200
    clock.notify(WAIT + 1)
    # deliveries go out concurrently, so in any order; each payload carries the time of its event
    got = sorted((r.json for r in rx.accepted()), key=lambda e: e["timestamp"])
    assert [e["type"] for e in got] == ["run.control", "run.control", "alert.acknowledged"]  # no alert.firing
    pause, resume, ack = (e["data"] for e in got)
    assert pause["control"]["state"] == "paused" and pause["from_state"] == "running"
    assert pause["control"]["reason"] == "checking" and resume["control"]["state"] == "running"
    assert ack["note"] == "on it" and ack["alert"]["id"] == alert["id"]
    for data, state in ((pause, "paused"), (resume, "running"), (ack, "running")):
        assert data["run"]["state"] == state and data["run"]["url"] == f"https://pw.example.org/#/runs/{run_id}"


def test_every_event_type_the_api_accepts_is_listed_for_the_dashboard(api):
    listed = [e["type"] for e in api.get("/api/v1/webhook-events").json()["events"]]
    schema = api.get("/api/v1/openapi.json").json()["components"]["schemas"]["WebhookIn"]
    accepted = schema["properties"]["events"]["items"]["enum"]
    assert listed == accepted == ["alert.firing", "alert.resolved", "alert.acknowledged", "run.control",
                                  "run.ended_tainted", "test"]
    assert api.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/x", "events": ["run.finished"]}).status_code == 422


def test_a_silenced_runs_new_alerts_send_nothing_show_silenced_and_expiry_reenables_them(api, app, rx):
    hook(api, rx.url, events=["alert.firing", "alert.resolved"])
    run_id, ids = workers(api, "muted", 2)
    other_id, _ = workers(api, "loud", 1)
    clock = Clock(app)
    r = api.post("/api/v1/silences", json={"run_id": run_id, "duration_s": 3600, "reason": "node drain"})
    assert r.status_code == 200, r.text
    silence = r.json()
    assert silence["active"] and silence["created_by"] and silence["reason"] == "node drain"
    clock.sweep(TIMEOUT + 1)
    fired = clock.elapsed()  # the alerts fired at wall-clock time (see test_grouping_is_set_per_webhook)
    assert clock.notify(fired + WAIT + 1) == 1  # only the other run's group
    assert [b["data"]["run"]["id"] for b in alert_bodies(rx)] == [other_id]
    muted = api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]
    assert len(muted) == 2 and all(a["silenced"] and a["silenced_by"] == [silence["id"]] for a in muted)
    assert not api.get(f"/api/v1/runs/{other_id}/alerts").json()["alerts"][0]["silenced"]
    assert clock.notify(fired + WAIT + 100) == 0

    r = api.post(f"/api/v1/silences/{silence['id']}/expire")
    assert r.status_code == 200 and not r.json()["active"] and r.json()["ended_by"]
    assert api.post(f"/api/v1/silences/{silence['id']}/expire").status_code == 409
    assert not any(a["silenced"] for a in api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"])
    assert clock.notify(fired + WAIT + 101) == 1  # re-enabled: the still-firing alerts are told now
    last = alert_bodies(rx)[-1]["data"]
    assert last["run"]["id"] == run_id and last["counts"]["firing"] == 2
    audit = api.get("/api/v1/silences", params={"state": "all"}).json()["silences"]
    assert [(s["id"], s["reason"], s["ended_by"] is not None) for s in audit] == [(silence["id"], "node drain", True)]


def test_a_silence_that_runs_out_reenables_notifications_by_itself(api, app, rx):
    hook(api, rx.url, events=["alert.firing"])
    run_id, _ = workers(api, "short", 1, project="ml")
    clock = Clock(app)
    silence = api.post("/api/v1/silences", json={"project": "ml", "kind": "heartbeat_lost", "duration_s": 30,
                                                 "reason": "deploy"}).json()
    ends = (datetime.fromisoformat(silence["ends_at"].replace("Z", "+00:00")) - clock.t0).total_seconds()
    clock.sweep(TIMEOUT + 1)
    assert clock.notify(WAIT + 1) == 0
    assert clock.notify(ends - 1) == 0
    assert clock.notify(ends + 1) == 1  # the group was scheduled for the silence's end
    other_run, _ = workers(api, "elsewhere", 0, project="other")
    assert len(api.get("/api/v1/silences", params={"run_id": run_id}).json()["silences"]) == 1  # its project's
    assert api.get("/api/v1/silences", params={"run_id": other_run}).json()["silences"] == []


def test_a_silenced_groups_resolution_waits_for_the_silence_to_end(api, app, rx):
    """Issue 25.5: an alert announced as firing, then silenced, resolved during the silence, and
    the "resolved" went out at once (the dialog says notifications wait). Now nothing is sent while
    the silence lasts; when it ends the receiver, told the alert fired, is told it resolved. An
    alert that fired and resolved inside the silence is never announced."""
    hook(api, rx.url, events=["alert.firing", "alert.resolved"])
    run_id, ids = workers(api, "hushed", 2)
    clock = Clock(app)
    clock.sweep(TIMEOUT + 1)
    fired = clock.elapsed()
    assert clock.notify(fired + WAIT + 1) == 1  # announced: 2 heartbeat_lost firing
    silence = api.post("/api/v1/silences", json={"run_id": run_id, "duration_s": 3600, "reason": "rebooting"}).json()
    for cid in ids:  # both come back during the silence
        api.post(f"/api/v1/runs/{run_id}/components/{cid}/heartbeat")
    resolved = api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "resolved"}).json()["alerts"]
    assert len(resolved) == 2 and all(a["silenced"] and a["silenced_by"] == [silence["id"]] for a in resolved)
    assert clock.notify(fired + WAIT + INTERVAL + 10) == 0  # past the group interval: still nothing
    assert [b["type"] for b in alert_bodies(rx)] == ["alert.firing"]

    api.post(f"/api/v1/silences/{silence['id']}/expire")
    assert not any(a["silenced"] for a in api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"])
    assert clock.notify(fired + WAIT + INTERVAL + 11) == 1  # the held resolution, now
    last = alert_bodies(rx)[-1]
    assert last["type"] == "alert.resolved" and last["data"]["reason"] == "all 2 resolved"
    assert clock.notify(10_000) == 0

    # Fired and resolved inside a silence: the receiver never heard of it, and never will.
    silence = api.post("/api/v1/silences", json={"run_id": run_id, "duration_s": 86400, "reason": "again"}).json()
    clock.sweep(2 * TIMEOUT + 10_000)
    muted = api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]
    assert len(muted) == 2 and all(a["silenced"] for a in muted)
    assert clock.notify(10_001 + WAIT) == 0
    for cid in ids:
        api.post(f"/api/v1/runs/{run_id}/components/{cid}/heartbeat")
    api.post(f"/api/v1/silences/{silence['id']}/expire")
    assert clock.notify(20_000) == 0 and len(alert_bodies(rx)) == 2


def test_a_silences_held_resolution_goes_out_when_it_runs_out(api, app, rx):
    hook(api, rx.url, events=["alert.firing", "alert.resolved"])
    run_id, [cid] = workers(api, "lapse", 1, project="ml")
    clock = Clock(app)
    clock.sweep(TIMEOUT + 1)
    fired = clock.elapsed()
    assert clock.notify(fired + WAIT + 1) == 1
    silence = api.post("/api/v1/silences", json={"project": "ml", "duration_s": 120, "reason": "deploy"}).json()
    ends = (datetime.fromisoformat(silence["ends_at"].replace("Z", "+00:00")) - clock.t0).total_seconds()
    api.post(f"/api/v1/runs/{run_id}/components/{cid}/heartbeat")
    assert clock.notify(ends - 1) == 0
    assert clock.notify(ends + 1) == 1  # the group was scheduled for the silence's end
    assert [b["type"] for b in alert_bodies(rx)] == ["alert.firing", "alert.resolved"]


def test_a_message_sent_during_a_silence_keeps_what_the_receiver_was_told_about_the_muted_alerts(api, app, rx):
    """Grouped by project: one run of the group is silenced, the other is not. A message about the
    other run during the silence must not drop the muted run's alert from what the receiver was told:
    its resolution is still owed once the silence ends."""
    hook(api, rx.url, events=["alert.firing", "alert.resolved"], group_by=["project"], group_wait_s=0,
         group_interval_s=0)
    muted_run, [muted_worker] = workers(api, "muted", 1, project="shared")
    loud_run, [loud_worker] = workers(api, "loud", 1, project="shared")
    clock = Clock(app)
    clock.sweep(TIMEOUT + 1)
    fired = clock.elapsed()
    assert clock.notify(fired + 1) == 1 and alert_bodies(rx)[0]["data"]["counts"]["firing"] == 2
    silence = api.post("/api/v1/silences", json={"run_id": muted_run, "duration_s": 86400, "reason": "x"}).json()
    api.post(f"/api/v1/runs/{muted_run}/components/{muted_worker}/close")  # resolves, muted
    api.post(f"/api/v1/runs/{loud_run}/components/{loud_worker}/heartbeat")  # resolves, told
    resolved = clock.elapsed()  # at wall-clock time too: seconds after `fired` on a loaded machine (seen in CI)
    assert clock.notify(resolved + 1) == 1
    told = alert_bodies(rx)[-1]["data"]
    assert told["status"] == "resolved" and [a["run_id"] for a in told["resolved"]] == [loud_run]
    clock.sweep(2 * TIMEOUT + 1000)  # the loud run's worker falls silent again: a new firing message
    assert clock.notify(1100) == 1 and alert_bodies(rx)[-1]["data"]["status"] == "firing"
    api.post(f"/api/v1/silences/{silence['id']}/expire")
    assert clock.notify(1101) == 1  # the muted run's resolution, owed since the silence began
    last = alert_bodies(rx)[-1]["data"]
    assert [a["run_id"] for a in last["resolved"]] == [muted_run] and last["reason"] == "1 resolved"


def test_silences_are_validated(api):
    run_id, _ = workers(api, "v", 0)
    bad = [{"duration_s": 60, "reason": "no matcher"}, {"run_id": run_id, "duration_s": 0, "reason": "x"},
           {"run_id": run_id, "duration_s": 60, "reason": ""}, {"kind": "bogus", "duration_s": 60, "reason": "x"},
           {"run_id": run_id, "duration_s": 60}]
    for body in bad:
        assert api.post("/api/v1/silences", json=body).status_code == 422, body
    assert api.post("/api/v1/silences", json={"run_id": 999999, "duration_s": 60, "reason": "x"}).status_code == 404
    assert api.get("/api/v1/silences", params={"state": "bogus"}).status_code == 422


def test_grouping_is_set_per_webhook(api, app, rx):
    """One webhook groups by project (two runs, one message), one keeps the default (two)."""
    with WebhookReceiver() as rx2:
        alerts_only = ["alert.firing", "alert.resolved"]
        by_project = hook(api, rx.url, group_by=["project"], group_wait_s=0, events=alerts_only)
        assert by_project["grouping"] == {"group_by": ["project"], "group_wait_s": 0.0,
                                          "group_interval_s": INTERVAL, "repeat_interval_s": 4 * 3600.0}
        default = hook(api, rx2.url, events=alerts_only)
        assert default["group_by"] is None and default["grouping"]["group_by"] == ["run", "kind"]
        workers(api, "a", 1, project="shared")
        workers(api, "b", 1, project="shared")
        clock = Clock(app)
        clock.sweep(TIMEOUT + 1)
        # The sweep fired both alerts by now, at wall-clock time: on a loaded PostgreSQL it took over
        # a second (seen in CI), so the notifications are timed from here, not from the clock's start.
        fired = clock.elapsed()
        clock.notify(fired + 1)
        assert len(rx.accepted()) == 1 and rx2.accepted() == []  # the default still waits
        assert rx.accepted()[0].json["data"]["counts"]["firing"] == 2
        clock.notify(fired + WAIT + 1)
        assert len(rx2.accepted()) == 2
        patched = api.patch(f"/api/v1/webhooks/{default['id']}", json={"group_wait_s": 30, "group_by": ["kind"]}).json()
        assert patched["grouping"]["group_wait_s"] == 30 and patched["enabled"] is True
        back = api.patch(f"/api/v1/webhooks/{default['id']}", json={"group_wait_s": None}).json()
        assert back["group_wait_s"] is None and back["grouping"]["group_wait_s"] == WAIT
        assert api.patch(f"/api/v1/webhooks/{default['id']}", json={"group_by": ["bogus"]}).status_code == 422
        assert api.patch(f"/api/v1/webhooks/{default['id']}", json={"enabled": None}).status_code == 422


def test_a_flapping_rule_with_keep_firing_for_is_one_alert_and_one_message(api, app, rx):
    hook(api, rx.url, group_wait_s=0, group_interval_s=0, events=["alert.firing", "alert.resolved"])
    clock = Clock(app)
    run_id = api.post("/api/v1/runs", json={"name": "flap"}).json()["id"]
    rule = api.post(f"/api/v1/runs/{run_id}/rules", json={"key": "reward", "comparison": "<", "threshold": 0.5,
                                                           "keep_firing_for": 3}).json()
    assert rule["keep_firing_for"] == 3
    for seq in range(100):  # crosses its threshold 50 times each way
        api.post(f"/api/v1/runs/{run_id}/metrics", json={"client_id": "c", "seq": seq, "steps": [seq],
                                                          "series": {"reward": [0.1 if seq % 2 == 0 else 0.9]}})
        clock.notify(1000 + seq)  # ahead of the wall clock: every marked group is due
    assert len(api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]) == 1
    assert [b["type"] for b in alert_bodies(rx)] == ["alert.firing"]
    for seq in range(100, 104):  # back to normal for good: resolved after 3 clear evaluations
        api.post(f"/api/v1/runs/{run_id}/metrics", json={"client_id": "c", "seq": seq, "steps": [seq],
                                                          "series": {"reward": [0.9]}})
    clock.notify(2000)
    assert [b["type"] for b in alert_bodies(rx)] == ["alert.firing", "alert.resolved"]
