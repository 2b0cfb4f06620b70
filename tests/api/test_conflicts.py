"""A 409 (the request conflicts with what is stored) is a documented answer of the operation that
gives it: clients generated from the OpenAPI schema, and schemathesis's status check, read it there.
Found by schemathesis, which reached `POST /silences/{id}/expire` on an ended silence: an
undocumented 409."""
from __future__ import annotations

import pytest

from tests.api.conftest import new_run


def documented(client, method: str, path: str) -> set[str]:
    return set(client.get("/api/v1/openapi.json").json()["paths"][path][method]["responses"])


def test_expiring_an_ended_silence_is_a_documented_409(client):
    silence = client.post("/api/v1/silences", json={"project": "ml", "duration_s": 60, "reason": "drain"}).json()
    assert client.post(f"/api/v1/silences/{silence['id']}/expire").status_code == 200
    again = client.post(f"/api/v1/silences/{silence['id']}/expire")
    assert again.status_code == 409 and "already ended" in again.json()["error"]["message"]
    assert "409" in documented(client, "post", "/api/v1/silences/{silence_id}/expire")


def test_resuming_a_stopping_run_is_a_documented_409(client):
    run = new_run(client)
    assert client.post(f"/api/v1/runs/{run['id']}/control", json={"action": "stop"}).status_code == 200
    r = client.post(f"/api/v1/runs/{run['id']}/control", json={"action": "resume"})
    assert r.status_code == 409 and "cannot resume a run that is stopping" in r.json()["error"]["message"]
    assert "409" in documented(client, "post", "/api/v1/runs/{run_id}/control")


def test_a_replay_with_other_content_is_a_documented_409(client):
    run = new_run(client)
    batch = {"client_id": "c", "seq": 0, "steps": [0], "series": {"loss": [1.0]}}
    url = f"/api/v1/runs/{run['id']}/metrics"
    assert client.post(url, json=batch).status_code == 200
    r = client.post(url, json={**batch, "series": {"loss": [2.0]}})
    assert r.status_code == 409 and "replay" in r.json()["error"]["message"]
    assert "409" in documented(client, "post", "/api/v1/runs/{run_id}/metrics")


@pytest.mark.parametrize("path,method", [("/api/v1/runs/{run_id}/control/stopped", "post"),
                                         ("/api/v1/alerts/{alert_id}/acknowledge", "post"),
                                         ("/api/v1/runs/{run_id}/audits", "post")])
def test_every_operation_that_can_conflict_says_so(client, path, method):
    assert "409" in documented(client, method, path)
