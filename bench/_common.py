"""Shared helpers for the benches: progress, servers as subprocesses, scratch databases, the JSON line.

Nothing here is timed: it starts and stops things. Every bench imports it as `from _common import ...`
(the bench folder is on sys.path when a bench runs as `.venv/bin/python bench/NAME.py`).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv" / "bin" / "python"
PARITYWATCH = ROOT / ".venv" / "bin" / "paritywatch"
# Built once and cached outside the clone by scripts/setup_mlflow_env.sh (same default and variable).
MLFLOW_VENV = Path(os.environ.get("PARITYWATCH_MLFLOW_VENV") or Path.home() / ".cache" / "paritywatch" / "venv-mlflow")
PG_ADMIN_URL = os.environ.get("PARITYWATCH_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_T0 = time.monotonic()


def allow_loopback_webhooks() -> None:
    """What a bench that sends webhooks to its own loopback receiver needs from the server it
    starts: loopback targets allowed, and a key for the sealed webhook secrets (without one the
    server answers 503 secret_key_missing, as it should)."""
    os.environ["PARITYWATCH_ALLOW_LOOPBACK_WEBHOOKS"] = "1"
    if not os.environ.get("PARITYWATCH_SECRET_KEYS"):
        from cryptography.fernet import Fernet

        os.environ["PARITYWATCH_SECRET_KEYS"] = Fernet.generate_key().decode()


def progress(msg: str) -> None:
    """One progress line on stderr, with the seconds since the bench started."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def emit(result: dict) -> None:
    """The bench's last stdout line: one JSON object."""
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=False), flush=True)


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    if not samples:
        return float("nan")
    s = sorted(samples)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ scratch databases
@contextlib.contextmanager
def scratch_sqlite(tag: str) -> Iterator[str]:
    """A fresh SQLite file in a temp dir; yields its URL, removes the dir after."""
    d = tempfile.mkdtemp(prefix=f"paritywatch_bench_{tag}_")
    try:
        yield f"sqlite:///{d}/bench.db"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except Exception as exc:
        progress(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
        return False


@contextlib.contextmanager
def scratch_postgres(tag: str) -> Iterator[str]:
    """CREATE DATABASE paritywatch_bench_<tag>_<random>; yields its URL; DROPs it after (FORCE)."""
    import psycopg

    name = f"paritywatch_bench_{tag}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_db(kind: str, tag: str) -> Iterator[str]:
    cm = scratch_sqlite(tag) if kind == "sqlite" else scratch_postgres(tag)
    with cm as url:
        yield url


# ------------------------------------------------------------------ servers
class Server:
    """A server subprocess on a free loopback port; `url` is its base URL."""

    def __init__(self, argv: list[str], port: int, health_path: str, name: str, log_path: Path):
        self.argv, self.port, self.health_path, self.name, self.log_path = argv, port, health_path, name, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> "Server":
        return self.launch().wait_ready(timeout)

    def launch(self) -> "Server":
        """Start the process and return at once (wait_ready() waits for its health check)."""
        self._log = open(self.log_path, "wb")
        # Own process group: stop() signals the server and its worker children, nothing else.
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def wait_ready(self, timeout: float = 90.0) -> "Server":
        import httpx

        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + self.health_path, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer {self.health_path} in {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self._log.close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def paritywatch_server(db_url: str, workers: int = 1, log_dir: Path | None = None) -> Server:
    port = free_port()
    log_dir = log_dir or Path(tempfile.gettempdir())
    argv = [str(PARITYWATCH), "serve", "--db", db_url, "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--log-level", "warning"]
    return Server(argv, port, "/healthz", "paritywatch", log_dir / f"paritywatch_bench_server_{port}.log")


# ------------------------------------------------------------------ MLflow (separate venv)
def mlflow_bin() -> Path:
    return MLFLOW_VENV / "bin" / "mlflow"


def mlflow_version() -> str | None:
    py = MLFLOW_VENV / "bin" / "python"
    if not py.exists():
        return None
    out = subprocess.run([str(py), "-c", "import mlflow; print(mlflow.__version__)"], capture_output=True, text=True)
    return out.stdout.strip() or None


def ensure_mlflow_venv() -> bool:
    """MLflow lives in its own venv (it pins its own sqlalchemy/alembic), built once by
    scripts/setup_mlflow_env.sh and cached; a cached one is reused in a second. Its progress goes to
    stderr. True when `mlflow` is there afterwards (False: it could not be built, e.g. offline)."""
    setup = ROOT / "scripts" / "setup_mlflow_env.sh"
    progress(f"MLflow environment: {MLFLOW_VENV} (scripts/setup_mlflow_env.sh; built once, then cached)")
    proc = subprocess.run(["bash", str(setup)], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PARITYWATCH_MLFLOW_VENV": str(MLFLOW_VENV)})
    if proc.returncode != 0 or not mlflow_bin().exists():
        progress(f"scripts/setup_mlflow_env.sh failed with {proc.returncode}")
        return False
    return True


def mlflow_server(store_dir: Path, workers: int | None = None) -> Server:
    """MLflow's server on a fresh SQLite store: a copy of the migrated empty database the setup
    script keeps (when there), so the start does not include MLflow's schema migrations."""
    template = MLFLOW_VENV / "mlflow-template.db"
    if template.is_file():
        shutil.copyfile(template, store_dir / "mlflow.db")
    port = free_port()
    argv = [str(mlflow_bin()), "server", "--backend-store-uri", f"sqlite:///{store_dir}/mlflow.db",
            "--default-artifact-root", str(store_dir / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    return Server(argv, port, "/health", "mlflow", store_dir / "mlflow_server.log")
