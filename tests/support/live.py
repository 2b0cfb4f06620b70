"""A real backend on a loopback port, in this process (uvicorn in a thread) or as a subprocess,
and a local webhook receiver that records what it gets."""
from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import uvicorn
from fastapi.testclient import TestClient

from paritywatch.backend.auth import create_token
from paritywatch.backend.db import Database
from paritywatch.backend.main import create_app
from paritywatch.backend.serving import http_protocol
from paritywatch.backend.settings import Settings
from trainer_hooks import contract

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None,
                 log_path: Path | None = None) -> None:
    """Until GET /healthz answers 200. With `proc`: fail at once, with its log's tail, if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log_path.read_text()[-2000:] if log_path is not None and log_path.exists() else ""
            raise RuntimeError(f"server exited with {proc.returncode} before it was healthy: {tail}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"backend at {url} did not become healthy")


def local_client(app, **kwargs) -> TestClient:
    """A TestClient that looks like a caller on this machine (loopback peer and Host), as open
    mode requires; Starlette's default ("testclient" at "testserver") is not one."""
    return TestClient(app, base_url="http://127.0.0.1:8321", client=("127.0.0.1", 50000), **kwargs)


class _LoopExposingServer(uvicorn.Server):
    """uvicorn.Server that keeps a handle on the loop it serves on (to stall it in a test)."""

    loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)


class ThreadServer:
    """uvicorn serving create_app(settings) in a daemon thread. Like `paritywatch serve` on
    loopback, it runs open (until a token exists) unless the settings say open_mode=False."""

    def __init__(self, settings: Settings, **create_kwargs):
        self.port = free_port()
        update = {"port": self.port}
        if "open_mode" not in settings.model_fields_set:
            update["open_mode"] = True
        settings = settings.model_copy(update=update)
        self.app = create_app(settings, **create_kwargs)
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                timeout_keep_alive=contract.SERVER_KEEPALIVE_S,  # as `paritywatch serve`
                                http=http_protocol(settings.header_timeout_s))
        self.server = _LoopExposingServer(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def stall_event_loop(self, seconds: float) -> None:
        """Block the serving loop for `seconds` (as a blocking call in a handler would): requests
        wait in their sockets while the server's other threads go on."""
        self.server.loop.call_soon_threadsafe(time.sleep, seconds)

    def __enter__(self) -> "ThreadServer":
        self.thread.start()
        wait_healthy(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class RawHttp:
    """One HTTP/1.1 connection to a loopback server, kept open between requests: to see whether
    the server keeps it (keep-alive) or drops it, which an HTTP client's pool hides."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._buffer = b""

    def __enter__(self) -> "RawHttp":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def request(self, method: str, path: str, json_body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body); ConnectionError if the server closed it."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", f"Content-Length: {len(json_body)}"]
        if json_body:
            lines.append("Content-Type: application/json")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + json_body)
        head = self._read_until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
        return int(head[0].split()[1]), headers, self._read_exactly(int(headers.get("content-length", 0)))

    def closed_by_server(self) -> bool:
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable) and self.sock.recv(1, socket.MSG_PEEK) == b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self._buffer += chunk

    def _read_until(self, marker: bytes) -> bytes:
        while marker not in self._buffer:
            self._fill()
        head, self._buffer = self._buffer.split(marker, 1)
        return head

    def _read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            self._fill()
        body, self._buffer = self._buffer[:n], self._buffer[n:]
        return body


class ProcessServer:
    """`paritywatch serve` as a subprocess: can be killed and restarted like a real deployment."""

    def __init__(self, db_url: str, port: int | None = None, env: dict | None = None):
        self.db_url = db_url
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ProcessServer":
        cmd = [sys.executable, "-m", "paritywatch.backend.cli", "serve", "--db", self.db_url, "--port", str(self.port),
               "--log-level", "warning"]
        # stderr to a file: a PIPE nobody reads fills up and blocks the server mid-request.
        self.log_path = Path(tempfile.gettempdir()) / f"paritywatch-test-server-{self.port}.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.url, 60, proc=self.proc, log_path=self.log_path)
        except BaseException:  # a server that never became healthy must not outlive the test
            self.stop()
            raise
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "ProcessServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float
    status: int

    @property
    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """Answers each POST with the next status from `script` (then 200), recording every request."""

    script: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)

    def __post_init__(self):
        receiver = self
        self._arrived = threading.Condition()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = receiver.script.pop(0) if receiver.script else 200
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._arrived:
                    receiver.received.append(Received(headers, body, time.monotonic(), status))
                    receiver._arrived.notify_all()
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "WebhookReceiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def accepted(self) -> list[Received]:
        """Requests the receiver answered with a 2xx."""
        return [r for r in self.received if 200 <= r.status < 300]

    def wait_accepted(self, count: int = 1, timeout_s: float = 20.0) -> list[Received]:
        """Block until `count` requests were answered with a 2xx (woken by each arrival)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.accepted()) >= count, timeout_s):
                raise TimeoutError(f"{len(self.accepted())} of {count} webhook requests accepted in {timeout_s} s")
            return self.accepted()


def settled_deliveries(server_url: str, hook_id: int, expected: int, timeout_s: float = 30.0) -> list[dict]:
    """The webhook's delivery log once it holds `expected` deliveries and none is still pending.

    From then on a receiver's record is final: a delivery is marked delivered (or failed) only after
    its last attempt was answered, so nothing more arrives for it; no sleep to wait for stragglers."""
    def settled():
        rows = httpx.get(f"{server_url}/api/v1/webhooks/{hook_id}/deliveries", params={"limit": expected},
                         timeout=10).json()["deliveries"]
        return rows if len(rows) == expected and all(d["status"] != "pending" for d in rows) else None

    return wait_for(settled, timeout_s, interval_s=0.05)


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.02, what: str = "condition"):
    """Poll `predicate` until it returns something truthy (returned); TimeoutError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not met within {timeout_s:g} s")


def wait_for_sweeps(srv: "ThreadServer", count: int, timeout_s: float = 30.0) -> None:
    """Wait (by polling) until the server's heartbeat sweep has run `count` more times."""
    engine = srv.app.state.engine
    start = engine.sweeps
    wait_for(lambda: engine.sweeps >= start + count, timeout_s=timeout_s, what=f"{count} heartbeat sweeps")


def first_within(predicate, window_s: float, interval_s: float = 0.05):
    """For "X must not happen while ...": poll `predicate` (X happened) through `window_s` and
    return its first truthy value at once (the test fails fast), or None if X never happened."""
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return None


def detect_jobs_done(db_url: str, run_id: int, kind: str = "fingerprint") -> bool:
    """No detection job of `kind` is left for the run: everything it received has been judged
    (a test that asserts no alert fired waits for this first)."""
    from sqlalchemy import create_engine, func, select

    from paritywatch.backend.models import DetectJob

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(DetectJob).where(
                DetectJob.run_id == run_id, DetectJob.kind == kind)) == 0
    finally:
        engine.dispose()


def make_tokens(url: str) -> dict[str, str]:
    """One token per scope (ingest, read, admin) in the database at `url`: its server is closed."""
    db = Database(url)
    try:
        return {scope: create_token(db, f"rel-{scope}", [scope])[1] for scope in ("ingest", "read", "admin")}
    finally:
        db.dispose()
