"""docker-compose.yml (and its TLS override) checked without a Docker engine: the files are
interpolated by podman-compose's implementation of Compose's `${VAR:?}` / `${VAR:-}` rules (whole
file, as Docker does before it looks at anything else), the README's own setup commands produce
the environment, and the services' commands (the backend's start command, both health checks)
run for real on this machine against loopback and the local PostgreSQL."""
from __future__ import annotations

import ipaddress
import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from podman_compose import rec_subs
from sqlalchemy import create_engine, make_url, text

from paritywatch.backend.webhooks.secrets import SecretBox
from tests.conftest import PG_ADMIN_URL
from tests.support.live import ROOT, free_port, wait_healthy

BACKEND_PORT = "8321"  # the container port the compose file publishes
FERNET_KEY = "q0x1Yd1yJ0M8m6k7S7XQ4mB3Zk1vQ2o0yq3W9c2a7VE="  # a made-up 32-byte urlsafe-base64 key


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


def required_variables(compose: dict) -> list[str]:
    """The variables Compose refuses to start without, discovered by interpolating with an empty
    environment and adding each variable the interpolation says is missing."""
    env: dict[str, str] = {}
    while True:
        try:
            rec_subs(compose, env)
            return sorted(env)
        except ValueError as exc:
            m = re.match(r"required variable (\w+) is missing a value", str(exc))
            assert m, exc
            env[m.group(1)] = "set"


def readme_setup_env() -> dict[str, str]:
    """Run the `export` lines of the README's compose snippet in bash; the variables they set."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Scaling out on PostgreSQL", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    exports = [line for line in block.splitlines() if line.startswith("export ")]
    assert exports, "the README's compose snippet sets no variables"
    names = [line.split()[1].split("=", 1)[0] for line in exports]
    printer = "python3 -c 'import json, os, sys; print(json.dumps({k: os.environ[k] for k in sys.argv[1:]}))' "
    script = "\n".join(exports) + "\n" + printer + " ".join(names)
    out = subprocess.run(["bash", "-euc", script], capture_output=True, text=True, check=True,
                         env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    return json.loads(out.stdout)


def published(ports: list[str]) -> list[tuple[str, str, str]]:
    """(host ip, host port, container port) of Compose's short port syntax."""
    out = []
    for spec in ports:
        parts = str(spec).rsplit(":", 2)
        host_ip, host_port, container = ([""] * (3 - len(parts)) + parts)
        out.append((host_ip, host_port, container))
    return out


def test_compose_refuses_to_start_without_a_database_password_admin_token_or_secret_key():
    assert required_variables(load("docker-compose.yml")) == ["PARITYWATCH_BOOTSTRAP_TOKEN", "PARITYWATCH_SECRET_KEYS", "POSTGRES_PASSWORD"]
    env = {"POSTGRES_PASSWORD": "s3cret-Pw_1", "PARITYWATCH_BOOTSTRAP_TOKEN": "pw_" + "x" * 40, "PARITYWATCH_SECRET_KEYS": FERNET_KEY}
    services = rec_subs(load("docker-compose.yml"), env)["services"]
    assert services["db"]["environment"]["POSTGRES_PASSWORD"] == "s3cret-Pw_1"
    assert services["backend"]["environment"]["PARITYWATCH_DATABASE_URL"] == \
        "postgresql://paritywatch:s3cret-Pw_1@db:5432/paritywatch"
    assert services["backend"]["environment"]["PARITYWATCH_BOOTSTRAP_TOKEN"] == env["PARITYWATCH_BOOTSTRAP_TOKEN"]
    assert services["backend"]["environment"]["PARITYWATCH_SECRET_KEYS"] == FERNET_KEY


@pytest.mark.parametrize("port_env", [{}, {"PARITYWATCH_PORT": "9000"}])
def test_the_backend_is_published_on_loopback_only(port_env):
    env = {"POSTGRES_PASSWORD": "pw", "PARITYWATCH_BOOTSTRAP_TOKEN": "t" * 30, "PARITYWATCH_SECRET_KEYS": FERNET_KEY,
           **port_env}
    services = rec_subs(load("docker-compose.yml"), env)["services"]
    assert "ports" not in services["db"]  # the database is reachable on the compose network only
    ports = published(services["backend"]["ports"])
    assert ports, "the backend publishes no port"
    for host_ip, host_port, container in ports:
        assert host_ip and ipaddress.ip_address(host_ip).is_loopback, f"published on {host_ip or 'every address'}"
        assert (host_port, container) == (port_env.get("PARITYWATCH_PORT", "8321"), BACKEND_PORT)


def test_the_tls_proxy_needs_its_domain_and_forwards_to_the_backend():
    merged = load("docker-compose.yml")
    tls = load("docker-compose.tls.yml")
    merged["services"].update(tls["services"])
    merged["volumes"].update(tls["volumes"])
    assert required_variables(merged) == ["PARITYWATCH_BOOTSTRAP_TOKEN", "PARITYWATCH_DOMAIN", "PARITYWATCH_SECRET_KEYS",
                                          "POSTGRES_PASSWORD"]
    env = {"POSTGRES_PASSWORD": "pw", "PARITYWATCH_BOOTSTRAP_TOKEN": "t" * 30, "PARITYWATCH_SECRET_KEYS": FERNET_KEY,
           "PARITYWATCH_DOMAIN": "pw.example.org"}
    services = rec_subs(merged, env)["services"]
    proxy = services["tls"]
    argv = proxy["command"]
    assert argv[:2] == ["caddy", "reverse-proxy"]
    args = dict(zip(argv[2::2], argv[3::2]))
    assert args["--from"] == "pw.example.org"  # a DNS name: Caddy obtains and renews its certificate
    upstream_service, upstream_port = args["--to"].split(":")
    assert upstream_service in services and upstream_port == BACKEND_PORT
    assert proxy["depends_on"][upstream_service]["condition"] == "service_healthy"
    assert {(p[1], p[2]) for p in published(proxy["ports"])} == {("80", "80"), ("443", "443")}
    assert any(str(v).endswith(":/data") for v in proxy["volumes"])  # certificates persist


def test_readme_and_compose_name_the_same_variables():
    env = readme_setup_env()
    assert set(required_variables(load("docker-compose.yml"))) <= set(env), \
        f"README exports {sorted(env)}; docker-compose.yml requires more"
    readme = (ROOT / "README.md").read_text()
    for name in env:
        assert f"`{name}`" in readme, f"README's configuration does not document {name}"
    assert len(env["PARITYWATCH_BOOTSTRAP_TOKEN"]) >= 24
    SecretBox(env["PARITYWATCH_SECRET_KEYS"])  # the README's recipe makes a key the server accepts


def test_the_image_runs_what_compose_runs_and_holds_every_package():
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))
    compose_cmd = load("docker-compose.yml")["services"]["backend"]["command"]
    assert cmd[:2] == compose_cmd[:2] == ["paritywatch", "serve"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert cmd[0] in pyproject["project"]["scripts"]
    copied = {src for line in dockerfile.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]}
    # What setup.py packages (its NAMESPACED folders, the client library, the dashboard) and itself.
    namespaced = re.search(r"^NAMESPACED = (\(.*\))$", (ROOT / "setup.py").read_text(), re.M).group(1)
    packages = {*ast.literal_eval(namespaced), "trainer_hooks", "frontend", "setup.py"}
    assert packages <= copied, f"the image misses {packages - copied}"
    extras = re.findall(r'pip install "\.\[([\w,]+)\]"', dockerfile)
    assert extras and set(extras[0].split(",")) <= set(pyproject["project"]["optional-dependencies"])


def _healthcheck_argv(test: list[str], port: int) -> list[str]:
    kind, *rest = test
    argv = shlex.split(rest[0]) if kind == "CMD-SHELL" else rest
    return [a.replace(f"127.0.0.1:{BACKEND_PORT}", f"127.0.0.1:{port}") for a in argv]


@pytest.mark.postgres
def test_the_services_commands_run_against_local_postgresql(tmp_path):
    """The backend's start command with the environment compose gives it (built from the README's
    own setup commands), against a fresh database on the local PostgreSQL; then both health checks."""
    setup = readme_setup_env()
    services = rec_subs(load("docker-compose.yml"), setup)["services"]
    backend = services["backend"]
    name = f"paritywatch_compose_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    port = free_port()
    env = {k: str(v) for k, v in backend["environment"].items()}
    # The one change from the container: the database is this machine's, not the `db` service's
    # (its user and a fresh database; trust auth, so the password compose put in is carried along).
    local = make_url(PG_ADMIN_URL)
    container_url = make_url(env["PARITYWATCH_DATABASE_URL"])
    assert container_url.password == setup["POSTGRES_PASSWORD"]
    env["PARITYWATCH_DATABASE_URL"] = container_url.set(
        username=local.username, host=local.host, port=local.port, database=name).render_as_string(hide_password=False)
    argv = [str(port) if a == BACKEND_PORT else a for a in backend["command"]]
    exe = Path(sys.executable).parent / argv[0]
    log = tmp_path / "backend.log"
    proc = subprocess.Popen([str(exe), *argv[1:]], cwd=tmp_path, env={**os.environ, **env},
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 60, proc=proc, log_path=log)
        health = httpx.get(f"{url}/healthz").json()
        assert health["database"] == "postgresql" and health["open_mode"] is False and health["schema_revision"]
        assert httpx.get(f"{url}/api/v1/runs").status_code == 401
        auth = {"Authorization": f"Bearer {setup['PARITYWATCH_BOOTSTRAP_TOKEN']}"}
        assert httpx.post(f"{url}/api/v1/runs", json={"name": "compose"}, headers=auth).status_code == 200
        # the backend's health check, as the container runs it (its interpreter is this one)
        check = _healthcheck_argv(backend["healthcheck"]["test"], port)
        assert check[0] == "python"
        assert subprocess.run([sys.executable, *check[1:]], timeout=30).returncode == 0
        # the database's health check against this machine's PostgreSQL, and against a dead port
        pg_check = _healthcheck_argv(services["db"]["healthcheck"]["test"], port)
        assert pg_check[0] == "pg_isready"
        assert subprocess.run([*pg_check, "-h", "127.0.0.1", "-p", "5432"], capture_output=True, timeout=30).returncode == 0
        assert subprocess.run([*pg_check, "-h", "127.0.0.1", "-p", str(free_port())], capture_output=True,
                              timeout=30).returncode != 0
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    # the backend's health check fails once the backend is gone
    assert subprocess.run([sys.executable, *_healthcheck_argv(backend["healthcheck"]["test"], port)[1:]],
                          capture_output=True, timeout=30).returncode != 0
