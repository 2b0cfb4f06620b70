"""docker-compose.yml is checked by parsing it (no Docker engine here) and by running the backend
container's start command by hand, with the compose environment, against the local PostgreSQL."""
from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, text

from tests.conftest import PG_ADMIN_URL
from tests.support.live import ROOT, free_port, wait_healthy

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}."""
    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if name in env:
            return env[name]
        if op == ":-":
            return arg
        raise KeyError(f"{name} is required: {arg}")
    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", sub, value)


def test_services_env_healthchecks_and_volume():
    services = COMPOSE["services"]
    assert set(services) == {"db", "backend"}
    db, backend = services["db"], services["backend"]
    assert db["image"].startswith("postgres:")
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in db["volumes"])
    assert "pgdata" in COMPOSE["volumes"]
    assert backend["depends_on"]["db"]["condition"] == "service_healthy"
    env = backend["environment"]
    assert env["PARITYWATCH_DATABASE_URL"].startswith("postgresql://")
    assert "@db:5432/" in env["PARITYWATCH_DATABASE_URL"]
    assert "PARITYWATCH_BOOTSTRAP_TOKEN" in env
    assert "/healthz" in " ".join(backend["healthcheck"]["test"])
    assert backend["command"][:2] == ["paritywatch", "serve"]
    assert (ROOT / "Dockerfile").read_text().count("paritywatch") >= 2


def test_a_missing_admin_token_is_a_clear_error():
    with pytest.raises(KeyError, match="PARITYWATCH_ADMIN_TOKEN"):
        interpolate(COMPOSE["services"]["backend"]["environment"]["PARITYWATCH_BOOTSTRAP_TOKEN"], {})


@pytest.mark.postgres
def test_backend_start_command_runs_against_local_postgresql(tmp_path):
    name = f"paritywatch_compose_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin_token = "pw_" + secrets.token_urlsafe(32)
    port = free_port()
    backend = COMPOSE["services"]["backend"]
    env = {k: interpolate(str(v), {"PARITYWATCH_ADMIN_TOKEN": admin_token, "POSTGRES_PASSWORD": "x"})
           for k, v in backend["environment"].items()}
    # the one change from the container: the database host is this machine, not the `db` service
    env["PARITYWATCH_DATABASE_URL"] = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql+psycopg", "postgresql") + f"/{name}"
    argv = [a if a != "8321" else str(port) for a in backend["command"]]
    exe = Path(sys.executable).parent / argv[0]
    proc = subprocess.Popen([str(exe), *argv[1:]], cwd=tmp_path, env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 60)
        health = httpx.get(f"{url}/healthz").json()
        assert health["database"] == "postgresql" and health["open_mode"] is False and health["schema_revision"]
        assert httpx.get(f"{url}/api/v1/runs").status_code == 401
        auth = {"Authorization": f"Bearer {admin_token}"}
        assert httpx.post(f"{url}/api/v1/runs", json={"name": "compose"}, headers=auth).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
