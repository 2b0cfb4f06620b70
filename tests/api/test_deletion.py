"""Run deletion and raw-point retention (issue 17.6), on SQLite and PostgreSQL."""
from __future__ import annotations

import random
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text

from paritywatch.backend.alerts import lifecycle
from paritywatch.backend.background.janitor import Janitor
from paritywatch.backend.main import create_app
from paritywatch.backend.models import (
    Alert, AlertEvent, Component, ControlEvent, IngestBatch, MetricChunk, MetricKey, MetricRollup, Rule, Run,
    SampleAudit, SampleAuditSample, TaintSpan, WebhookDelivery, utcnow,
)
from paritywatch.backend.store import retention
from tests.api.conftest import new_run
from tests.api.test_audits import audit_body
from tests.api.test_metrics import brute_force
from tests.support.live import local_client, wait_for

PER_RUN = (MetricChunk, MetricRollup, MetricKey, IngestBatch, Alert, AlertEvent, Component, ControlEvent, Rule,
           SampleAudit, SampleAuditSample, TaintSpan)  # the sample_audit alert leaves a taint span


def rows_of(app, run_id: int) -> dict[str, int]:
    """Rows belonging to a run, per table (webhook deliveries: those whose payload names it)."""
    out = {}
    with app.state.db.read() as s:
        keys = select(MetricKey.id).where(MetricKey.run_id == run_id).scalar_subquery()
        alerts = select(Alert.id).where(Alert.run_id == run_id).scalar_subquery()
        for model in PER_RUN:
            if model in (MetricChunk, MetricRollup):
                q = select(func.count()).select_from(model).where(model.series_id.in_(keys))
            elif model is AlertEvent:
                q = select(func.count()).select_from(model).where(model.alert_id.in_(alerts))
            else:
                q = select(func.count()).select_from(model).where(model.run_id == run_id)
            out[model.__tablename__] = s.scalar(q)
        out["webhook_deliveries"] = sum(1 for d in s.scalars(select(WebhookDelivery))
                                        if d.payload.get("data", {}).get("run", {}).get("id") == run_id)
    return out


def pending_deletions(app) -> list[int]:
    with app.state.db.read() as s:
        return retention.pending_deletions(s)


def seed(client, app, name: str, batches: int = 12) -> dict:
    """A run with processes, dense and sparse metric batches, rules, control changes, alerts and
    webhook deliveries about it."""
    run = new_run(client, name)
    rid = run["id"]
    comp = client.post(f"/api/v1/runs/{rid}/components", json={"side": "trainer"}).json()["id"]
    rng, step = random.Random(rid), 0
    for seq in range(batches):
        n = rng.choice([3, 40, 300, 2000])
        steps = list(range(step, step + n))
        step += n
        body = {"client_id": f"{name}-c", "seq": seq, "component_id": comp, "steps": steps,
                "series": {k: [rng.random() for _ in steps] for k in ("loss", "align/kl_k3")}}
        assert client.post(f"/api/v1/runs/{rid}/metrics", json=body).status_code == 200
    for seq in range(3):  # per-sample audits, one with failing samples (a sample_audit alert)
        body = audit_body(f"{name}-a", seq, step=seq, length_mismatch=seq == 1, component_id=comp)
        assert client.post(f"/api/v1/runs/{rid}/audits", json=body).status_code == 200
    client.post(f"/api/v1/runs/{rid}/rules", json={"key": "loss", "comparison": ">", "threshold": 99.0})
    client.post(f"/api/v1/runs/{rid}/control", json={"action": "pause", "reason": "test"})
    with app.state.db.write() as s:
        for i in range(3):
            alert, _ = lifecycle.fire(s, s.get(Run, rid), "metric_threshold", "warning", f"k{i}", f"t{i}", {})
            lifecycle.resolve(s, s.get(Run, rid), alert, "test")
    return run


@pytest.fixture
def hook(client, app):
    """A webhook subscribed to everything, pointing nowhere reachable: deliveries stay queued."""
    app.state.settings.allow_loopback_webhooks = True
    return client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/never"}).json()


def test_deleting_a_run_hides_it_at_once_then_removes_every_row_but_the_audit(client, app, hook):
    doomed, kept = seed(client, app, "doomed"), seed(client, app, "kept")
    kept_rows = rows_of(app, kept["id"])
    kept_series = client.get(f"/api/v1/runs/{kept['id']}/series", params={"key": "loss"}).json()
    assert all(rows_of(app, doomed["id"]).values())  # every kind of row exists before

    r = client.delete(f"/api/v1/runs/{doomed['id']}", params={"reason": "junk run"})
    assert r.status_code == 204
    # gone for the API at once
    assert client.get(f"/api/v1/runs/{doomed['id']}").status_code == 404
    assert client.delete(f"/api/v1/runs/{doomed['id']}").status_code == 404
    assert [x["id"] for x in client.get("/api/v1/runs").json()["runs"]] == [kept["id"]]
    late = {"client_id": "late", "seq": 0, "steps": [1], "series": {"loss": [1.0]}}
    assert client.post(f"/api/v1/runs/{doomed['id']}/metrics", json=late).status_code == 404
    # its name is free at once: a run of that name is a new, empty run
    again = new_run(client, "doomed")
    assert again["id"] != doomed["id"] and again["last_step"] is None

    record = wait_for(lambda: next((d for d in client.get("/api/v1/run-deletions").json()["deletions"]
                                    if d["run_id"] == doomed["id"] and d["finished_at"]), None),
                      timeout_s=30)
    assert record["name"] == "doomed" and record["project"] == "default" and record["reason"] == "junk run"
    assert record["actor"] == "open-loopback" and record["points"] > 0
    assert set(rows_of(app, doomed["id"]).values()) == {0}
    with app.state.db.read() as s:
        assert s.get(Run, doomed["id"]) is None
    assert rows_of(app, kept["id"]) == kept_rows  # the other run lost nothing
    assert client.get(f"/api/v1/runs/{kept['id']}/series", params={"key": "loss"}).json() == kept_series


def test_each_purge_step_removes_at_most_its_limit(db_url, settings):
    """The point of the steps: no transaction removes more than it was asked to."""
    settings = settings.model_copy(update={"run_background_workers": False})
    app = create_app(settings, upgrade_schema=False)
    with local_client(app) as client:
        run = seed(client, app, "big", batches=30)
        with app.state.db.write() as s:
            retention.request_deletion(s, run["id"], "test", None)
        remover = retention.RowRemover(app.state.db, app.state.metrics)
        chunks = rows_of(app, run["id"])["metric_chunks"]
        assert chunks > 20
        step = next(s for s in remover.steps if s.table == "metric_chunks")
        assert remover.delete_some(step, run["id"], 7)[0] == 7
        assert rows_of(app, run["id"])["metric_chunks"] == chunks - 7
        # nothing runs in the background here: the janitor of a restarted server finishes it
        Janitor(app.state.db, app.state.metrics, settings).run_once()
        assert set(rows_of(app, run["id"]).values()) == {0}
        assert pending_deletions(app) == []


def test_a_new_run_that_reuses_a_deleted_runs_id_gets_none_of_its_series(client, app):
    """SQLite hands the highest deleted id out again; the ingest path's cached series ids of the
    old run must not send the new run's points into the old (deleted) series."""
    first = seed(client, app, "first", batches=3)
    client.delete(f"/api/v1/runs/{first['id']}")
    wait_for(lambda: not pending_deletions(app), timeout_s=30)
    second = new_run(client, "second")
    body = {"client_id": "second", "seq": 0, "steps": [5, 6], "series": {"loss": [7.0, 8.0]}}
    assert client.post(f"/api/v1/runs/{second['id']}/metrics", json=body).status_code == 200
    got = client.get(f"/api/v1/runs/{second['id']}/series", params={"key": "loss"}).json()
    assert got["buckets"]["last"] == [7.0, 8.0] and got["buckets"]["count"] == [1, 1]
    keys = client.get(f"/api/v1/runs/{second['id']}/metrics").json()["keys"]
    assert [(k["key"], k["count"]) for k in keys] == [("loss", 2)]


def _age_batches(app, upto_batch_id: int, days: float) -> None:
    old = utcnow() - timedelta(days=days)
    with app.state.db.write() as s:
        s.execute(IngestBatch.__table__.update().where(IngestBatch.id <= upto_batch_id).values(received_at=old))


def test_retention_drops_old_raw_points_and_old_runs_still_chart_from_roll_ups(db_url, settings):
    settings = settings.model_copy(update={"run_background_workers": False, "retention_raw_days": 7})
    app = create_app(settings, upgrade_schema=False)
    with local_client(app) as client:
        rid = new_run(client, "long")["id"]
        rng, pts, seq = random.Random(5), [], 0
        for size in [5, 300, 17, 2000, 1, 256, 40, 900, 3, 3000, 64]:  # sparse and dense batches
            steps = list(range(len(pts) * 2, len(pts) * 2 + size * 2, 2))
            vals = [rng.uniform(-1, 1) for _ in steps]
            client.post(f"/api/v1/runs/{rid}/metrics", json={"client_id": "c", "seq": seq, "steps": steps,
                                                                "series": {"s": vals}})
            pts += list(zip(steps, vals))
            seq += 1
        with app.state.db.read() as s:
            batch_ids = list(s.scalars(select(IngestBatch.id).order_by(IngestBatch.id)))
        old_batches = batch_ids[:8]
        _age_batches(app, old_batches[-1], days=10)
        full_before = client.get(f"/api/v1/runs/{rid}/series", params={"key": "s", "points": 50}).json()

        janitor = Janitor(app.state.db, app.state.metrics, settings)
        janitor.run_once()

        with app.state.db.read() as s:
            left = set(s.scalars(select(MetricChunk.batch_id)))
            floor = s.scalar(select(MetricKey.raw_floor))
        assert left == set(batch_ids[8:])  # the old batches' raw points are gone, the rest kept
        n_old = sum(1 for p in pts if p[0] < floor)
        assert n_old == sum(size for size in [5, 300, 17, 2000, 1, 256, 40, 900])
        # the whole run still charts, every point counted once, min/max unchanged
        full = client.get(f"/api/v1/runs/{rid}/series", params={"key": "s", "points": 50}).json()
        assert full["buckets"] == full_before["buckets"]
        # a zoomed read of the pruned range comes from roll-ups: 16-step buckets, exact per bucket
        got = client.get(f"/api/v1/runs/{rid}/series",
                         params={"key": "s", "points": 1000, "step_min": 100, "step_max": 3000}).json()
        assert got["bucket_width"] == 16 and got["origin"] == 96
        b = got["buckets"]
        expected = sorted(brute_force([p for p in pts if 96 <= p[0] < 3008], 96, 16, 96).items())
        assert [e[1][4] for e in expected] == b["count"]
        assert [e[1][0] for e in expected] == b["min"] and [e[1][1] for e in expected] == b["max"]
        assert [e[1][3] for e in expected] == b["last"]
        # recent points are raw as before: a narrow read there is exact to the step
        recent = [p for p in pts if p[0] >= floor][:10]
        got = client.get(f"/api/v1/runs/{rid}/series", params={
            "key": "s", "points": 100, "step_min": recent[0][0], "step_max": recent[-1][0]}).json()
        assert got["bucket_width"] == 1 and got["buckets"]["last"] == [v for _, v in recent]
        # a second round finds nothing more to do and changes nothing
        janitor._retention_due = 0
        janitor.run_once()
        assert client.get(f"/api/v1/runs/{rid}/series", params={"key": "s", "points": 50}).json() == full


def test_retention_is_off_by_default(client, app):
    rid = seed(client, app, "r", batches=3)["id"]
    with app.state.db.read() as s:
        last = s.scalar(select(func.max(IngestBatch.id)))
    _age_batches(app, last, days=3650)
    Janitor(app.state.db, app.state.metrics, app.state.settings).run_once()
    assert rows_of(app, rid)["metric_chunks"] > 0


def test_sqlite_downgrade_of_0005_keeps_every_run(tmp_path):
    """0005's downgrade must not copy `runs` (dropping it would cascade-delete every run's rows)."""
    from paritywatch.backend import migrate
    from paritywatch.backend.db import Database

    url = f"sqlite:///{tmp_path / 'd.db'}"
    migrate.upgrade(url)
    db = Database(url)
    with db.write() as s:
        s.add(Run(name="keep", project="p"))
        s.flush()
        s.add(Component(run_id=1, side="trainer", worker_id="0"))
    db.dispose()
    migrate.downgrade(url, "0002")
    migrate.upgrade(url)
    db = Database(url)
    try:
        with db.read() as s:
            assert s.scalar(select(func.count()).select_from(Component)) == 1
            assert s.execute(text("SELECT name FROM runs")).scalar() == "keep"
    finally:
        db.dispose()
