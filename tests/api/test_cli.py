import json
import subprocess
import sys

import pytest


def run_cli(*args: str):  # noqa: ANN001
    return subprocess.run([sys.executable, "-m", "paritywatch.backend.cli", *args], capture_output=True, text=True, timeout=60)


def test_db_upgrade_current_and_tokens(tmp_path):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    assert run_cli("db", "current", "--db", db).returncode == 1  # empty: not at head
    assert run_cli("db", "upgrade", "--db", db).returncode == 0
    cur = run_cli("db", "current", "--db", db)
    assert cur.returncode == 0 and "head" in cur.stdout
    made = run_cli("token", "create", "--scope", "ingest", "--name", "worker", "--json", "--db", db)
    token = json.loads(made.stdout)
    assert token["scopes"] == ["ingest"] and token["token"].startswith("pw_")
    listed = run_cli("token", "list", "--db", db).stdout
    assert "worker" in listed and token["token"] not in listed
    assert run_cli("token", "revoke", str(token["id"]), "--db", db).returncode == 0
    assert "revoked" in run_cli("token", "list", "--db", db).stdout


def test_serve_refuses_public_bind_without_tokens(tmp_path):
    r = run_cli("serve", "--host", "0.0.0.0", "--port", "8399", "--db", f"sqlite:///{tmp_path / 's.db'}")
    assert r.returncode == 2 and "refusing" in r.stderr


def test_help_texts():
    for cmd in ([], ["serve"], ["db"], ["token"], ["token", "create"], ["diff"], ["fingerprint"], ["demo"]):
        r = run_cli(*cmd, "--help")
        assert r.returncode == 0 and "usage: paritywatch" in r.stdout


def _hinted_command(stderr: str) -> list[str]:
    """The `paritywatch token create ...` line the server's refusal tells the user to run."""
    import shlex

    line = next(ln.strip() for ln in stderr.splitlines() if ln.strip().startswith("paritywatch token create"))
    return shlex.split(line)[1:]


def test_following_the_refusal_hint_creates_the_token_in_the_servers_database(tmp_path):
    """Issue 17.5: the hint had no --db, so it wrote ./paritywatch.db while the server kept refusing."""
    import os

    from paritywatch.backend.auth import has_active_tokens
    from paritywatch.backend.db import Database

    served, elsewhere = tmp_path / "served", tmp_path / "elsewhere"
    served.mkdir(), elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-m", "paritywatch.backend.cli", "serve", "--host", "0.0.0.0", "--port", "8399",
                        "--db", "sqlite:///./server.db"], cwd=served, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refusing" in r.stderr
    assert f"database: sqlite:///{served / 'server.db'}" in r.stderr  # says which one, absolute
    args = _hinted_command(r.stderr)
    made = subprocess.run([sys.executable, "-m", "paritywatch.backend.cli", *args], cwd=elsewhere, capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if k != "PARITYWATCH_DATABASE_URL"})
    assert made.returncode == 0, made.stderr
    assert f"database: sqlite:///{served / 'server.db'}" in made.stderr
    assert not (elsewhere / "paritywatch.db").exists()
    db = Database(f"sqlite:///{served / 'server.db'}")
    try:
        assert has_active_tokens(db)
    finally:
        db.dispose()


@pytest.mark.postgres
def test_every_database_command_names_its_database_with_the_password_hidden(postgresql_url):
    from sqlalchemy.engine import make_url

    url = make_url(postgresql_url).set(drivername="postgresql", password="s3cr3t-pw")  # trust auth ignores it
    shown = url.render_as_string(hide_password=True)
    plain = url.render_as_string(hide_password=False)
    for cmd in (["db", "current"], ["db", "upgrade"], ["token", "create", "--scope", "read", "--json"],
                ["token", "list"], ["token", "revoke", "99999"]):
        r = run_cli(*cmd, "--db", plain)
        assert f"database: {shown} (from --db)" in r.stderr, (cmd, r.stderr)
        assert "s3cr3t-pw" not in r.stdout + r.stderr, cmd
    # the hint a password-protected --db gets: the same URL, password masked, and it says so
    from argparse import Namespace

    from paritywatch.backend.cli import db_option_for

    assert db_option_for(Namespace(db=plain)) == f"--db '{shown}' (with the password in place of ***)"


def test_token_commands_refuse_a_database_without_the_schema(tmp_path):
    for cmd in (["token", "list"], ["token", "revoke", "1"]):
        r = run_cli(*cmd, "--db", f"sqlite:///{tmp_path / 'typo.db'}")
        assert r.returncode == 2 and "no Paritywatch schema" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "typo.db").exists()  # and it did not create one


def test_serve_without_db_runs_open_on_loopback(tmp_path):
    """`make run` starts `serve` without --db: open mode must hold there too (its settings were read,
    and cached, before `serve` asked for open mode, so every call was a 401)."""
    import os

    import httpx

    from tests.support.live import free_port, wait_healthy

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARITYWATCH_")}
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "paritywatch.backend.cli", "serve", "--port", str(port), "--log-level", "warning"],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 180, proc=proc, log_path=log)
        who = httpx.get(f"http://127.0.0.1:{port}/api/v1/whoami")
        assert who.status_code == 200 and who.json()["open_mode"] is True, who.text
        assert (tmp_path / "paritywatch.db").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _serve_says(db_path, *extra: str) -> str:
    """The line `paritywatch serve` prints about who may call it, read from a real start."""
    from tests.support.live import free_port

    proc = subprocess.Popen([sys.executable, "-m", "paritywatch.backend.cli", "serve", "--db", f"sqlite:///{db_path}",
                             "--port", str(free_port()), "--log-level", "warning", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        return proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_serve_says_the_truth_about_tokens_in_each_case(tmp_path):
    """Issue 29.5: `serve` said "tokens required (create one …)" when tokens existed."""
    path = tmp_path / "s.db"
    assert "open: no tokens" in _serve_says(path)
    assert "tokens required, and none exists yet: create one (paritywatch token create" in _serve_says(path, "--no-open")
    def create(scope: str) -> int:
        made = run_cli("token", "create", "--scope", scope, "--name", scope, "--json", "--db", f"sqlite:///{path}")
        return json.loads(made.stdout)["id"]

    ids = [create("admin")]
    said = _serve_says(path)
    assert "tokens required: 1 active token (paritywatch token list --db" in said and "create" not in said
    ids.append(create("read"))
    assert "tokens required: 2 active tokens" in _serve_says(path)
    for token_id in ids:
        assert run_cli("token", "revoke", str(token_id), "--db", f"sqlite:///{path}").returncode == 0
    said = _serve_says(path)
    assert "every token is revoked" in said and "open: no tokens" not in said  # revoking never reopens
