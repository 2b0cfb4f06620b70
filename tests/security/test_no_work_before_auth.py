"""Issue 13.2: no work before authentication, per-route body limits, a linear nesting check off
the event loop. Measured before the fix: one unauthenticated 32 MB body of nested brackets kept
/healthz from answering for 10.1 s."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from paritywatch.backend import migrate
from tests.support.live import ProcessServer, make_tokens

HALF = 16 * 1024 * 1024 - 1  # 2 * HALF bytes: just under the 32 MiB cap of metric batches
NESTED = b"[" * HALF + b"]" * HALF


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A closed server in its own process (tokens exist before it starts)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('body') / 'body.db'}"
    migrate.upgrade(url)
    tokens = make_tokens(url)
    with ProcessServer(url) as srv:
        api = httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {tokens['admin']}"})
        run_id = api.post("/runs", json={"name": "body"}).json()["id"]
        yield srv, tokens, run_id


class Upload(threading.Thread):
    """POST a body over a raw socket, as fast as loopback takes it; remember the answer's status."""

    def __init__(self, port: int, path: str, body: bytes, token: str | None = None):
        super().__init__(daemon=True)
        head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
                f"Content-Length: {len(body)}", "Connection: close"]
        if token:
            head.append(f"Authorization: Bearer {token}")
        self.request = ("\r\n".join(head) + "\r\n\r\n").encode()
        self.port, self.body = port, body
        self.status: int | None = None
        self.answered_at: float | None = None

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            try:
                sock.sendall(self.request)
                view = memoryview(self.body)
                for i in range(0, len(view), 1 << 20):
                    sock.sendall(view[i:i + (1 << 20)])
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before taking the rest: the point
            try:
                line = sock.makefile("rb").readline()
                self.status = int(line.split()[1])
            except (OSError, IndexError, ValueError):
                pass
            self.answered_at = time.monotonic()


def _health_latencies_during(srv, upload: Upload, settle_s: float = 0.3, min_samples: int = 30) -> list[float]:
    """Time /healthz again and again while the upload runs and a little after its answer, and at
    least `min_samples` times: a refused upload ends at once, and over the 8 checks that fit in
    the settle time one slow answer on a loaded box was already 12% (seen in CI)."""
    latencies = []
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        client.get("/healthz")  # a warm connection: measure the server, not the TCP handshake
        upload.start()
        while upload.answered_at is None or time.monotonic() < upload.answered_at + settle_s \
                or len(latencies) < min_samples:
            started = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            latencies.append(time.perf_counter() - started)
    upload.join(30)
    return latencies


def assert_responsive(latencies: list[float]) -> None:
    """/healthz kept answering while the body went in: before the fix every check stalled for ~10 s.
    The bounds sit far from that and clear of a loaded CI box (four test workers, their servers and
    the vLLM suite on two cores; seen there: an idle server misses 100 ms now and then, and one
    check took 3.2 s while 99% were within 250 ms): 90% within 250 ms, none over 6 s (before the
    fix: 10-17 s, longer still on a slower box)."""
    assert len(latencies) >= 5, latencies
    fast = sum(1 for t in latencies if t < 0.25) / len(latencies)
    assert fast >= 0.9 and max(latencies) < 6.0, f"{fast:.0%} within 250 ms, slowest {max(latencies):.3f} s"


def test_unauthenticated_32_mb_nested_body_costs_nothing(server):
    srv, _, run_id = server
    upload = Upload(srv.port, f"/api/v1/runs/{run_id}/metrics", NESTED)
    latencies = _health_latencies_during(srv, upload)
    assert upload.status == 401
    assert_responsive(latencies)


def test_authenticated_32_mb_nested_body_is_checked_off_the_event_loop(server):
    srv, tokens, run_id = server
    upload = Upload(srv.port, f"/api/v1/runs/{run_id}/metrics", NESTED, tokens["ingest"])
    latencies = _health_latencies_during(srv, upload)
    # a metric batch never nests deeper than 3 levels: refused by its shape as it arrives (422),
    # before the depth limit of any body (400) is reached
    assert upload.status == 422
    assert_responsive(latencies)


def test_scope_and_size_are_checked_before_the_body(server):
    srv, tokens, run_id = server
    big_run = json.dumps({"name": "big", "config": {"blob": "x" * (2 * 1024 * 1024)}}).encode()
    with httpx.Client(base_url=srv.url + "/api/v1", timeout=30) as api:
        # A read token may not post: 403 before its 2 MB body is read.
        r = api.post(f"/runs/{run_id}/metrics", content=b"{" + b" " * (2 << 20) + b"}",
                     headers={"Authorization": f"Bearer {tokens['read']}", "Content-Type": "application/json"})
        assert r.status_code == 403
        # Small routes take small bodies (1 MiB by default)...
        r = api.post("/runs", content=big_run,
                     headers={"Authorization": f"Bearer {tokens['admin']}", "Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        # ...metric batches large ones.
        steps = list(range(90_000))
        batch = {"client_id": "big", "seq": 0, "steps": steps, "series": {"loss": [0.123456789] * len(steps)}}
        assert len(json.dumps(batch)) > 1024 * 1024
        r = api.post(f"/runs/{run_id}/metrics", json=batch, headers={"Authorization": f"Bearer {tokens['ingest']}"})
        assert r.status_code == 200 and r.json()["accepted"] == len(steps)
