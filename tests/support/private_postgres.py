"""A throwaway PostgreSQL server of the test's own (initdb in a temp folder, a free loopback port).

Fault tests restart PostgreSQL under a live backend. Restarting the machine's shared server would
break every other test running at the same time (the suite runs in parallel workers), so those
tests restart a private server instead. initdb refuses to run as root: as root the server runs as
the `postgres` system user, which must own the folder.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.live import free_port


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if not candidates:
        raise FileNotFoundError(f"{name} not found: install the PostgreSQL server binaries")
    return str(candidates[-1])


class PrivatePostgres:
    """start() / restart() / stop(); `url` is a SQLAlchemy URL to its `postgres` database."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pw-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._user = "postgres" if os.getuid() == 0 else None

    def _run(self, *args: str, timeout: float = 120) -> None:
        cmd = list(args)
        if self._user:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        subprocess.run(cmd, check=True, timeout=timeout, capture_output=True)

    def _pg_ctl(self, action: str) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"),
                  "-w", "-t", "60", action)

    def start(self) -> PrivatePostgres:
        if self._user:
            shutil.chown(self.dir, self._user)
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self._pg_ctl("start")
        return self

    def restart(self) -> None:
        self._pg_ctl("restart")

    def stop(self) -> None:
        try:
            self._pg_ctl("stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
