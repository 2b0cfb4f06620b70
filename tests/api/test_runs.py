from tests.api.conftest import new_run


def test_create_or_get_is_idempotent_and_merges_tags(client):
    a = new_run(client, "grpo", project="p", tags={"model": "qwen"})
    b = new_run(client, "grpo", project="p", tags={"seed": "1"})
    assert a["id"] == b["id"]
    assert b["tags"] == {"model": "qwen", "seed": "1"}
    assert b["control"]["state"] == "running"


def test_same_name_in_another_project_is_another_run(client):
    assert new_run(client, "x", project="a")["id"] != new_run(client, "x", project="b")["id"]


def test_list_and_get_with_components(client):
    run = new_run(client)
    comp = client.post(f"/api/v1/runs/{run['id']}/components", json={"side": "trainer", "host": "h", "pid": 7}).json()
    listed = client.get("/api/v1/runs").json()["runs"]
    assert [r["id"] for r in listed] == [run["id"]]
    got = client.get(f"/api/v1/runs/{run['id']}").json()
    assert got["components"][0]["id"] == comp["id"]
    assert got["components"][0]["side"] == "trainer"


def test_component_reregistration_keeps_row(client):
    run = new_run(client)
    url = f"/api/v1/runs/{run['id']}/components"
    a = client.post(url, json={"side": "rollout", "worker_id": "w3", "pid": 1}).json()
    b = client.post(url, json={"side": "rollout", "worker_id": "w3", "pid": 2}).json()
    assert a["id"] == b["id"] and b["pid"] == 2


def test_heartbeat_returns_control_state(client):
    run = new_run(client)
    comp = client.post(f"/api/v1/runs/{run['id']}/components", json={"side": "rollout"}).json()
    r = client.post(f"/api/v1/runs/{run['id']}/components/{comp['id']}/heartbeat")
    assert r.status_code == 200 and r.json()["control"]["state"] == "running"


def test_unknown_run_and_component_are_404(client):
    assert client.get("/api/v1/runs/999").status_code == 404
    run = new_run(client)
    r = client.post(f"/api/v1/runs/{run['id']}/components/999/heartbeat")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_bad_run_bodies_are_422_with_message(client):
    for body in ({}, {"name": ""}, {"name": "x" * 201}, {"name": "a\nb"}, {"name": "x", "bogus": 1}):
        r = client.post("/api/v1/runs", json=body)
        assert r.status_code == 422, body
        assert r.json()["error"]["message"]
    r = client.post("/api/v1/runs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
