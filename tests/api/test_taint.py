"""What a run trained on (issue 25.4): once a divergence opened, the run keeps the steps it trained
while it was open, after its alerts resolve, in the runs list, the run, `GET /runs/{id}/taint`
(which judges a checkpoint's step) and the webhook that says the run ended. Both engines (db_url);
background threads off, so the sweep and the deliveries run when the test says."""
from __future__ import annotations

from datetime import timedelta

import pytest

from paritywatch.backend.control import run_state
from paritywatch.backend.main import create_app
from paritywatch.backend.models import utcnow
from paritywatch.backend.settings import Settings
from tests.api.test_fingerprints import fake_fp
from tests.support.live import WebhookReceiver, local_client

API = "/api/v1"
GOOD, BAD = fake_fp("{{ messages }}"), fake_fp("{{ messages | tojson }}")  # chat templates differ: an error
TIMEOUT = 60.0


@pytest.fixture
def app(db_url):
    settings = Settings(database_url=db_url, open_mode=True, run_background_workers=False, heartbeat_timeout_s=TIMEOUT,
                        allow_loopback_webhooks=True, webhook_group_wait_s=0, public_url="https://pw.example.org")
    return create_app(settings, upgrade_schema=False)


@pytest.fixture
def api(app):
    with local_client(app) as c:
        yield c


class Job:
    """A run with a trainer and rollout workers, driven through the API as the hooks drive it."""

    def __init__(self, api, name: str, workers: int = 3):
        self.api, self.seq = api, 0
        self.id = api.post(f"{API}/runs", json={"name": name}).json()["id"]
        self.trainer = self.register("trainer", "trainer-0")
        self.fingerprint(self.trainer, GOOD)
        self.workers = [self.register("rollout", f"rollout-{i}") for i in range(workers)]

    def register(self, side: str, worker_id: str) -> int:
        r = self.api.post(f"{API}/runs/{self.id}/components", json={"side": side, "worker_id": worker_id})
        assert r.status_code == 200, r.text
        return r.json()["id"]

    def fingerprint(self, component_id: int, fp: dict) -> None:
        r = self.api.post(f"{API}/runs/{self.id}/components/{component_id}/fingerprint", json=fp)
        assert r.status_code == 200, r.text

    def train(self, first: int, last: int, **series: float) -> None:
        """The trainer logs steps first..last (inclusive) in one batch."""
        self.seq += 1
        steps = list(range(first, last + 1))
        body = {"client_id": f"trainer-of-{self.id}", "seq": self.seq, "steps": steps,
                "series": {"loss": [1.0] * len(steps), **{k: [v] * len(steps) for k, v in series.items()}}}
        r = self.api.post(f"{API}/runs/{self.id}/metrics", json=body)
        assert r.status_code == 200, r.text

    def control(self, action: str) -> None:
        r = self.api.post(f"{API}/runs/{self.id}/control", json={"action": action, "reason": "test"})
        assert r.status_code == 200, r.text

    def close(self, component_id: int) -> None:
        assert self.api.post(f"{API}/runs/{self.id}/components/{component_id}/close").status_code == 200

    def get(self) -> dict:
        return self.api.get(f"{API}/runs/{self.id}").json()

    def taint(self, **params) -> dict:
        r = self.api.get(f"{API}/runs/{self.id}/taint", params=params)
        assert r.status_code == 200, r.text
        return r.json()


def test_a_run_resumed_after_a_mismatch_keeps_its_tainted_steps_after_the_alerts_resolve(api):
    job = Job(api, "resumed")
    for w in job.workers[:2]:
        job.fingerprint(w, GOOD)
    job.train(0, 211)
    job.fingerprint(job.workers[2], BAD)  # an autoscaled worker loads the processor by model name
    assert job.get()["control"]["state"] == "paused"
    assert job.get()["taint"]["tainted"] is False  # caught in the pause: no step trained on it yet
    job.control("resume")  # someone resumes without fixing it
    job.train(212, 251)
    job.fingerprint(job.workers[2], {"digest": GOOD["digest"]})  # the worker is fixed: the alert resolves
    job.train(252, 300)
    for c in [job.trainer, *job.workers]:
        job.close(c)

    run = job.get()
    assert run["control"]["state"] == "finished" and run["firing_alerts"] == {}  # every alert resolved...
    taint = run["taint"]  # ...and the record stays
    assert {k: taint[k] for k in ("tainted", "first_step", "steps", "ranges_total")} == {
        "tainted": True, "first_step": 212, "steps": 40, "ranges_total": 1}
    [r] = taint["ranges"]
    assert r["summary"] == "steps 212–251: chat_template differs on 1 of 3 rollout workers"
    alert = api.get(f"{API}/runs/{job.id}/alerts", params={"status": "resolved"}).json()["alerts"][0]
    assert r == {"cause": "processor:chat_template", "kind": "processor_mismatch", "what": "chat_template differs",
                 "first_step": 212, "last_step": 251, "open": False, "workers": 1, "worker_ids": ["rollout-2"],
                 "rollout_workers": 3, "alert_ids": [alert["id"]], "summary": r["summary"]}
    listed = [x for x in api.get(f"{API}/runs").json()["runs"] if x["id"] == job.id]
    assert listed[0]["taint"] == taint

    # What an automation script asks before it publishes a checkpoint:
    assert job.taint(step=211)["checkpoint"] == {"step": 211, "tainted": False, "ranges": []}
    assert job.taint(step=212)["checkpoint"]["tainted"] is True
    late = job.taint(step=300)
    assert late["checkpoint"]["ranges"] == [r] and late["state"] == "finished" and late["last_step"] == 300
    assert job.taint()["checkpoint"] is None and job.taint()["ranges"] == [r]
    assert api.get(f"{API}/runs/{job.id}/taint", params={"step": -1}).status_code == 422
    assert api.get(f"{API}/runs/999999/taint").status_code == 404


def test_a_divergence_open_when_the_run_ends_reaches_its_last_step(api):
    job = Job(api, "open-at-end", workers=2)
    job.fingerprint(job.workers[0], GOOD)
    job.api.put(f"{API}/runs/{job.id}/settings", json={"on_mismatch": "alert"})  # alert, do not pause
    job.train(0, 9)
    job.fingerprint(job.workers[1], BAD)
    job.train(10, 20)
    assert job.taint()["ranges"][0] | {"alert_ids": None} == {
        "cause": "processor:chat_template", "kind": "processor_mismatch", "what": "chat_template differs",
        "first_step": 10, "last_step": 20, "open": True, "workers": 1, "worker_ids": ["rollout-1"],
        "rollout_workers": 2, "alert_ids": None, "summary": "steps 10–20 (still open): chat_template differs on 1 of 2 rollout workers"}
    job.train(21, 30)
    job.close(job.trainer)  # finished with the mismatch still there: it resolves with the run
    [r] = job.taint()["ranges"]
    assert (r["first_step"], r["last_step"], r["open"]) == (10, 30, False)


def test_an_align_rule_taints_from_the_batch_it_measured_and_other_alerts_taint_nothing(api):
    job = Job(api, "rule", workers=1)
    job.fingerprint(job.workers[0], GOOD)
    job.train(0, 49, **{"align/prompt_rerender_mismatch_frac": 0.0})
    job.train(50, 54, **{"align/prompt_rerender_mismatch_frac": 0.25})  # the built-in error rule: pause
    assert job.get()["control"]["state"] == "paused"
    job.control("resume")
    api.post(f"{API}/runs/{job.id}/rules", json={"key": "loss", "comparison": ">", "threshold": 0.5,
                                                 "severity": "error"})  # a user's rule: not alignment
    for step in range(55, 66):  # 11 clean batches: the built-in rule's alert resolves (keep_firing_for 10)
        job.train(step, step, **{"align/prompt_rerender_mismatch_frac": 0.0})
    alerts = {a["detail"]["rule_key"]: a["status"] for a in api.get(f"{API}/runs/{job.id}/alerts").json()["alerts"]}
    assert alerts == {"align/prompt_rerender_mismatch_frac": "resolved", "loss": "firing"}
    [r] = job.taint()["ranges"]  # the loss rule fires as an error too, and stays out of the record
    assert (r["cause"], r["what"], r["first_step"], r["last_step"], r["workers"]) == (
        "metric:align/prompt_rerender_mismatch_frac", "align/prompt_rerender_mismatch_frac > 0", 50, 65, 0)
    assert r["summary"] == "steps 50–65: align/prompt_rerender_mismatch_frac > 0"


# ------------------------------------------------------------------ the webhook that says it ended

def deliver(app) -> None:
    while app.state.dispatcher.run_once():
        pass


def sweep_after_timeout(app) -> None:
    with app.state.effects.write(app.state.db) as s:
        run_state.sweep(s, TIMEOUT, now=utcnow() + timedelta(seconds=TIMEOUT + 1))


@pytest.mark.parametrize("end", ["finished", "stopped", "crashed"])
def test_a_run_that_ends_tainted_sends_its_record_and_a_clean_one_sends_nothing(api, app, end):
    with WebhookReceiver() as rx:
        assert api.post(f"{API}/webhooks", json={"url": rx.url, "events": ["run.ended_tainted"]}).status_code == 200
        clean = Job(api, "clean", workers=1)
        clean.fingerprint(clean.workers[0], BAD)  # caught in the pause and fixed before any step trained on it
        clean.fingerprint(clean.workers[0], {"digest": GOOD["digest"]})
        clean.control("resume")
        clean.train(0, 10)
        for c in [clean.trainer, *clean.workers]:
            clean.close(c)
        assert clean.get()["control"]["state"] == "finished" and clean.get()["taint"]["tainted"] is False

        job = Job(api, f"tainted-{end}", workers=2)
        job.fingerprint(job.workers[0], GOOD)
        job.train(0, 99)
        job.fingerprint(job.workers[1], BAD)
        job.control("resume")
        job.train(100, 120)
        if end == "finished":
            job.close(job.trainer)
        elif end == "stopped":
            job.control("stop")
            assert api.post(f"{API}/runs/{job.id}/control/stopped", json={"component_id": job.trainer}).status_code == 200
        else:
            sweep_after_timeout(app)  # every process falls silent
        assert job.get()["control"]["state"] == end
        deliver(app)

    [event] = [r.json for r in rx.accepted()]  # the clean run sent nothing
    assert event["type"] == "run.ended_tainted"
    data = event["data"]
    assert data["run"]["id"] == job.id and data["run"]["state"] == end and data["control"]["state"] == end
    assert data["taint"]["first_step"] == 100 and data["taint"]["tainted"] is True
    [r] = data["taint"]["ranges"]
    assert (r["first_step"], r["last_step"], r["open"]) == (100, 120, end == "crashed")  # a crash resolves nothing
    assert r["summary"].endswith("chat_template differs on 1 of 2 rollout workers")


def test_run_control_events_carry_the_record(api, app):
    with WebhookReceiver() as rx:
        api.post(f"{API}/webhooks", json={"url": rx.url, "events": ["run.control"]})
        job = Job(api, "controlled", workers=1)
        job.train(0, 4)
        job.fingerprint(job.workers[0], BAD)  # pauses: a run.control event
        job.control("resume")
        job.train(5, 9)
        job.control("stop")
        deliver(app)
    events = sorted((r.json for r in rx.accepted()), key=lambda e: e["data"]["control"]["version"])
    assert [e["data"]["control"]["state"] for e in events] == ["paused", "running", "stopping"]
    assert [e["data"]["taint"]["steps"] for e in events] == [0, 0, 5]  # what it had trained on so far
