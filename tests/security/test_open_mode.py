"""Issue 13.1: open mode is for the person at this machine, not for every page their browser opens.

Measured before the fix: a request with a foreign Host got 200 (DNS rebinding reads and writes
everything), and a cross-site POST with no Content-Type paused a run."""
from __future__ import annotations

import httpx

from paritywatch.backend.auth import create_token, list_tokens, revoke_token
from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, local_client

MISMATCH = {"client_id": "evil", "seq": 1, "steps": [1], "series": {"align/decode_mismatch_frac": [1.0]}}


def _run(api: httpx.Client) -> int:
    r = api.post("/api/v1/runs", json={"name": "victim"})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_a_rebinding_host_is_refused(open_server):
    """A page on evil.example whose DNS now answers 127.0.0.1 sends `Host: evil.example:PORT`."""
    with httpx.Client(base_url=open_server.url, timeout=30) as api:
        assert api.get("/api/v1/runs").status_code == 200  # the local user: still open
        rebound = {"Host": f"evil.example:{open_server.port}"}
        r = api.get("/api/v1/runs", headers=rebound)
        assert r.status_code == 403 and "localhost" in r.json()["error"]["message"]
        r = api.post("/api/v1/webhooks", json={"url": "https://hooks.example/x"}, headers=rebound)
        assert r.status_code == 403
        assert api.get("/api/v1/webhooks").json()["webhooks"] == []
        # Every loopback spelling a local tool uses still works, any port (an ssh tunnel).
        for host in ("localhost:9999", "127.0.0.1", "[::1]:8321", "127.0.0.2:1"):
            assert api.get("/api/v1/runs", headers={"Host": host}).status_code == 200, host


def test_a_cross_site_no_cors_post_cannot_pause_a_run(open_server):
    """What a form or `fetch(..., {mode: "no-cors"})` on another site sends: no Content-Type
    (or text/plain), an Origin, Sec-Fetch-Site: cross-site."""
    with httpx.Client(base_url=open_server.url, timeout=30) as api:
        run_id = _run(api)
        body = httpx.Request("POST", "/", json=MISMATCH).content
        attacks = [
            {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
            {"Origin": "https://evil.example", "Content-Type": "text/plain"},
            {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"},
            {"Origin": "null", "Content-Type": "application/json"},  # a sandboxed frame
            {"Origin": "http://localhost:8888", "Content-Type": "application/json"},  # another local app
            {},  # even a local tool must say it sends JSON
        ]
        for headers in attacks:
            r = api.post(f"/api/v1/runs/{run_id}/metrics", content=body, headers=headers)
            assert r.status_code in (403, 415), (headers, r.status_code, r.text)
        assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "running"
        assert api.get(f"/api/v1/runs/{run_id}/metrics").json()["keys"] == []
        # The dashboard's own POST (same origin) and the hooks' (no Origin, JSON) still work.
        same_origin = {"Origin": open_server.url, "Sec-Fetch-Site": "same-origin"}
        r = api.post(f"/api/v1/runs/{run_id}/control", json={"action": "pause"}, headers=same_origin)
        assert r.status_code == 200 and r.json()["state"] == "paused"
        assert api.post(f"/api/v1/runs/{run_id}/metrics", json={**MISMATCH, "seq": 2}).status_code == 200


def test_open_mode_is_an_explicit_setting_and_local_peers_only(sqlite_db):
    """`uvicorn --factory paritywatch.backend.main:create_app --host 0.0.0.0` with no token: not open (the
    default settings say closed); and an open server still refuses a caller from the network."""
    with ThreadServer(Settings(database_url=sqlite_db, open_mode=False)) as server:
        r = httpx.get(server.url + "/api/v1/runs")
        assert r.status_code == 401 and httpx.get(server.url + "/healthz").json()["open_mode"] is False
    assert Settings(database_url=sqlite_db).open_mode is False  # nothing in the environment opens it
    app = create_app(Settings(database_url=sqlite_db, open_mode=True), upgrade_schema=False)
    with local_client(app) as local:
        assert local.get("/api/v1/runs").status_code == 200
    from fastapi.testclient import TestClient

    with TestClient(app, base_url="http://127.0.0.1:8321", client=("10.1.2.3", 40000)) as remote:
        r = remote.get("/api/v1/runs")
        assert r.status_code == 403 and "this machine" in r.json()["error"]["message"]
        assert remote.get("/healthz").status_code == 200  # public routes stay public


def test_revoking_the_last_token_does_not_reopen_the_server(sqlite_db):
    app = create_app(Settings(database_url=sqlite_db, open_mode=True), upgrade_schema=False)
    with local_client(app) as client:
        assert client.get("/api/v1/runs").status_code == 200
        _, secret = create_token(app.state.db, "only", ["admin"])
        app.state.open_mode._checked_at = -1e9  # re-check now instead of within 2 s
        assert client.get("/api/v1/runs").status_code == 401
        [token] = list_tokens(app.state.db)
        assert revoke_token(app.state.db, token.id)
        app.state.tokens.invalidate()
        app.state.open_mode._checked_at = -1e9
        assert client.get("/api/v1/runs").status_code == 401
        assert client.get("/healthz").json()["open_mode"] is False
        assert client.get("/api/v1/runs", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
