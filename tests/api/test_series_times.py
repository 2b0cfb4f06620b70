"""GET /runs/{id}/series/times: when the batches carrying a series arrived (the compare view's
wall-time axis). Arrival times are set in the database, so the test needs no clock."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from paritywatch.backend.models import IngestBatch, Run
from tests.api.conftest import new_run
from tests.api.test_metrics import post


def _arrivals(app, run_id: int, seconds_by_seq: dict[int, float]) -> None:
    """Pretend batch `seq` of client c1 arrived `seconds` after the run was created."""
    with app.state.db.write() as s:
        created = s.scalar(select(Run.created_at).where(Run.id == run_id))
        for seq, seconds in seconds_by_seq.items():
            s.execute(update(IngestBatch).where(IngestBatch.run_id == run_id, IngestBatch.seq == seq)
                      .values(received_at=created + timedelta(seconds=seconds)))


def test_each_batch_maps_its_last_step_to_seconds_since_the_run_started(client, app):
    run = new_run(client)
    rid = run["id"]
    post(client, rid, 1, [0, 1, 2], {"loss": [1.0, 0.9, 0.8]})
    post(client, rid, 2, [3, 4], {"loss": [0.7, 0.6], "other": [0.0, 0.0]})
    post(client, rid, 3, [5], {"other": [1.0]})  # does not carry loss
    post(client, rid, 4, [9000, 9001], {"loss": [0.5, 0.4]})  # two chunk windows, one batch
    _arrivals(app, rid, {1: 10, 2: 25.5, 3: 30, 4: 90})
    body = client.get(f"/api/v1/runs/{rid}/series/times", params={"key": "loss"}).json()
    assert body["key"] == "loss" and body["started_at"] == run["created_at"]
    assert body["steps"] == [2, 4, 9001]
    assert body["seconds"] == [10.0, 25.5, 90.0]


def test_a_step_sent_again_later_keeps_its_first_arrival_and_rows_are_thinned(client, app):
    rid = new_run(client)["id"]
    for seq in range(1, 11):
        post(client, rid, seq, [seq * 10], {"loss": [float(seq)]})
    post(client, rid, 1, [50], {"loss": [5.0]}, client_id="replayed")
    _arrivals(app, rid, {seq: seq for seq in range(1, 11)})
    with app.state.db.write() as s:  # the other client's copy of step 50 arrived last
        s.execute(update(IngestBatch).where(IngestBatch.client_id == "replayed")
                  .values(received_at=s.scalar(select(Run.created_at).where(Run.id == rid)) + timedelta(seconds=99)))
    full = client.get(f"/api/v1/runs/{rid}/series/times", params={"key": "loss"}).json()
    assert full["steps"] == [10 * i for i in range(1, 11)]
    assert full["seconds"] == [float(i) for i in range(1, 11)]
    thin = client.get(f"/api/v1/runs/{rid}/series/times", params={"key": "loss", "points": 4}).json()
    assert len(thin["steps"]) == 4 and thin["steps"][0] == 10 and thin["steps"][-1] == 100
    assert thin["steps"] == sorted(thin["steps"])


def test_strict_inputs(client):
    rid = new_run(client)["id"]
    post(client, rid, 1, [1], {"loss": [1.0]})
    url = f"/api/v1/runs/{rid}/series/times"
    assert client.get(url, params={"key": "nope"}).status_code == 404
    assert client.get(f"/api/v1/runs/{rid + 1000}/series/times", params={"key": "loss"}).status_code == 404
    assert client.get(url).status_code == 422  # key is required
    assert client.get(url, params={"key": "loss", "points": 0}).status_code == 422
    assert client.get(url, params={"key": "loss", "step_min": 3}).status_code == 422  # not a parameter here


def test_read_scope_may_read_it_ingest_may_not(client, tokens):
    from tests.api.conftest import auth

    rid = client.post("/api/v1/runs", json={"name": "r"}, headers=auth(tokens["admin"])).json()["id"]
    body = {"client_id": "c", "seq": 1, "steps": [1], "series": {"loss": [1.0]}}
    assert client.post(f"/api/v1/runs/{rid}/metrics", json=body, headers=auth(tokens["ingest"])).status_code == 200
    url = f"/api/v1/runs/{rid}/series/times?key=loss"
    assert client.get(url, headers=auth(tokens["read"])).status_code == 200
    assert client.get(url, headers=auth(tokens["ingest"])).status_code == 403
    assert client.get(url).status_code == 401
