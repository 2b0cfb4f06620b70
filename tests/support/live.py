"""A real backend on a loopback port, in this process (uvicorn in a thread) or as a subprocess,
and a local webhook receiver that records what it gets."""
from __future__ import annotations

import json
import os
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

from backend.main import create_app
from backend.settings import Settings

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


class ThreadServer:
    """uvicorn serving create_app(settings) in a daemon thread."""

    def __init__(self, settings: Settings):
        self.port = free_port()
        settings = settings.model_copy(update={"port": self.port})
        self.app = create_app(settings)
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "ThreadServer":
        self.thread.start()
        wait_healthy(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class ProcessServer:
    """`paritywatch serve` as a subprocess: can be killed and restarted like a real deployment."""

    def __init__(self, db_url: str, port: int | None = None, env: dict | None = None):
        self.db_url = db_url
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ProcessServer":
        cmd = [sys.executable, "-m", "backend.cli", "serve", "--db", self.db_url, "--port", str(self.port),
               "--log-level", "warning"]
        # stderr to a file: a PIPE nobody reads fills up and blocks the server mid-request.
        self.log_path = Path(tempfile.gettempdir()) / f"paritywatch-test-server-{self.port}.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        wait_healthy(self.url, 60, proc=self.proc, log_path=self.log_path)
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

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = receiver.script.pop(0) if receiver.script else 200
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.received.append(Received(headers, body, time.monotonic(), status))
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


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.02):  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError("condition not met in time")
