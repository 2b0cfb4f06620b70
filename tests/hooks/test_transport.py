"""Retry classification, backoff and Retry-After, against a scripted local HTTP server."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from trainer_hooks.transport import (
    Backoff,
    Transport,
    TransportConfig,
    TransportError,
    backoff_delay,
    is_retryable_status,
    parse_retry_after,
)


@pytest.mark.parametrize(
    "status, retryable",
    [(400, False), (401, False), (403, False), (404, False), (413, False), (422, False),
     (408, True), (409, True), (425, True), (429, True), (500, True), (502, True), (503, True)],
)
def test_status_classification(status: int, retryable: bool) -> None:
    assert is_retryable_status(status) is retryable


def test_backoff_grows_exponentially_within_jitter_bounds() -> None:
    low = [backoff_delay(a, base=0.5, cap=10.0, rng=lambda: 0.0) for a in range(8)]
    high = [backoff_delay(a, base=0.5, cap=10.0, rng=lambda: 1.0) for a in range(8)]
    assert low == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert high == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_backoff_state_uses_retry_after_when_longer() -> None:
    now = [100.0]
    backoff = Backoff(base=0.5, cap=10.0, clock=lambda: now[0])
    assert backoff.ready()
    backoff.failed(retry_after=30.0)
    assert backoff.remaining() == 30.0 and not backoff.ready()
    now[0] += 30.0
    assert backoff.ready()
    backoff.succeeded()
    assert backoff.failures == 0


@pytest.mark.parametrize(
    "header, expected",
    [("7", 7.0), ("0", 0.0), ("-3", 0.0), ("100000", 300.0), ("soon", None), (None, None),
     ("Thu, 01 Jan 1970 00:01:40 GMT", 40.0)],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, now=60.0) == expected


class ScriptedServer:
    """Answers each request with the next (status, headers, body) of a script; records paths."""

    def __init__(self, script: list[tuple[int, dict[str, str], dict]]) -> None:
        self.script = list(script)
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append(self.path)
                status, headers, body = outer.script.pop(0) if outer.script else (200, {}, {"ok": True})
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted() -> Iterator[callable]:
    servers: list[ScriptedServer] = []

    def make(script: list[tuple[int, dict[str, str], dict]]) -> tuple[ScriptedServer, Transport, list[float]]:
        server = ScriptedServer(script)
        servers.append(server)
        sleeps: list[float] = []
        return server, Transport(TransportConfig(url=server.url), sleep=sleeps.append), sleeps

    yield make
    for server in servers:
        server.close()


def _error(status: int, code: str) -> dict:
    return {"error": {"status": status, "code": code, "message": "scripted"}}


def test_429_is_retried_after_the_servers_retry_after(scripted) -> None:
    server, transport, sleeps = scripted([(429, {"Retry-After": "3"}, _error(429, "rate_limited"))])
    assert transport.call("POST", "/x", json={}, attempts=3) == {"ok": True}
    assert len(server.requests) == 2
    assert sleeps == [3.0]


def test_503_retry_after_is_honoured_and_5xx_retried(scripted) -> None:
    server, transport, sleeps = scripted([
        (503, {"Retry-After": "2"}, _error(503, "unavailable")),
        (500, {}, _error(500, "internal")),
    ])
    assert transport.call("POST", "/x", json={}, attempts=5) == {"ok": True}
    assert len(server.requests) == 3
    assert sleeps[0] == 2.0 and 0 < sleeps[1] <= 0.5


def test_422_is_not_retried_and_carries_the_error_code(scripted) -> None:
    server, transport, sleeps = scripted([(422, {}, _error(422, "validation_error"))])
    with pytest.raises(TransportError) as caught:
        transport.call("POST", "/x", json={}, attempts=5)
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (422, "validation_error", False)
    assert len(server.requests) == 1 and sleeps == []


def test_retries_stop_at_the_attempt_limit(scripted) -> None:
    server, transport, _ = scripted([(503, {}, _error(503, "unavailable"))] * 5)
    with pytest.raises(TransportError) as caught:
        transport.call("POST", "/x", json={}, attempts=3)
    assert caught.value.retryable and len(server.requests) == 3


def test_connection_refused_is_retryable() -> None:
    from tests.hooks.conftest import free_port

    transport = Transport(TransportConfig(url=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(TransportError) as caught:
        transport.request("POST", "/x", json={})
    assert caught.value.retryable and caught.value.status is None
