"""Issue 12.6: every event delivered once, even to slow receivers; a receiver that trickles its
answer holds one sending slot until one wall-clock deadline, never the others."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sqlalchemy import select

from paritywatch.backend.db import Database
from paritywatch.backend.models import DeliveryAttempt, WebhookDelivery
from paritywatch.backend.settings import Settings
from paritywatch.backend.webhooks.dispatcher import Dispatcher
from tests.security.servers import ScriptedServer
from tests.security.test_webhook_targets import _queue
from tests.support.live import ProcessServer, WebhookReceiver, wait_for


class SlowReceiver:
    """Answers every POST 204 after `delay_s`, counting each webhook-id it was sent."""

    def __init__(self, delay_s: float):
        self.ids: list[str] = []
        self.released = threading.Event()  # set at teardown: no handler outlives the test
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.ids.append(self.headers["webhook-id"])
                receiver.released.wait(delay_s)  # the receiver's behaviour under test, not a sync
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> "SlowReceiver":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.postgres
def test_two_replicas_deliver_each_event_once_to_a_receiver_that_answers_after_12_s(postgresql_url):
    """Claims last 3 s here; the receiver takes 12 s: only a claim renewed while sending keeps the
    other replica from sending the same event again."""
    from tests.conftest import _empty_all_tables

    _empty_all_tables(postgresql_url)
    env = {"PARITYWATCH_ALLOW_LOOPBACK_WEBHOOKS": "1", "PARITYWATCH_WEBHOOK_CLAIM_S": "3",
           "PARITYWATCH_WEBHOOK_TIMEOUT_S": "30", "PARITYWATCH_WEBHOOK_POLL_INTERVAL_S": "0.1"}
    events = 6
    with SlowReceiver(12.0) as rx, ProcessServer(postgresql_url, env=env) as a, ProcessServer(postgresql_url, env=env) as b:
        api_a, api_b = httpx.Client(base_url=a.url + "/api/v1"), httpx.Client(base_url=b.url + "/api/v1")
        hook = api_a.post("/webhooks", json={"url": rx.url})
        assert hook.status_code == 200, hook.text
        for i in range(events):
            assert (api_a if i % 2 else api_b).post(f"/webhooks/{hook.json()['id']}/test").status_code == 200

        def all_delivered() -> bool:
            rows = api_a.get(f"/webhooks/{hook.json()['id']}/deliveries").json()["deliveries"]
            return len(rows) == events and all(d["status"] == "delivered" for d in rows)

        wait_for(all_delivered, timeout_s=90, interval_s=0.5)
        assert sorted(set(rx.ids)) == sorted(rx.ids) and len(rx.ids) == events, rx.ids
        rows = api_a.get(f"/webhooks/{hook.json()['id']}/deliveries").json()["deliveries"]
        assert all(d["attempts"] == 1 for d in rows)


def test_a_trickling_receiver_does_not_stall_other_deliveries(sqlite_db):
    """One receiver sends its answer a byte at a time (each byte resets a per-read timeout);
    another answers at once. The first is cut at the wall-clock deadline; the second is delivered
    long before that."""
    def trickle(conn, path):
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100000\r\n\r\n" if path == "/body"
                     else b"HTTP/1.1 2")
        while not srv.stopping.wait(0.1):  # one byte every 0.1 s, forever
            conn.sendall(b"x")

    settings = Settings(database_url=sqlite_db, allow_loopback_webhooks=True, webhook_timeout_s=3.0,
                        webhook_backoff_base_s=60, webhook_poll_interval_s=0.05)
    db = Database(sqlite_db)
    dispatcher = Dispatcher(db, settings)
    try:
        with ScriptedServer(trickle) as srv, WebhookReceiver() as fast:
            queued = _queue(db, [f"http://127.0.0.1:{srv.port}/head", f"http://127.0.0.1:{srv.port}/body", fast.url])
            head_id, body_id, _ = sorted(queued)

            def attempts() -> list:
                with db.read() as s:
                    return list(s.scalars(select(DeliveryAttempt).order_by(DeliveryAttempt.delivery_id)))

            dispatcher.start()
            wait_for(fast.accepted, timeout_s=30)
            # delivered while both trickling ones still hang (an attempt is recorded when it ends)
            assert not [a for a in attempts() if a.delivery_id in (head_id, body_id)]
            rows = wait_for(lambda: len(attempts()) == 3 and attempts(), timeout_s=40)
    finally:
        dispatcher.stop()
        db.dispose()
    slow = {a.delivery_id: a for a in rows}
    head, body, ok = (slow[i] for i in sorted(queued))
    assert ok.status_code in (200, 204)
    assert head.status_code is None and "no answer within 3 s" in head.error
    assert body.status_code == 500 and "not complete within 3 s" in body.error
    for cut in (head, body):  # one deadline for the whole exchange, however the bytes trickle (a per-read
        assert 2.9 <= cut.duration_ms / 1000 < 15  # timeout would never cut them: a byte every 0.1 s)
    check = Database(sqlite_db)
    with check.read() as s:
        assert {d.status for d in s.scalars(select(WebhookDelivery))} == {"pending", "delivered"}
    check.dispose()
