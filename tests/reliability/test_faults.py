"""Faults: the backend SIGKILLed and restarted under logging monitors, PostgreSQL restarted under a
live backend, a webhook receiver refusing connections for a while. Nothing acknowledged is lost,
nothing is doubled, and everything recovers by itself."""
from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from paritywatch.backend import migrate
from tests.support.live import ProcessServer, free_port, settled_deliveries, wait_for
from tests.support.private_postgres import PrivatePostgres
from trainer_hooks.monitor import ParityMonitor

FAST_WEBHOOKS = {"PARITYWATCH_ALLOW_LOOPBACK_WEBHOOKS": "1", "PARITYWATCH_WEBHOOK_BACKOFF_BASE_S": "0.2",
                 "PARITYWATCH_WEBHOOK_BACKOFF_CAP_S": "1.0", "PARITYWATCH_WEBHOOK_POLL_INTERVAL_S": "0.1",
                 "PARITYWATCH_WEBHOOK_TIMEOUT_S": "2"}


def counts(url: str, run_id: int) -> dict[str, int]:
    r = httpx.get(f"{url}/api/v1/runs/{run_id}/metrics", timeout=10)
    r.raise_for_status()
    return {k["key"]: k["count"] for k in r.json()["keys"]}


def log_steps(monitors: list[ParityMonitor], steps: int, pause_s: float) -> None:
    for step in range(steps):
        for i, m in enumerate(monitors):
            m.log({"loss": 1.0 / (step + 1), f"worker{i}/reward": float(step)}, step)
        time.sleep(pause_s)


def test_backend_sigkilled_mid_run_loses_and_doubles_nothing(db_url, tmp_path) -> None:
    server = ProcessServer(db_url).start()
    try:
        monitors = [ParityMonitor("kill", side="rollout" if i else "trainer", url=server.url, worker_id=f"w{i}",
                                  spool_dir=tmp_path / f"spool{i}", flush_interval_s=0.2, max_backoff_s=1.0,
                                  request_timeout_s=2.0) for i in range(4)]
        logger = threading.Thread(target=log_steps, args=(monitors, 1500, 0.004))
        logger.start()
        wait_for(lambda: all(m.stats()["sent_batches"] >= 2 for m in monitors), 30)  # the run is under way
        server.stop(signal.SIGKILL)  # mid-run, mid-request: no shutdown of any kind
        # down until the hooks have had to spool what they could not send
        wait_for(lambda: all(m.stats()["spooled_batches"] >= 1 for m in monitors), 30)
        assert logger.is_alive(), "the logging ended before the backend was back"
        server.start()
        logger.join()
        for m in monitors:
            assert m.flush(60.0), m.stats()
        stats = [m.stats() for m in monitors]
        for m in monitors:
            m.close()
        run_id = httpx.post(server.url + "/api/v1/runs", json={"name": "kill"}).json()["id"]
        got = counts(server.url, run_id)
        # Exactly once: four monitors log "loss" at the same steps, each point is its own.
        assert got == {"loss": 4 * 1500, **{f"worker{i}/reward": 1500 for i in range(4)}}, (got, stats)
        assert sum(s["spooled_batches"] for s in stats) > 0, "the kill did not overlap the logging"
        assert all(s["dropped_points"] == 0 for s in stats), stats
    finally:
        server.stop(signal.SIGKILL)


class Receiver:
    """A webhook receiver on a fixed port that can go away (connection refused) and come back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.ids: list[str] = []
        self.server: ThreadingHTTPServer | None = None

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.ids.append(self.headers["webhook-id"])
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def test_webhook_receiver_down_for_a_while(db_url) -> None:
    """Deliveries queued while the receiver refuses connections are retried with backoff and each
    arrives exactly once when it comes back."""
    receiver = Receiver()
    with ProcessServer(db_url, env=FAST_WEBHOOKS) as server:
        api = httpx.Client(base_url=server.url + "/api/v1", timeout=10)
        hook = api.post("/webhooks", json={"url": receiver.url}).json()
        queued = [api.post(f"/webhooks/{hook['id']}/test").json()["delivery_id"] for _ in range(10)]

        def all_refused_twice():
            rows = api.get(f"/webhooks/{hook['id']}/deliveries").json()["deliveries"]
            return len(rows) == 10 and all(d["attempts"] >= 2 for d in rows) and rows

        deliveries = wait_for(all_refused_twice, 30, interval_s=0.1)
        assert all(d["status"] == "pending" for d in deliveries), deliveries
        queued += [api.post(f"/webhooks/{hook['id']}/test").json()["delivery_id"] for _ in range(5)]
        receiver.up()
        try:
            deliveries = settled_deliveries(server.url, hook["id"], expected=15)  # then nothing more is sent
        finally:
            receiver.down()
    assert len(queued) == 15
    assert Counter(receiver.ids).most_common(1)[0][1] == 1, "a delivery arrived twice"
    assert len(receiver.ids) == 15
    assert {d["status"] for d in deliveries} == {"delivered"}
    assert {d["event_id"] for d in deliveries} == set(receiver.ids)


@pytest.fixture
def private_postgres():
    """A PostgreSQL server of this test's own, migrated: restarting it leaves other tests alone."""
    from tests.conftest import PG_ADMIN_URL

    if PG_ADMIN_URL == "skip":
        pytest.skip("PostgreSQL tests disabled by PARITYWATCH_TEST_PG_URL=skip")
    server = PrivatePostgres().start()
    try:
        migrate.upgrade(server.url)
        yield server
    finally:
        server.stop()


@pytest.mark.postgres
def test_postgres_restart_backend_recovers_by_itself(private_postgres, tmp_path) -> None:
    postgresql_url = private_postgres.url
    receiver = Receiver()
    receiver.up()
    with ProcessServer(postgresql_url, env=FAST_WEBHOOKS) as server:
        api = httpx.Client(base_url=server.url + "/api/v1", timeout=10)
        hook = api.post("/webhooks", json={"url": receiver.url}).json()
        monitor = ParityMonitor("pg-restart", url=server.url, spool_dir=tmp_path / "spool", flush_interval_s=0.2,
                                max_backoff_s=1.0, request_timeout_s=2.0)
        logger = threading.Thread(target=log_steps, args=([monitor], 1500, 0.004))
        logger.start()
        wait_for(lambda: monitor.stats()["sent_batches"] >= 2, 30)  # the run is under way
        private_postgres.restart()
        logger.join()
        try:
            assert monitor.flush(60.0), monitor.stats()
            run_id = api.post("/runs", json={"name": "pg-restart"}).json()["id"]
            assert counts(server.url, run_id) == {"loss": 1500, "worker0/reward": 1500}
            # The dispatcher, whose pooled connections all died, delivers again without a restart.
            api.post(f"/webhooks/{hook['id']}/test")
            wait_for(lambda: len(receiver.ids) >= 1, 20)
        finally:
            monitor.close()
            receiver.down()
        assert server.proc.poll() is None, "the backend died with the database"
