"""Detection that cannot be skipped (issue 12.5): every accepted metric batch a rule watches and
every fingerprint is evaluated exactly once, whatever fails between the write and the evaluation,
on SQLite and PostgreSQL. Failures are injected with the engine's test hook."""
from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select

from paritywatch.backend.background.detectors import parity as parity_detector
from paritywatch.backend.main import create_app
from paritywatch.backend.models import DetectJob, RuleState
from paritywatch.backend.settings import Settings
from tests.api.test_fingerprints import fake_fp
from tests.support.live import local_client, wait_for

BATCH = {"client_id": "trainer-0", "seq": 7, "steps": [10], "series": {"align/decode_mismatch_frac": [0.25]}}


@pytest.fixture
def settings(db_url) -> Settings:
    return Settings(database_url=db_url, open_mode=True, run_background_workers=False)


@pytest.fixture
def app(settings):
    return create_app(settings, upgrade_schema=False)


@pytest.fixture
def api(app):
    with local_client(app, raise_server_exceptions=False) as c:
        yield c


def fail_once(kind: str):
    """A test hook that fails the first evaluation of `kind`, as a crash or a lost connection would."""
    failures = []

    def hook(what: str, run_id: int) -> None:
        if what == kind and not failures:
            failures.append(run_id)
            raise RuntimeError("injected failure between the write and the evaluation")

    return hook


def pending_jobs(app) -> int:
    with app.state.db.read() as s:
        return s.scalar(select(func.count()).select_from(DetectJob))


def open_alerts(api, run_id: int) -> list[dict]:
    return api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]


def test_a_batch_whose_evaluation_failed_is_evaluated_by_its_retry(api, app):
    run_id = api.post("/api/v1/runs", json={"name": "retry"}).json()["id"]
    app.state.engine.fault_hook = fail_once("metrics")
    first = api.post(f"/api/v1/runs/{run_id}/metrics", json=BATCH)
    assert first.status_code == 500  # the hooks retry 5xx
    assert pending_jobs(app) == 1 and open_alerts(api, run_id) == []  # stored, not yet evaluated
    retry = api.post(f"/api/v1/runs/{run_id}/metrics", json=BATCH)
    assert retry.status_code == 200 and retry.json()["duplicate"] is True
    [alert] = open_alerts(api, run_id)
    assert alert["detail"]["key"] == "align/decode_mismatch_frac" and alert["severity"] == "error"
    assert api.get(f"/api/v1/runs/{run_id}/control").json()["state"] == "paused"  # its action ran too
    assert pending_jobs(app) == 0
    api.post(f"/api/v1/runs/{run_id}/metrics", json=BATCH)  # a further replay changes nothing
    assert len(api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]) == 1


def test_a_job_nobody_retried_is_evaluated_after_a_restart(api, app, settings):
    run_id = api.post("/api/v1/runs", json={"name": "orphan"}).json()["id"]
    app.state.engine.fault_hook = fail_once("metrics")
    assert api.post(f"/api/v1/runs/{run_id}/metrics", json=BATCH).status_code == 500
    assert pending_jobs(app) == 1
    restarted = create_app(settings.model_copy(update={"run_background_workers": True}), upgrade_schema=False)
    with local_client(restarted) as api2:  # its detection loop takes up leftovers at start
        wait_for(lambda: open_alerts(api2, run_id), timeout_s=20)
    assert pending_jobs(app) == 0


def test_a_job_is_evaluated_once_even_by_two_replicas_at_once(api, app, settings):
    """A rule that needs two breaching evaluations in a row: a batch evaluated twice would fire it."""
    run_id = api.post("/api/v1/runs", json={"name": "twice"}).json()["id"]
    rule = api.post(f"/api/v1/runs/{run_id}/rules",
                    json={"key": "loss", "comparison": ">", "threshold": 1.0, "consecutive": 2}).json()
    app.state.engine.fault_hook = fail_once("metrics")
    body = {"client_id": "c", "seq": 1, "steps": [1], "series": {"loss": [5.0]}}
    assert api.post(f"/api/v1/runs/{run_id}/metrics", json=body).status_code == 500
    replicas = [create_app(settings, upgrade_schema=False).state.engine for _ in range(2)]
    start = threading.Barrier(2)

    def drain(engine) -> None:
        start.wait()
        engine.process_pending(older_than_s=0)

    threads = [threading.Thread(target=drain, args=(e,)) for e in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    with app.state.db.read() as s:
        assert s.get(RuleState, (rule["id"], run_id)).streak == 1
    assert pending_jobs(app) == 0 and open_alerts(api, run_id) == []
    for e in replicas:
        e.db.dispose()


def fingerprint(template: str) -> dict:
    return fake_fp("{{ messages }}" + template)


def test_a_failed_fingerprint_evaluation_is_done_by_the_retry(api, app):
    run_id = api.post("/api/v1/runs", json={"name": "fp"}).json()["id"]
    trainer = api.post(f"/api/v1/runs/{run_id}/components", json={"side": "trainer"}).json()["id"]
    worker = api.post(f"/api/v1/runs/{run_id}/components", json={"side": "rollout", "worker_id": "w"}).json()["id"]
    assert api.post(f"/api/v1/runs/{run_id}/components/{trainer}/fingerprint", json=fingerprint("a")).status_code == 200
    app.state.engine.fault_hook = fail_once("fingerprint")
    assert api.post(f"/api/v1/runs/{run_id}/components/{worker}/fingerprint", json=fingerprint("b")).status_code == 500
    assert open_alerts(api, run_id) == [] and pending_jobs(app) == 1
    again = api.post(f"/api/v1/runs/{run_id}/components/{worker}/fingerprint", json={"digest": fingerprint("b")["digest"]})
    assert again.status_code == 200
    assert [a["kind"] for a in open_alerts(api, run_id)] == ["processor_mismatch"]
    assert pending_jobs(app) == 0


@pytest.mark.parametrize("second_fails", [False, True], ids=["second-evaluates", "second-fails"])
def test_two_concurrent_fingerprint_posts_never_resolve_each_others_alert(api, app, monkeypatch, second_fails):
    """Worker a's evaluation starts before worker b's fingerprint lands and applies after it:
    before the fix it applied a parity computed without b and resolved b's alert. Now a's
    evaluation reads the run under its lock: it finds its job already taken by b's evaluation
    (which saw both), or, when b's evaluation failed, evaluates both itself."""
    run_id = api.post("/api/v1/runs", json={"name": "race"}).json()["id"]
    ids = {w: api.post(f"/api/v1/runs/{run_id}/components", json={"side": side, "worker_id": w}).json()["id"]
           for side, w in [("trainer", "t"), ("rollout", "a"), ("rollout", "b")]}
    api.post(f"/api/v1/runs/{run_id}/components/{ids['t']}/fingerprint", json=fingerprint("ref"))
    prepared, release = threading.Event(), threading.Event()
    real = parity_detector.ParityDetector._warm_diffs
    calls = []

    def slow_first(self, rid):
        real(self, rid)
        calls.append(rid)
        if len(calls) == 1:  # worker a's evaluation: prepared, then held before it applies
            prepared.set()
            assert release.wait(30)

    monkeypatch.setattr(parity_detector.ParityDetector, "_warm_diffs", slow_first)
    posted_a = []
    thread = threading.Thread(target=lambda: posted_a.append(
        api.post(f"/api/v1/runs/{run_id}/components/{ids['a']}/fingerprint", json=fingerprint("x"))))
    thread.start()
    assert prepared.wait(30)
    if second_fails:
        app.state.engine.fault_hook = fail_once("fingerprint")
    posted_b = api.post(f"/api/v1/runs/{run_id}/components/{ids['b']}/fingerprint", json=fingerprint("y"))
    assert posted_b.status_code == (500 if second_fails else 200)
    release.set()
    thread.join(30)
    assert posted_a[0].status_code == 200
    alerts = open_alerts(api, run_id)
    assert sorted(a["detail"]["worker_ids"][0] for a in alerts) == ["a", "b"], alerts
    assert pending_jobs(app) == 0


def test_a_job_queued_before_batch_spans_existed_is_still_evaluated(api, app):
    """A job written by the previous release (payload: the key list alone), found after an upgrade,
    is evaluated on the series' newest point, as that release would have."""
    run_id = api.post("/api/v1/runs", json={"name": "upgrade"}).json()["id"]
    app.state.engine.fault_hook = fail_once("metrics")
    assert api.post(f"/api/v1/runs/{run_id}/metrics", json=BATCH).status_code == 500
    with app.state.db.write() as s:
        job = s.scalars(select(DetectJob)).one()
        job.payload = '["align/decode_mismatch_frac"]'
    assert app.state.engine.process_pending(older_than_s=0) == 1
    [alert] = open_alerts(api, run_id)
    assert alert["detail"]["value"] == 0.25 and "steps" not in alert["detail"]
