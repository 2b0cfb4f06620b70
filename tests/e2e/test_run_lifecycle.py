"""Issue 12, done-when: a trainer and 16 rollout processes (real hooks in real processes, real HTTP)
that all close cleanly end `finished` with no alert and no notification; one of them killed with
SIGKILL mid-run is exactly one heartbeat_lost, and the run still ends `finished`."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from paritywatch.backend.settings import Settings
from tests.support.live import ROOT, ThreadServer, WebhookReceiver, wait_for, wait_for_sweeps

ROLLOUTS = 16
# Heartbeat timeout ten heartbeats long (the processes beat every second; lifecycle_process.py). The
# 17 processes post ~50 requests/s in all: a fifth of what one loaded 2-core CI box served in-thread
# (at 0.25 s beats and 0.1 s flushes they posted ~150/s, the queue grew and a GET waited > 10 s).
TIMEOUT_S = 10.0
API_TIMEOUT_S = 60.0  # the test waits for states; a slow answer is not the behaviour under test
SETTINGS = dict(heartbeat_timeout_s=TIMEOUT_S, heartbeat_check_interval_s=0.25, allow_loopback_webhooks=True,
                webhook_group_wait_s=0, webhook_group_interval_s=0, notify_interval_s=0.05,
                webhook_poll_interval_s=0.05)


class Process:
    def __init__(self, url: str, run: str, side: str, worker_id: str, spool) -> None:
        self.worker_id = worker_id
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.lifecycle_process", url, run, side, worker_id, str(spool / worker_id)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ready(self) -> None:
        line = self.proc.stdout.readline()
        assert line.startswith("ready running"), (self.worker_id, line)

    def close(self) -> None:
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()

    def closed(self) -> str:
        line = self.proc.stdout.readline()
        assert self.proc.wait(30) == 0, self.worker_id
        return line.strip()


def start_run(srv, name: str, tmp_path) -> tuple[Process, list[Process]]:
    trainer = Process(srv.url, name, "trainer", "trainer-0", tmp_path)
    rollouts = [Process(srv.url, name, "rollout", f"rollout-{i:02d}", tmp_path) for i in range(ROLLOUTS)]
    for p in [trainer, *rollouts]:
        p.ready()
    return trainer, rollouts


def run_of(api: httpx.Client, name: str) -> dict:
    [run] = [r for r in api.get("/api/v1/runs").json()["runs"] if r["name"] == name]
    return run


def swept_past(srv, since: float) -> None:
    """Wait (by polling, not sleeping) until two sweeps ran after the heartbeat timeout from `since`."""
    wait_for(lambda: time.monotonic() > since + TIMEOUT_S, timeout_s=TIMEOUT_S + 5)
    wait_for_sweeps(srv, 2, timeout_s=30)


@pytest.fixture
def server(db_url):
    with ThreadServer(Settings(database_url=db_url, **SETTINGS)) as srv:
        yield srv


def test_seventeen_processes_closing_cleanly_finish_the_run_with_no_alert(server, tmp_path):
    with WebhookReceiver() as rx, httpx.Client(base_url=server.url, timeout=API_TIMEOUT_S) as api:
        api.post("/api/v1/webhooks", json={"url": rx.url}).raise_for_status()  # every event type
        trainer, rollouts = start_run(server, "clean", tmp_path)
        try:
            wait_for(lambda: len(run_of(api, "clean")["components"]) == 1 + ROLLOUTS, timeout_s=30)
            for p in rollouts:
                p.close()
            assert all(p.closed().startswith("closed True") for p in rollouts)
            run = run_of(api, "clean")
            assert run["control"]["state"] == "running", run["control"]  # rollouts closing do not end it
            trainer.close()
            assert trainer.closed() == "closed True finished"  # the trainer's close() hears it
        finally:
            for p in [trainer, *rollouts]:
                p.proc.kill()
        closed_at = time.monotonic()
        run = run_of(api, "clean")
        assert run["control"]["state"] == "finished" and run["control"]["actor"] == "trainer trainer-0"
        assert {c["status"] for c in run["components"]} == {"closed"}
        swept_past(server, closed_at)
        got = api.get(f"/api/v1/runs/{run['id']}/alerts").json()["alerts"]
        assert got == [], [a["title"] for a in got]
        server.app.state.notifier.run_once()
        [hook] = api.get("/api/v1/webhooks").json()["webhooks"]
        assert api.get(f"/api/v1/webhooks/{hook['id']}/deliveries").json()["deliveries"] == []
        assert rx.received == []


def test_a_process_killed_mid_run_is_one_heartbeat_lost_and_the_run_still_finishes(server, tmp_path):
    with WebhookReceiver() as rx, httpx.Client(base_url=server.url, timeout=API_TIMEOUT_S) as api:
        api.post("/api/v1/webhooks", json={"url": rx.url}).raise_for_status()
        trainer, rollouts = start_run(server, "killed", tmp_path)
        victim = rollouts[5]
        try:
            run_id = wait_for(lambda: len((r := run_of(api, "killed"))["components"]) == 1 + ROLLOUTS and r["id"],
                              timeout_s=30)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
            killed_at = time.monotonic()

            def open_alerts() -> list[dict]:
                return api.get(f"/api/v1/runs/{run_id}/alerts", params={"status": "open"}).json()["alerts"]

            fired = wait_for(open_alerts, timeout_s=TIMEOUT_S + 15)
            assert [(a["kind"], a["detail"].get("worker_id")) for a in fired] == [("heartbeat_lost", victim.worker_id)], \
                [a["title"] for a in fired]
            [lost] = fired
            swept_past(server, killed_at)
            still_open = open_alerts()  # the others keep heartbeating: nobody else is lost
            assert [a["id"] for a in still_open] == [lost["id"]], [a["title"] for a in still_open]
            assert run_of(api, "killed")["control"]["state"] == "running"
            for p in rollouts:
                if p is not victim:
                    p.close()
                    assert p.closed().startswith("closed True")
            trainer.close()
            assert trainer.closed() == "closed True finished"
        finally:
            for p in [trainer, *rollouts]:
                p.proc.kill()
        run = run_of(api, "killed")
        assert run["control"]["state"] == "finished"
        statuses = {c["worker_id"]: c["status"] for c in run["components"]}
        assert statuses.pop(victim.worker_id) == "lost" and set(statuses.values()) == {"closed"}
        [alert] = api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]
        assert alert["id"] == lost["id"] and alert["status"] == "resolved"  # the run ended: nothing left to act on
        wait_for(lambda: len(rx.accepted()) >= 2, timeout_s=30)
        server.app.state.notifier.run_once()
        assert [r.json["type"] for r in rx.accepted()] == ["alert.firing", "alert.resolved"]
        assert rx.accepted()[0].json["data"]["workers"] == [victim.worker_id]
