"""Issue 26: hostile or slow clients cannot hold the server. A body that cannot be a metric batch
is refused by its shape while it arrives (before its end, so before any parse); a request head or
body that trickles is cut off after its deadline; no token reaches a log line. Real HTTP: raw
sockets on loopback against uvicorn serving the app with `serve`'s protocol."""
from __future__ import annotations

import json
import logging
import select
import socket
import time

import httpx
import pytest

from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer

BOUND_S = 1.0  # the deadlines the server runs with here
MARGIN_S = 4.0  # a loaded 2-core machine with 4 test workers


@pytest.fixture
def server(sqlite_db):
    settings = Settings(database_url=sqlite_db, open_mode=True, header_timeout_s=BOUND_S, body_timeout_s=BOUND_S)
    with ThreadServer(settings) as srv:
        yield srv


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def _closed_while_trickling(sock: socket.socket, pieces, every_s: float, within_s: float) -> tuple[float, bytes]:
    """Send one piece every `every_s` until the server closes the connection; (seconds it took,
    what the server sent). Fails if it is still open after `within_s`."""
    start, answer = time.monotonic(), b""
    pieces = iter(pieces)
    while time.monotonic() - start < within_s:
        readable, _, _ = select.select([sock], [], [], every_s)  # the trickle's pace, and the close
        if readable:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return time.monotonic() - start, answer
            answer += data
            continue
        piece = next(pieces, None)
        if piece is None:
            continue
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start, answer
    pytest.fail(f"the connection was still open {within_s:.0f} s after it started (answer so far: {answer[:200]!r})")


def _header_lines():
    yield b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    n = 0
    while True:
        n += 1
        yield f"X-Slow-{n}: a\r\n".encode()


def test_a_trickled_request_head_is_cut_off_after_its_deadline(server):
    with _connect(server.port) as sock:
        took, answer = _closed_while_trickling(sock, _header_lines(), 0.2, BOUND_S + MARGIN_S)
    assert answer == b"" and took >= BOUND_S * 0.9


def test_a_connection_that_never_sends_is_closed(server):
    with _connect(server.port) as sock:
        _closed_while_trickling(sock, iter(()), 0.2, BOUND_S + MARGIN_S)


def test_a_later_request_on_a_kept_alive_connection_has_its_own_head_deadline(server):
    with _connect(server.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200")
        # the keep-alive timeout (contract.SERVER_KEEPALIVE_S) is far longer than the head deadline
        _closed_while_trickling(sock, _header_lines(), 0.2, BOUND_S + MARGIN_S)


def test_a_trickled_body_is_answered_408_and_closed(server):
    body = json.dumps({"name": "slow"}).encode()
    head = (f"POST /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with _connect(server.port) as sock:
        sock.sendall(head)
        took, answer = _closed_while_trickling(sock, (body[i:i + 1] for i in range(len(body))), 0.2,
                                               BOUND_S + MARGIN_S)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer or b"408" in answer


def _open_body(port: int, path: str, total: int) -> socket.socket:
    sock = _connect(port)
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {total}\r\n\r\n").encode())
    return sock


def _answer_before_the_end(server, path: str, prefix: str, claimed: int) -> tuple[int, dict]:
    """Announce a body of `claimed` bytes, send `prefix` (it ends where the body stops being
    possible) and no more: the answer can only come from the shape of what arrived. (Bytes sent
    past the refusal would be unread when the server closes: a reset that may drop its answer.)"""
    with _open_body(server.port, path, claimed) as sock:
        sock.sendall(prefix.encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, "closed without an answer"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            rest += sock.recv(65536)
        assert b"connection: close" in head.lower()  # the rest of the body is never read
        return int(head.split()[1]), json.loads(rest)


BATCH_START = '{"client_id":"a","seq":1,"steps":[1],"series":{'
MAX_POINTS = Settings().max_points_per_batch


def test_a_batch_with_a_million_keys_is_refused_before_it_has_arrived(server):
    """The attack measured in issue 26 (17 MB, 10**6 keys): refused at the key past the cap."""
    keys = "".join(f'"k{i}":[0.5],' for i in range(MAX_POINTS)) + f'"k{MAX_POINTS}":'
    status, answer = _answer_before_the_end(server, "/api/v1/runs/1/metrics", BATCH_START + keys, 17 << 20)
    assert status == 413 and "keys" in answer["error"]["message"]


def test_a_batch_with_too_many_values_is_refused_before_it_has_arrived(server):
    values = "0.5," * MAX_POINTS  # the value after the last comma would be one too many
    status, answer = _answer_before_the_end(server, "/api/v1/runs/1/metrics", BATCH_START + '"k":[' + values, 17 << 20)
    assert status == 413 and "points" in answer["error"]["message"]


def test_a_nested_batch_is_refused_before_it_has_arrived(server):
    """32 MB of nested arrays from an authorised caller (issue 26): a batch never nests past 3."""
    prefix = BATCH_START + '"k":[' + "0.5," * 20_000 + "["
    status, answer = _answer_before_the_end(server, "/api/v1/runs/1/metrics", prefix, 32 << 20)
    assert status == 422 and "nests" in answer["error"]["message"]


def test_a_deep_body_elsewhere_is_refused_before_it_has_arrived(server):
    prefix = "[" + "1," * 40_000 + "[" * 100
    status, answer = _answer_before_the_end(server, "/api/v1/runs/1/components/1/fingerprint", prefix, 32 << 20)
    assert status == 400 and "deeper" in answer["error"]["message"]


def test_a_large_valid_batch_still_goes_through(server):
    run = httpx.post(server.url + "/api/v1/runs", json={"name": "big"}).json()["id"]
    steps = list(range(20_000))
    batch = {"client_id": "a", "seq": 1, "steps": steps, "series": {f"k{j}": [0.25] * len(steps) for j in range(5)}}
    r = httpx.post(f"{server.url}/api/v1/runs/{run}/metrics", json=batch, timeout=60)
    assert r.status_code == 200 and r.json()["accepted"] == 100_000


def test_no_token_reaches_the_access_log(server):
    """A token in a query string (refused) and one in a header: the access line shows neither."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    access = logging.getLogger("uvicorn.access")
    keep, level = Keep(), access.level
    access.addHandler(keep)
    access.setLevel(logging.INFO)
    try:
        secret = "pw_" + "Q" * 43
        httpx.get(f"{server.url}/api/v1/runs?token={secret}&api_key=hunter2")
        httpx.get(f"{server.url}/api/v1/runs/{secret}", headers={"Authorization": f"Bearer {secret}"})
    finally:
        access.removeHandler(keep)
        access.setLevel(level)
    assert len(lines) == 2, lines
    assert all(secret not in line and "hunter2" not in line for line in lines), lines
    assert "token=[redacted]" in lines[0]
