import threading
import time

from tests.api.conftest import auth, new_run


def act(client, rid, action, reason="because"):
    return client.post(f"/api/v1/runs/{rid}/control", json={"action": action, "reason": reason, "actor": "alice"})


def test_pause_resume_stop_with_versions_and_audit(client):
    rid = new_run(client)["id"]
    paused = act(client, rid, "pause").json()
    assert paused["state"] == "paused" and paused["version"] == 2 and paused["actor"] == "alice"
    assert act(client, rid, "pause").json()["version"] == 2  # repeating is a no-op
    assert act(client, rid, "resume").json()["state"] == "running"
    assert act(client, rid, "stop").json()["state"] == "stopping"
    r = act(client, rid, "resume")
    assert r.status_code == 409 and "stopping" in r.json()["error"]["message"]
    events = client.get(f"/api/v1/runs/{rid}/control/audit").json()["events"]
    assert [(e["from_state"], e["to_state"]) for e in events] == [
        ("running", "paused"), ("paused", "running"), ("running", "stopping")]
    assert all(e["actor"] == "alice" and e["reason"] == "because" for e in events)


def test_bad_action_is_422(client):
    rid = new_run(client)["id"]
    assert client.post(f"/api/v1/runs/{rid}/control", json={"action": "explode"}).status_code == 422


def test_long_poll_answers_at_once_on_change(client):
    rid = new_run(client)["id"]
    # version already differs: immediate
    t0 = time.monotonic()
    r = client.get(f"/api/v1/runs/{rid}/control/wait", params={"after_version": 0, "timeout": 30})
    assert r.json()["version"] == 1 and time.monotonic() - t0 < 10  # not the 30 s timeout
    # no change: waits for the timeout
    t0 = time.monotonic()
    r = client.get(f"/api/v1/runs/{rid}/control/wait", params={"after_version": 1, "timeout": 0.5})
    assert r.json()["version"] == 1 and time.monotonic() - t0 >= 0.45
    # a pause during the wait wakes it well before the timeout
    pause = threading.Timer(0.3, lambda: act(client, rid, "pause"))
    pause.start()
    t0 = time.monotonic()
    r = client.get(f"/api/v1/runs/{rid}/control/wait", params={"after_version": 1, "timeout": 30})
    assert r.json()["state"] == "paused"
    assert time.monotonic() - t0 < 15  # woken by the pause, not the 30 s timeout
    pause.join(10)  # the waiter may answer before the pause's own response is read


def test_a_hook_completes_a_stop_and_only_a_stop(client, tokens):
    """An ingest token (what hooks carry) may turn `stopping` into `stopped`, naming the component
    that reported; it cannot acknowledge a stop nobody asked for, and a second report is a no-op."""
    hook = auth(tokens["ingest"])
    rid, other = (client.post("/api/v1/runs", headers=hook, json={"name": n}).json()["id"] for n in ("a", "b"))
    comp = client.post(f"/api/v1/runs/{rid}/components", headers=hook,
                       json={"side": "trainer", "worker_id": "trainer-0", "host": "h", "pid": 1}).json()
    r = client.post(f"/api/v1/runs/{rid}/control/stopped", headers=hook, json={"component_id": comp["id"]})
    assert r.status_code == 409 and "no stop to acknowledge" in r.json()["error"]["message"]
    assert client.get(f"/api/v1/runs/{rid}/control", headers=hook).json()["state"] == "running"

    r = client.post(f"/api/v1/runs/{rid}/control", headers=auth(tokens["admin"]), json={"action": "stop"})
    assert r.json()["state"] == "stopping"
    r = client.post(f"/api/v1/runs/{other}/control/stopped", headers=hook, json={"component_id": comp["id"]})
    assert r.status_code == 404  # a component of another run names no one here
    done = client.post(f"/api/v1/runs/{rid}/control/stopped", headers=hook, json={"component_id": comp["id"]})
    assert done.status_code == 200
    assert done.json()["state"] == "stopped" and done.json()["actor"] == "trainer trainer-0"
    again = client.post(f"/api/v1/runs/{rid}/control/stopped", headers=hook, json={})
    assert again.json()["version"] == done.json()["version"]
    events = client.get(f"/api/v1/runs/{rid}/control/audit", headers=auth(tokens["read"])).json()["events"]
    assert [(e["from_state"], e["to_state"]) for e in events][-1] == ("stopping", "stopped")
    r = client.post(f"/api/v1/runs/{rid}/control", headers=auth(tokens["admin"]), json={"action": "resume"})
    assert r.status_code == 409  # stopped is final
