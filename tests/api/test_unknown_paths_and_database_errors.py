"""Unknown API paths and wrong methods answer in the error shape, never with dashboard files;
routes registered next to the dashboard stay reachable."""
import sqlite3

import pytest
from tests.support.live import local_client


def test_unknown_api_path_is_404_in_the_error_shape(client):
    r = client.get("/api/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_wrong_method_is_405_with_allow(client):
    r = client.request("OPTIONS", "/api/v1/runs/1/control")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_dashboard_routes_and_files_still_answer(client):
    cfg = client.get("/api/v1/ui-config")
    assert cfg.status_code == 200 and cfg.json()["plotly_url"].startswith("/vendor/plotly-")
    assert client.get(cfg.json()["plotly_url"]).status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    # the versioned plotly bundle is preloaded while the HTML parses
    assert f'<link rel="preload" as="script" href="{cfg.json()["plotly_url"]}">' in page.text


@pytest.mark.parametrize("make_error", [
    lambda: __import__("psycopg").errors.DeadlockDetected("deadlock detected"),
    lambda: __import__("psycopg").OperationalError("server closed the connection unexpectedly"),
    lambda: sqlite3.OperationalError("database is locked"),
])
def test_a_busy_or_absent_database_is_503_with_retry_after(client, app, monkeypatch, make_error):
    """Not a 500: nothing was written and the hooks' retry of the same batch is safe."""
    run = client.post("/api/v1/runs", json={"name": "busy"}).json()

    def fail(*_args, **_kwargs):
        raise make_error()

    monkeypatch.setattr(app.state.metrics, "_write", fail)  # inside the group-commit writer's transaction
    with local_client(app, raise_server_exceptions=False) as c:
        r = c.post(f"/api/v1/runs/{run['id']}/metrics", json={"client_id": "c", "seq": 0, "steps": [1], "series": {"x": [1.0]}})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "unavailable"


def test_a_real_bug_in_sql_is_still_a_500(client, app, monkeypatch):
    run = client.post("/api/v1/runs", json={"name": "bug"}).json()

    def fail(*_args, **_kwargs):
        raise sqlite3.OperationalError("no such table: metric_chunkz")

    monkeypatch.setattr(app.state.metrics, "_write", fail)  # inside the group-commit writer's transaction
    with local_client(app, raise_server_exceptions=False) as c:
        r = c.post(f"/api/v1/runs/{run['id']}/metrics", json={"client_id": "c", "seq": 0, "steps": [1], "series": {"x": [1.0]}})
    assert r.status_code == 500
