"""Issue 26: idempotency per run with a content digest (metric batches and audits), and caps on
new metric keys with linear key creation (both databases)."""
from __future__ import annotations

import pytest
from sqlalchemy import func, select

from paritywatch.backend.main import create_app
from paritywatch.backend.models import IngestBatch, MetricKey, SampleAudit
from paritywatch.backend.settings import Settings
from tests.api.conftest import new_run
from tests.api.test_audits import audit_body
from tests.support.live import local_client


def post(client, run_id, seq, series, client_id="shared", steps=(1,), **extra):
    return client.post(f"/api/v1/runs/{run_id}/metrics",
                       json={"client_id": client_id, "seq": seq, "steps": list(steps), "series": series, **extra})


def last_values(client, run_id: int) -> dict:
    keys = client.get(f"/api/v1/runs/{run_id}/metrics", params={"limit": 10_000}).json()["keys"]
    return {k["key"]: k["last_value"] for k in keys if k["count"]}


def rows(app, model, **where) -> int:
    with app.state.db.read() as s:
        q = select(func.count()).select_from(model)
        for name, value in where.items():
            q = q.where(getattr(model, name) == value)
        return s.scalar(q)


def test_a_client_id_another_run_uses_does_not_make_a_batch_a_duplicate(client, app):
    a, b = new_run(client, "a")["id"], new_run(client, "b")["id"]
    assert post(client, b, 0, {"b/loss": [1.0]}).json()["duplicate"] is False
    r = post(client, a, 0, {"a/loss": [2.0]})  # same (client_id, seq), another run: a batch of its own
    assert r.status_code == 200 and r.json() == {"accepted": 1, "skipped_nonfinite": 0, "duplicate": False}
    assert [k["key"] for k in client.get(f"/api/v1/runs/{a}/metrics").json()["keys"]] == ["a/loss"]
    assert rows(app, IngestBatch, run_id=a) == 1 and rows(app, IngestBatch, run_id=b) == 1


def test_a_replay_is_a_duplicate_and_a_replay_with_other_content_is_a_409(client, app):
    run = new_run(client)["id"]
    assert post(client, run, 3, {"x": [1.0], "y": [None]}).json()["duplicate"] is False
    # the same content, keys in another order, NaN for null: a replay
    same = client.post(f"/api/v1/runs/{run}/metrics", content=b'{"client_id":"shared","seq":3,"steps":[1],'
                       b'"series":{"y":[NaN],"x":[1.0]}}', headers={"content-type": "application/json"})
    assert same.status_code == 200 and same.json()["duplicate"] is True
    for other in ({"x": [1.5], "y": [None]}, {"x": [1.0]}):
        r = post(client, run, 3, other)
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "conflict" and "other content" in r.json()["error"]["message"]
    assert post(client, run, 3, {"x": [1.0], "y": [None]}, steps=(2,)).status_code == 409  # other steps
    assert rows(app, IngestBatch) == 1
    assert last_values(client, run) == {"x": 1.0}


def test_a_ledger_row_without_digest_matches_any_replay(client, app):
    """Rows stored before migration 0016 have no digest: a replay is a duplicate, never a 409."""
    run = new_run(client)["id"]
    assert post(client, run, 0, {"x": [1.0]}).status_code == 200
    with app.state.db.write() as s:
        s.query(IngestBatch).update({IngestBatch.digest: None})
    r = post(client, run, 0, {"x": [9.0]})
    assert r.status_code == 200 and r.json()["duplicate"] is True


def test_audits_are_idempotent_per_run_and_a_changed_replay_is_a_409(client, app):
    a, b = new_run(client, "a")["id"], new_run(client, "b")["id"]
    assert client.post(f"/api/v1/runs/{b}/audits", json=audit_body("shared", 0)).json()["duplicate"] is False
    r = client.post(f"/api/v1/runs/{a}/audits", json=audit_body("shared", 0))
    assert r.status_code == 200 and r.json()["duplicate"] is False
    assert client.post(f"/api/v1/runs/{a}/audits", json=audit_body("shared", 0)).json()["duplicate"] is True
    changed = client.post(f"/api/v1/runs/{a}/audits", json=audit_body("shared", 0, length_mismatch=True))
    assert changed.status_code == 409 and "other content" in changed.json()["error"]["message"]
    assert rows(app, SampleAudit, run_id=a) == 1 and rows(app, SampleAudit, run_id=b) == 1


@pytest.fixture
def capped(db_url):
    settings = Settings(database_url=db_url, host="127.0.0.1", open_mode=True, max_new_keys_per_batch=3000,
                        max_keys_per_run=5000)
    app = create_app(settings, upgrade_schema=False)
    with local_client(app) as c:
        yield app, c


def test_new_keys_over_the_batch_cap_are_refused_whole(capped):
    app, client = capped
    run = new_run(client)["id"]
    r = post(client, run, 0, {f"k/{i}": [1.0] for i in range(3001)})
    assert r.status_code == 422
    assert "3,001 new metric keys" in r.text and "at most 3,000" in r.text
    assert rows(app, MetricKey) == 0 and rows(app, IngestBatch) == 0
    # at the cap: stored, its keys created ahead of the write (more than 2,000 of them)
    r = post(client, run, 1, {f"k/{i}": [float(i)] for i in range(3000)})
    assert r.status_code == 200 and r.json()["accepted"] == 3000
    assert rows(app, MetricKey, run_id=run) == 3000
    # known keys do not count: 2,500 known + 1,500 new is a batch within the cap
    r = post(client, run, 2, {f"k/{i}": [1.0] for i in range(1500, 4500)})
    assert r.status_code == 200 and r.json()["accepted"] == 3000


def test_a_batch_naming_far_more_keys_than_the_run_holds_is_refused_before_its_parse(capped, db_url, monkeypatch):
    """The guard counts a big body's series keys as it arrives; a batch naming more than the cap
    beyond what the run holds cannot be valid and is refused without the parse that would hold
    the event loop (99,000 keys: ~150 ms). A big batch of keys the run holds is parsed and stored,
    also by a process that has none of them cached (a restart)."""
    from paritywatch.backend.api import ingest

    parsed = []
    real_parse = ingest.parse_metric_batch
    monkeypatch.setattr(ingest, "parse_metric_batch", lambda *a: parsed.append(1) or real_parse(*a))
    app, client = capped
    run = new_run(client)["id"]
    r = post(client, run, 0, {f"k/{i:05d}": [1.0] for i in range(6000)})  # a body past INLINE_CHECK_BYTES
    assert r.status_code == 422 and "at least 6,000 new metric keys" in r.text and "at most 3,000" in r.text
    assert parsed == [] and rows(app, MetricKey) == 0 and rows(app, IngestBatch) == 0
    assert post(client, run, 1, {f"k/{i:05d}": [1.0] for i in range(3000)}).status_code == 200
    assert post(client, run, 2, {f"k/{i:05d}": [1.0] for i in range(3000, 4999)}).status_code == 200
    parsed.clear()
    settings = Settings(database_url=db_url, host="127.0.0.1", open_mode=True, max_new_keys_per_batch=3000,
                        max_keys_per_run=5000)
    with local_client(create_app(settings, upgrade_schema=False)) as restarted:
        r = post(restarted, run, 3, {f"k/{i:05d}": [2.0] for i in range(4999)})
        assert r.status_code == 200 and r.json()["accepted"] == 4999 and parsed == [1]
        # 6,000 keys the run's 4,999 do not rule out: parsed, then 2,999 known and 3,001 new
        r = post(restarted, run, 4, {f"k/{i:05d}": [2.0] for i in range(2000, 8000)})
        assert r.status_code == 422 and "3,001 new metric keys" in r.text and "at least" not in r.text
    assert rows(app, MetricKey, run_id=run) == 4999


def test_new_keys_over_the_run_cap_are_refused_whole(capped):
    app, client = capped
    run, other = new_run(client, "a")["id"], new_run(client, "b")["id"]
    assert post(client, run, 0, {f"k/{i}": [1.0] for i in range(2999)}).status_code == 200
    assert post(client, run, 1, {f"k/{i}": [1.0] for i in range(2999, 4999)}).status_code == 200
    r = post(client, run, 2, {"k/4999": [1.0], "k/5000": [1.0]})  # inline path (few keys)
    assert r.status_code == 422 and "run" in r.text and "4,999" in r.text and "at most 5,000" in r.text
    assert rows(app, MetricKey, run_id=run) == 4999
    assert post(client, run, 3, {"k/4999": [1.0]}).status_code == 200  # up to the cap
    assert post(client, other, 0, {"k/4999": [1.0], "k/5000": [1.0]}).status_code == 200  # per run


def test_keys_are_created_once_whatever_this_process_remembers(client, app):
    """A fresh store (a restart: no ids cached) finds the run's keys instead of creating them
    again, on the ahead path (more than 2,000 keys) and inline."""
    from paritywatch.backend.store.metrics import MetricStore, prepare_batch

    run = new_run(client)["id"]
    series = {f"k/{i}": [1.0] for i in range(2500)}
    assert post(client, run, 0, series).status_code == 200
    fresh = MetricStore(app.state.db)
    assert fresh.ingest(run, "other", 0, prepare_batch([2], series, 10_000, 200)) is True
    assert fresh.ingest(run, "other", 1, prepare_batch([3], {"k/1": [2.0], "new": [1.0]}, 10, 200)) is True
    assert rows(app, MetricKey, run_id=run) == 2501
    assert last_values(client, run)["k/1"] == 2.0


def test_nonfinite_config_values_are_kept_as_strings_on_both_databases(client, app):
    body = (b'{"name":"nan","config":{"lr":NaN,"clip":Infinity,"floor":-Infinity,"ok":1.5,'
            b'"nested":{"betas":[0.9,NaN]}}}')
    r = client.post("/api/v1/runs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    want = {"lr": "NaN", "clip": "Infinity", "floor": "-Infinity", "ok": 1.5, "nested": {"betas": [0.9, "NaN"]}}
    assert r.json()["config"] == want
    assert client.get(f"/api/v1/runs/{r.json()['id']}").json()["config"] == want
    merged = client.post("/api/v1/runs", content=b'{"name":"nan","config":{"ok":NaN}}',
                         headers={"content-type": "application/json"})
    assert merged.status_code == 200 and merged.json()["config"] == {**want, "ok": "NaN"}
