"""Retry classification, backoff pacing and Retry-After, against a scripted local HTTP server."""
from __future__ import annotations

import email.utils
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from trainer_hooks.contract import is_retryable_status
from trainer_hooks.transport import Backoff, Transport, TransportConfig, TransportError, parse_retry_after


@pytest.mark.parametrize(
    "status, retryable",
    [(400, False), (401, False), (403, False), (404, False), (409, False), (413, False), (422, False),
     (408, True), (425, True), (429, True), (500, True), (502, True), (503, True)],
)
def test_status_classification(status: int, retryable: bool) -> None:
    """409 is the server's permanent conflict (a stop nobody asked for): repeating cannot help."""
    assert is_retryable_status(status) is retryable


def test_backoff_retries_at_once_then_doubles_with_jitter_up_to_the_cap() -> None:
    now = [0.0]
    backoff = Backoff(base=0.5, cap=10.0, clock=lambda: now[0])
    delays = [backoff.failed() for _ in range(12)]
    assert delays[0] == 0.0  # the first retry goes at once
    for delay, floor in zip(delays[1:5], (1.0, 2.0, 4.0, 8.0)):
        assert floor <= delay <= floor + 0.5  # base * 2**n plus up to `base` of jitter
    assert delays[5:] == [10.0] * 7
    assert backoff.remaining() == 10.0 and not backoff.ready()
    backoff.succeeded()
    assert backoff.ready() and backoff.failures == 0 and backoff.failed() == 0.0


def test_backoff_spreads_workers_that_failed_together() -> None:
    schedules = set()
    for _ in range(20):
        backoff = Backoff(base=0.5, cap=10.0, clock=lambda: 0.0)
        schedules.add(tuple(backoff.failed() for _ in range(4)))
    assert len(schedules) > 1


def test_backoff_state_uses_retry_after_when_longer() -> None:
    now = [100.0]
    backoff = Backoff(base=0.5, cap=10.0, clock=lambda: now[0])
    assert backoff.ready()
    backoff.failed(retry_after=30.0)
    assert backoff.remaining() == 30.0 and not backoff.ready()
    now[0] += 30.0
    assert backoff.ready()


@pytest.mark.parametrize(
    "header, expected",
    [("7", 7.0), ("0", 0.0), ("-3", None), ("100000", 300.0), ("soon", None), (None, None), ("", None),
     ("Thu, 01 Jan 1970 00:01:40 GMT", 0.0)],  # a date in the past: come back now
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header) == expected


def test_parse_retry_after_reads_an_http_date_as_seconds_from_now() -> None:
    header = email.utils.formatdate(time.time() + 40, usegmt=True)
    assert 37.0 <= parse_retry_after(header) <= 40.0


class ScriptedServer:
    """Answers each request with the next (status, headers, body) of a script; records paths."""

    def __init__(self, script: list[tuple[int, dict[str, str], dict]]) -> None:
        self.script = list(script)
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append(self.path)
                status, headers, body = outer.script.pop(0) if outer.script else (200, {}, {"ok": True})
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
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

    def make(script: list[tuple[int, dict[str, str], dict]], **config) -> tuple[ScriptedServer, Transport, list]:
        server = ScriptedServer(script)
        servers.append(server)
        outcomes: list = []
        transport = Transport(TransportConfig(url=server.url, **config), observer=lambda error, purpose: outcomes.append(error))
        return server, transport, outcomes

    yield make
    for server in servers:
        server.close()


def _error(status: int, code: str) -> dict:
    return {"error": {"status": status, "code": code, "message": "scripted"}}


def _fail(transport: Transport) -> TransportError:
    with pytest.raises(TransportError) as caught:
        transport.request("POST", "/x", json={})
    return caught.value


def test_429_and_503_carry_the_servers_retry_after(scripted) -> None:
    server, transport, outcomes = scripted([(429, {"Retry-After": "3"}, _error(429, "rate_limited")),
                                            (503, {"Retry-After": "2"}, _error(503, "unavailable")),
                                            (500, {"Retry-After": "9"}, _error(500, "internal"))])
    limited, busy, broken = _fail(transport), _fail(transport), _fail(transport)
    assert (limited.retryable, limited.status, limited.code, limited.retry_after) == (True, 429, "rate_limited", 3.0)
    assert (busy.retryable, busy.retry_after) == (True, 2.0)
    assert (broken.retryable, broken.retry_after) == (True, None)  # Retry-After only means something on 429/503
    assert transport.request("POST", "/x", json={}) == {"ok": True}
    assert server.requests == ["/api/v1/x"] * 4
    assert outcomes[:3] == [limited, busy, broken] and outcomes[3] is None


def test_422_and_409_are_not_retryable_and_carry_the_error_code(scripted) -> None:
    _, transport, _ = scripted([(422, {}, _error(422, "validation_error")), (409, {}, _error(409, "conflict"))])
    invalid, conflict = _fail(transport), _fail(transport)
    assert (invalid.status, invalid.code, invalid.retryable, invalid.detail) == (422, "validation_error", False,
                                                                                 "scripted")
    assert (conflict.status, conflict.code, conflict.retryable) == (409, "conflict", False)


def test_another_servers_errors_keep_their_message(scripted) -> None:
    """The vLLM check speaks to a server that is not ours: OpenAI-style bodies, or plain text."""
    _, transport, _ = scripted([(400, {}, {"error": {"message": "bad prompt", "code": 400}}),
                                (400, {}, {"object": "error", "message": "old style"}),
                                (502, {"Content-Type": "text/html"}, b"<html>proxy error</html>")], prefix="")
    messages = [_fail(transport) for _ in range(3)]
    assert [(e.status, e.code, e.detail) for e in messages] == [
        (400, None, "bad prompt"), (400, None, "old style"), (502, None, "<html>proxy error</html>")]


def test_connection_refused_is_retryable_and_observed() -> None:
    from tests.hooks.conftest import free_port

    outcomes: list = []
    transport = Transport(TransportConfig(url=f"http://127.0.0.1:{free_port()}"),
                          observer=lambda error, purpose: outcomes.append(error))
    error = _fail(transport)
    assert error.retryable and error.status is None
    assert outcomes == [error]
