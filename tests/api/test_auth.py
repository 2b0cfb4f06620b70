import pytest

from tests.api.conftest import auth, make_token


def test_open_mode_only_without_tokens(client, app):
    assert client.get("/healthz").json()["open_mode"] is True
    assert client.get("/api/v1/runs").status_code == 200
    make_token(app, "read")
    assert client.get("/healthz").json()["open_mode"] is False
    assert client.get("/api/v1/runs").status_code == 401


def test_ingest_token_cannot_pause_resume_or_configure(client, tokens):
    run = client.post("/api/v1/runs", json={"name": "r"}, headers=auth(tokens["ingest"])).json()
    for action in ("pause", "resume", "stop"):
        r = client.post(f"/api/v1/runs/{run['id']}/control", json={"action": action}, headers=auth(tokens["ingest"]))
        assert r.status_code == 403, action
        assert "admin" in r.json()["error"]["message"]
    assert client.get(f"/api/v1/runs/{run['id']}", headers=auth(tokens["admin"])).json()["control"]["state"] == "running"


def test_scopes(client, tokens):
    run = client.post("/api/v1/runs", json={"name": "r"}, headers=auth(tokens["admin"])).json()
    rid = run["id"]
    # read may GET but not post
    assert client.get("/api/v1/runs", headers=auth(tokens["read"])).status_code == 200
    assert client.post("/api/v1/runs", json={"name": "x"}, headers=auth(tokens["read"])).status_code == 403
    # ingest may post and read its control state, not list runs
    assert client.get("/api/v1/runs", headers=auth(tokens["ingest"])).status_code == 403
    assert client.get(f"/api/v1/runs/{rid}/control", headers=auth(tokens["ingest"])).status_code == 200
    # admin may everything
    r = client.post(f"/api/v1/runs/{rid}/control", json={"action": "pause"}, headers=auth(tokens["admin"]))
    assert r.status_code == 200 and r.json()["state"] == "paused"


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "])
def test_missing_or_bad_token_is_401(client, tokens, header):
    headers = {"Authorization": header} if header else {}
    r = client.get("/api/v1/runs", headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "unauthorized"


def test_revoked_token_is_refused(client, app, tokens):
    from paritywatch.backend.auth import list_tokens, revoke_token

    tid = next(t.id for t in list_tokens(app.state.db) if "read" in t.scopes.split(","))
    revoke_token(app.state.db, tid)
    app.state.tokens.invalidate()
    assert client.get("/api/v1/runs", headers=auth(tokens["read"])).status_code == 401


def test_tokens_stored_hashed(app, tokens):
    from paritywatch.backend.auth import list_tokens

    for t in list_tokens(app.state.db):
        assert all(secret not in (t.token_hash, t.prefix) for secret in tokens.values())
        assert len(t.token_hash) == 64
