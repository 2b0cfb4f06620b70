"""The hostile neighbour of bench/load.py --hostile: one client on loopback sending, over and over
for a bounded time, every attack of issue 26 while the normal posters post. It runs in its own
process (building 17-32 MB bodies must not slow the posters' event loop, only the server's).

Attacks: a batch of 10**6 keys (~17 MB), a 17 MB batch of too many values, 32 MB of arrays
nested 100 deep, SLOW_CONNECTIONS connections trickling header lines, as many trickling a body a
byte at a time. Each slow connection records how long the server kept it open.
"""
from __future__ import annotations

import socket
import threading
import time

SLOW_CONNECTIONS = 200  # of each kind
TRICKLE_EVERY_S = 1.0


def _bodies() -> dict[str, bytes]:
    start = b'{"client_id":"hostile","seq":1,"steps":[1],"series":{'
    return {
        "million_keys": start + b",".join(b'"k%d":[0.5]' % i for i in range(10**6)) + b"}}",
        "too_many_values": start + b'"k":[' + b",".join([b"0.5"] * 4_300_000) + b"]}}",
        "deep_nesting": start + b'"k":[' + b",".join([b"[" * 97 + b"1" + b"]" * 97] * 160_000) + b"]}}",
    }


def _send_big(host: str, port: int, path: str, body: bytes, token: str | None) -> int:
    """The status answered (0: none before the server closed the connection)."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, port), timeout=30) as sock:
        try:
            sock.sendall(head + body)
        except OSError:
            pass  # refused and closed before the end: read what it answered
        try:
            answer = sock.recv(4096)
        except OSError:
            return 0
    try:
        return int(answer.split()[1])
    except (IndexError, ValueError):
        return 0


def _slow(host: str, port: int, path: str, kind: str, until: float, held: list[float]) -> None:
    """One connection trickling its head (kind "headers") or its body ("body") until the server
    closes it or `until`; appends how long it stayed open."""
    start = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError:
        return
    with sock:
        sock.settimeout(TRICKLE_EVERY_S)
        try:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n".encode())
            if kind == "body":
                sock.sendall(b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            n = 0
            while time.monotonic() < until:
                try:
                    if sock.recv(4096) == b"":
                        break  # closed by the server
                    continue  # an answer (408): the close follows
                except socket.timeout:
                    pass
                n += 1
                sock.sendall(f"X-Slow-{n}: a\r\n".encode() if kind == "headers" else b" ")
        except OSError:
            pass
    held.append(time.monotonic() - start)


def attack(url: str, run_id: int, seconds: float, token: str | None, out, ready) -> None:
    """Runs in a child process: sets `ready` once its bodies are built, then attacks for
    `seconds` and puts one dict of figures on `out` (a multiprocessing queue)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = f"/api/v1/runs/{run_id}/metrics"
    bodies = _bodies()
    ready.set()
    until = time.monotonic() + seconds
    held: dict[str, list[float]] = {"headers": [], "body": []}
    threads = [threading.Thread(target=_slow, args=(host, port, path, kind, until, held[kind]), daemon=True)
               for kind in held for _ in range(SLOW_CONNECTIONS)]
    for t in threads:
        t.start()
    answers: dict[str, list[int]] = {name: [] for name in bodies}
    while time.monotonic() < until:
        for name, body in bodies.items():
            t0 = time.monotonic()
            answers[name].append(_send_big(host, port, path, body, token))
            time.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))  # pacing: about two attacks a second
    for t in threads:
        t.join(timeout=10)
    out.put({
        "big_bodies_sent": {name: len(v) for name, v in answers.items()},
        "big_bodies_answers": {name: sorted(set(v)) for name, v in answers.items()},
        "slow_connections": {kind: len(v) for kind, v in held.items()},
        "slow_connection_longest_open_s": {kind: round(max(v), 1) if v else None for kind, v in held.items()},
    })
