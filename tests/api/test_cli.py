import json
import subprocess
import sys


def run_cli(*args: str):  # noqa: ANN001
    return subprocess.run([sys.executable, "-m", "backend.cli", *args], capture_output=True, text=True, timeout=60)


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
    for cmd in ([], ["serve"], ["db"], ["token"], ["token", "create"]):
        r = run_cli(*cmd, "--help")
        assert r.returncode == 0 and "usage: paritywatch" in r.stdout
