"""Run and process lifecycle through the API: closed vs lost processes, finished and crashed runs,
the sweep that only looks at live runs, the strict state filter. Time is injected into the sweep
(`run_state.sweep(now=...)`); background threads are off, so nothing happens behind the test."""
from __future__ import annotations

from datetime import timedelta

import pytest

from paritywatch.backend.control import run_state
from paritywatch.backend.main import create_app
from paritywatch.backend.models import utcnow
from paritywatch.backend.settings import Settings
from tests.support.live import local_client

TIMEOUT_S = 60.0


@pytest.fixture
def app(db_url):
    settings = Settings(database_url=db_url, open_mode=True, run_background_workers=False, heartbeat_timeout_s=TIMEOUT_S)
    return create_app(settings, upgrade_schema=False)


@pytest.fixture
def api(app):
    with local_client(app) as c:
        yield c


def sweep(app, after_s: float = TIMEOUT_S + 1) -> dict:
    """The heartbeat sweep as if `after_s` seconds had passed."""
    with app.state.effects.write(app.state.db) as s:
        return run_state.sweep(s, TIMEOUT_S, now=utcnow() + timedelta(seconds=after_s))


def new_run(api, name: str, *workers: tuple[str, str]) -> tuple[int, dict[str, int]]:
    run_id = api.post("/api/v1/runs", json={"name": name}).json()["id"]
    ids = {}
    for side, worker in workers:
        r = api.post(f"/api/v1/runs/{run_id}/components", json={"side": side, "worker_id": worker})
        assert r.status_code == 200, r.text
        ids[worker] = r.json()["id"]
    return run_id, ids


def state(api, run_id: int) -> str:
    return api.get(f"/api/v1/runs/{run_id}").json()["control"]["state"]


def alerts(api, run_id: int, status: str | None = None) -> list[dict]:
    params = {"status": status} if status else {}
    return api.get(f"/api/v1/runs/{run_id}/alerts", params=params).json()["alerts"]


def close(api, run_id: int, component_id: int, **body):
    r = api.post(f"/api/v1/runs/{run_id}/components/{component_id}/close", **({"json": body} if body else {}))
    assert r.status_code == 200, r.text
    return r.json()


def test_the_trainer_closing_finishes_the_run_and_close_is_idempotent(api, app):
    run_id, ids = new_run(api, "clean", ("trainer", "t0"), ("rollout", "r0"), ("rollout", "r1"))
    close(api, run_id, ids["r0"])  # no body: the reason is optional
    answer = close(api, run_id, ids["r1"], reason="vllm engine shut down")
    assert answer["ok"] is True and answer["control"]["state"] == "running"  # rollouts do not end the run
    answer = close(api, run_id, ids["t0"], reason="training done")
    assert answer["control"]["state"] == "finished"
    assert answer["control"]["actor"] == "trainer t0" and "trainer closed" in answer["control"]["reason"]
    assert close(api, run_id, ids["t0"])["control"]["state"] == "finished"  # a repeated close is a no-op

    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["ended_at"] == run["control"]["updated_at"]
    comps = {c["worker_id"]: c for c in run["components"]}
    assert {c["status"] for c in comps.values()} == {"closed"}
    assert comps["r1"]["close_reason"] == "vllm engine shut down" and comps["r1"]["closed_at"]
    events = api.get(f"/api/v1/runs/{run_id}/control/audit").json()["events"]
    assert [(e["from_state"], e["to_state"]) for e in events] == [("running", "finished")]
    assert sweep(app)["lost"] == 0 and alerts(api, run_id) == []  # a finished run is never swept
    assert [r["id"] for r in api.get("/api/v1/runs", params={"state": "finished"}).json()["runs"]] == [run_id]


def test_only_a_process_that_falls_silent_without_closing_is_lost(api, app):
    run_id, ids = new_run(api, "crash", ("trainer", "t0"), ("rollout", "r0"), ("rollout", "r1"))
    close(api, run_id, ids["r0"])
    assert sweep(app, after_s=TIMEOUT_S - 5)["lost"] == 0  # not silent long enough yet
    assert sweep(app)["lost"] == 2
    lost = alerts(api, run_id, "open")
    assert sorted(a["detail"]["worker_id"] for a in lost) == ["r1", "t0"]
    assert all(a["kind"] == "heartbeat_lost" and "without closing" in a["title"] for a in lost)
    assert state(api, run_id) == "crashed"  # every process that did not close is lost
    assert sweep(app)["lost"] == 0  # lost once, alerted once

    # r1 comes back: live again, its alert resolves, and the run goes back to what it was
    answer = api.post(f"/api/v1/runs/{run_id}/components/{ids['r1']}/heartbeat").json()
    assert answer["control"]["state"] == "running"
    assert [a["detail"]["worker_id"] for a in alerts(api, run_id, "open")] == ["t0"]
    # the lost trainer says goodbye after all: its alert resolves and the run is finished
    assert close(api, run_id, ids["t0"])["control"]["state"] == "finished"
    assert alerts(api, run_id, "open") == []
    notes = [api.get(f"/api/v1/alerts/{a['id']}/events").json()["events"][-1]["note"] for a in alerts(api, run_id)]
    assert sorted(notes) == ["heartbeat resumed", "the process closed"]


def test_a_crashed_paused_run_comes_back_paused_and_a_crashed_run_can_be_stopped(api, app):
    run_id, ids = new_run(api, "paused-crash", ("trainer", "t0"))
    api.post(f"/api/v1/runs/{run_id}/control", json={"action": "pause", "reason": "look"})
    sweep(app)
    assert state(api, run_id) == "crashed"
    api.post(f"/api/v1/runs/{run_id}/components", json={"side": "trainer", "worker_id": "t0"})  # restarted
    assert state(api, run_id) == "paused" and alerts(api, run_id, "open") == []
    sweep(app)
    assert state(api, run_id) == "crashed"
    r = api.post(f"/api/v1/runs/{run_id}/control", json={"action": "pause"})
    assert r.status_code == 409 and "crashed" in r.json()["error"]["message"]
    r = api.post(f"/api/v1/runs/{run_id}/control", json={"action": "stop", "reason": "give up"})
    assert r.json()["state"] == "stopped" and alerts(api, run_id, "open") == []


def test_a_stopping_run_loses_its_processes_quietly_and_stops(api, app):
    run_id, ids = new_run(api, "stopping", ("trainer", "t0"), ("rollout", "r0"))
    api.post(f"/api/v1/runs/{run_id}/control", json={"action": "stop", "reason": "enough"})
    out = sweep(app)
    assert out["lost"] == 2 and alerts(api, run_id) == []  # going away is what a stop asks for
    control = api.get(f"/api/v1/runs/{run_id}/control").json()
    assert control["state"] == "stopped" and control["actor"] == "paritywatch" and "heartbeat" in control["reason"]


def test_a_trainer_registering_again_resumes_a_finished_run_a_rollout_does_not(api, app):
    run_id, ids = new_run(api, "resumed", ("trainer", "t0"), ("rollout", "r0"))
    close(api, run_id, ids["t0"])
    assert state(api, run_id) == "finished"
    api.post(f"/api/v1/runs/{run_id}/components", json={"side": "rollout", "worker_id": "late"})
    assert state(api, run_id) == "finished"
    api.post(f"/api/v1/runs/{run_id}/components", json={"side": "trainer", "worker_id": "t0"})
    assert state(api, run_id) == "running"


def silence(app, component_id: int, seconds: float = TIMEOUT_S + 5) -> None:
    """The process's last heartbeat was `seconds` ago (as if it had been killed then)."""
    from paritywatch.backend.models import Component

    with app.state.db.write() as s:
        s.get(Component, component_id).last_heartbeat = utcnow() - timedelta(seconds=seconds)


def shown_states(api, run_id: int) -> dict:
    """What the run page's header, the runs list and the workers view read of each process."""
    run = {c["worker_id"]: c["status"] for c in api.get(f"/api/v1/runs/{run_id}").json()["components"]}
    listed = next(r for r in api.get("/api/v1/runs").json()["runs"] if r["id"] == run_id)
    workers = api.get(f"/api/v1/runs/{run_id}/workers").json()
    assert {c["worker_id"]: c["status"] for c in listed["components"]} == run
    assert {w["worker_id"]: w["state"] for w in workers["workers"]} == run
    return {"states": run, "counts": workers["counts"]}


def test_a_rollout_killed_after_the_run_finished_is_ended_not_live_and_pages_nobody(api, app):
    """The orchestrator SIGTERMs a finished run's rollout workers: no close(). The sweep reads live
    runs only, so the process stays `live` in storage; every reader is shown `ended`."""
    from paritywatch.backend.store.snapshots import run_snapshots

    run_id, ids = new_run(api, "sigterm", ("trainer", "t0"), ("rollout", "r0"), ("rollout", "r1"))
    close(api, run_id, ids["t0"])
    with app.state.db.read() as s:
        version = run_snapshots(s, [run_id], TIMEOUT_S)[run_id]["components_version"]
    silence(app, ids["r0"], TIMEOUT_S - 5)
    assert shown_states(api, run_id)["states"] == {"t0": "closed", "r0": "live", "r1": "live"}  # not silent long enough
    silence(app, ids["r0"])
    shown = shown_states(api, run_id)
    assert shown["states"] == {"t0": "closed", "r0": "ended", "r1": "live"}
    assert shown["counts"] == {"live": 1, "closed": 1, "lost": 0, "ended": 1, "total": 3}
    assert [w["worker_id"] for w in api.get(f"/api/v1/runs/{run_id}/workers", params={"state": "ended"}).json()["workers"]] == ["r0"]
    assert [w["worker_id"] for w in api.get(f"/api/v1/runs/{run_id}/workers", params={"state": "live"}).json()["workers"]] == ["r1"]
    # an open run page hears of it: nothing was written, yet the stream's components version moved
    with app.state.db.read() as s:
        assert run_snapshots(s, [run_id], TIMEOUT_S)[run_id]["components_version"] != version
    assert sweep(app)["lost"] == 0 and alerts(api, run_id) == []  # a clean end pages nobody

    # a beat: it was alive after all
    api.post(f"/api/v1/runs/{run_id}/components/{ids['r0']}/heartbeat")
    assert shown_states(api, run_id)["states"]["r0"] == "live"


def test_a_stopped_runs_silent_process_is_ended_and_a_live_runs_is_not(api, app):
    stopped, ids = new_run(api, "stopped", ("trainer", "t0"), ("rollout", "r0"))
    api.post(f"/api/v1/runs/{stopped}/control", json={"action": "stop"})
    api.post(f"/api/v1/runs/{stopped}/control/stopped", json={"component_id": ids["t0"]})
    assert state(api, stopped) == "stopped"
    silence(app, ids["r0"])
    assert shown_states(api, stopped)["states"]["r0"] == "ended"
    running, ids = new_run(api, "running", ("trainer", "t0"), ("rollout", "r0"))
    silence(app, ids["r0"])  # the sweep has not run yet: live until it is lost
    assert shown_states(api, running)["states"]["r0"] == "live"
    assert api.get(f"/api/v1/runs/{running}/workers", params={"state": "ended"}).json()["workers"] == []


def test_resuming_a_finished_run_loses_the_processes_it_left_behind_without_paging(api, app):
    run_id, ids = new_run(api, "resume-after-sigterm", ("trainer", "t0"), ("rollout", "r0"))
    close(api, run_id, ids["t0"])
    silence(app, ids["r0"], 3600)  # shut down an hour ago
    api.post(f"/api/v1/runs/{run_id}/components", json={"side": "trainer", "worker_id": "t0"})  # the job resumes
    assert state(api, run_id) == "running"
    assert shown_states(api, run_id)["states"] == {"t0": "live", "r0": "lost"}
    assert sweep(app, after_s=5)["lost"] == 0 and alerts(api, run_id) == []  # nobody paged about the old worker


def test_a_run_without_a_trainer_finishes_when_its_last_process_closes(api):
    run_id, ids = new_run(api, "rollouts-only", ("rollout", "r0"), ("rollout", "r1"))
    assert close(api, run_id, ids["r0"])["control"]["state"] == "running"
    assert close(api, run_id, ids["r1"])["control"]["state"] == "finished"


def test_ending_a_run_resolves_its_alerts(api, app):
    run_id, ids = new_run(api, "ends", ("trainer", "t0"), ("rollout", "r0"))
    api.post(f"/api/v1/runs/{run_id}/rules", json={"key": "loss", "comparison": ">", "threshold": 1.0})
    api.post(f"/api/v1/runs/{run_id}/metrics", json={"client_id": "c", "seq": 0, "steps": [1], "series": {"loss": [5.0]}})
    assert [a["kind"] for a in alerts(api, run_id, "open")] == ["metric_threshold"]
    close(api, run_id, ids["t0"])
    resolved = alerts(api, run_id)
    assert [a["status"] for a in resolved] == ["resolved"]
    assert api.get(f"/api/v1/alerts/{resolved[0]['id']}/events").json()["events"][-1]["note"] == "the run finished"


def test_the_state_filter_is_strict_like_the_alert_status_filter(api):
    new_run(api, "a")
    for path in ("/api/v1/runs?state=bogus", "/api/v1/alerts?status=bogus"):
        r = api.get(path)
        assert r.status_code == 422, path
        assert r.json()["error"]["code"] == "validation_error"
    for s in ("running", "paused", "stopping", "stopped", "finished", "crashed"):
        assert api.get("/api/v1/runs", params={"state": s}).status_code == 200
    assert len(api.get("/api/v1/runs", params={"state": "running"}).json()["runs"]) == 1
    assert api.get("/api/v1/runs", params={"state": "finished"}).json()["runs"] == []


def test_closing_an_unknown_component_is_404(api):
    run_id, ids = new_run(api, "x", ("trainer", "t0"))
    other, _ = new_run(api, "y")
    assert api.post(f"/api/v1/runs/{run_id}/components/999999/close").status_code == 404
    assert api.post(f"/api/v1/runs/{other}/components/{ids['t0']}/close").status_code == 404
    r = api.post(f"/api/v1/runs/{run_id}/components/{ids['t0']}/close", json={"reason": "x", "extra": 1})
    assert r.status_code == 422
