"""A real Paritywatch backend over real HTTP, as a subprocess the tests can stop and restart."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / ".venv" / "bin" / "paritywatch"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Backend:
    """`paritywatch serve` on a free port with its own SQLite file; survives stop/start."""

    def __init__(self, db_path: Path, log_path: Path) -> None:
        self.port = free_port()
        self.db_path = db_path
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.url + "/api/v1", timeout=10.0)

    @staticmethod
    def cli() -> list[str]:
        if CLI.exists():
            return [str(CLI)]
        return [sys.executable, "-c", "import sys; from paritywatch.backend.cli import main; sys.exit(main())"]

    def command(self) -> list[str]:
        return [*self.cli(), "serve", "--db", f"sqlite:///{self.db_path}", "--host", "127.0.0.1",
                "--port", str(self.port)]

    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None, "already running"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"backend exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"backend did not become healthy in {timeout}s:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> None:
        """Signal the server; SIGKILL it if it is still running after `timeout`."""
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- API helpers (the tests' view of the truth)

    def get(self, path: str, **params: Any) -> Any:
        response = self.client.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: Any) -> Any:
        response = self.client.post(path, json=body)
        response.raise_for_status()
        return response.json()

    def run_id(self, name: str, project: str = "default") -> int:
        return self.post("/runs", {"name": name, "project": project})["id"]

    def counts(self, run_id: int) -> dict[str, int]:
        return {k["key"]: k["count"] for k in self.get(f"/runs/{run_id}/metrics")["keys"]}

    def last_values(self, run_id: int) -> dict[str, float | None]:
        return {k["key"]: k["last_value"] for k in self.get(f"/runs/{run_id}/metrics")["keys"]}

    def create_token(self, scope: str, name: str, project: str | None = None) -> str:
        """A token made as a user makes one (`paritywatch token create`); the first ends open mode."""
        command = [*self.cli(), "token", "create", "--db", f"sqlite:///{self.db_path}", "--scope", scope,
                   "--name", name, "--json"] + (["--project", project] if project else [])
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["token"]

    def use_token(self, token: str) -> None:
        """The tests' own API calls (`get`, `post`...) carry `token` from now on."""
        self.client.headers["Authorization"] = f"Bearer {token}"

    def open_mode(self) -> bool:
        return httpx.get(self.url + "/healthz", timeout=5.0).json()["open_mode"]


def _make_backend(tmp_path_factory: pytest.TempPathFactory) -> Backend:
    base = tmp_path_factory.mktemp("backend")
    return Backend(base / "paritywatch.db", base / "server.log")


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """A shared backend for tests that never stop it."""
    server = _make_backend(tmp_path_factory)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """A backend of the test's own, which the test may stop, kill and restart."""
    server = _make_backend(tmp_path_factory)
    server.start()
    yield server
    server.stop(signal.SIGKILL)


@dataclass
class TokenBackend:
    """A backend that requires tokens, and one token of each kind a user may hold."""

    backend: Backend
    admin: str
    read: str
    ingest: str  # bound to project "my-project", as README's `paritywatch token create` example
    other_project: str  # an ingest token bound to project "other"

    @property
    def url(self) -> str:
        return self.backend.url


@pytest.fixture(scope="module")
def token_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenBackend]:
    server = _make_backend(tmp_path_factory)
    server.start()
    try:
        tokens = TokenBackend(server, admin=server.create_token("admin", "me"),
                              read=server.create_token("read", "dashboard"),
                              ingest=server.create_token("ingest", "trainers", "my-project"),
                              other_project=server.create_token("ingest", "their-trainers", "other"))
        server.use_token(tokens.admin)
        deadline = time.monotonic() + 30.0  # open mode ends within the token cache's 2 s
        while server.open_mode() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server.open_mode()
        yield tokens
    finally:
        server.stop()


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's PARITYWATCH_* settings or writes to ~/.cache."""
    for name in list(os.environ):
        if name.startswith("PARITYWATCH_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
