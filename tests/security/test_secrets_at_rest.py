"""Issue 13.6: secrets stay secret — the database password is never printed, webhook signing
secrets are encrypted at rest (and rotate), the SQLite file is the owner's only."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from paritywatch.backend import migrate
from paritywatch.backend.db import Database
from paritywatch.backend.main import create_app
from paritywatch.backend.models import Webhook
from paritywatch.backend.settings import Settings
from paritywatch.backend.webhooks import signing
from tests.support.live import ROOT, ThreadServer, WebhookReceiver, free_port, local_client, wait_for


@pytest.mark.postgres
def test_serve_never_prints_the_database_password(postgresql_url):
    url = postgresql_url.replace("postgres@", "postgres:hunter2-never-shown@", 1)  # trust auth ignores it
    assert "hunter2" in url
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "paritywatch.backend.cli", "serve", "--db", url, "--port", str(port),
                             "--log-level", "info"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    try:
        for line in proc.stdout:  # until the server says it listens
            lines.append(line)
            if "Uvicorn running" in line or "Application startup complete" in line:
                break
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=20)
    output = "".join(lines) + rest
    assert "Paritywatch dashboard" in output and "***" in output
    assert "hunter2" not in output


def test_webhook_secrets_are_encrypted_at_rest_and_rotate(sqlite_db, tmp_path):
    old_key = Fernet.generate_key().decode()
    settings = Settings(database_url=sqlite_db, allow_loopback_webhooks=True, webhook_poll_interval_s=0.05,
                        secret_keys=old_key, open_mode=True)
    with WebhookReceiver() as rx:
        with ThreadServer(settings) as srv, httpx.Client(base_url=srv.url + "/api/v1", timeout=30) as api:
            hook = api.post("/webhooks", json={"url": rx.url}).json()
        raw = open(sqlite_db.removeprefix("sqlite:///"), "rb").read()
        assert hook["secret"].encode() not in raw and hook["secret"][6:].encode() not in raw
        db = Database(sqlite_db)
        with db.read() as s:
            stored = s.scalar(select(Webhook.secret))
        db.dispose()
        assert stored.startswith("enc:") and hook["secret"] not in stored

        # Rotation: a new key first, the old one after it; `rotate` re-encrypts; the old key goes.
        new_key = Fernet.generate_key().decode()
        env = {**os.environ, "PARITYWATCH_SECRET_KEYS": f"{new_key},{old_key}"}
        done = subprocess.run([sys.executable, "-m", "paritywatch.backend.cli", "secret-key", "rotate", "--db", sqlite_db],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "re-encrypted 1" in done.stdout, done.stderr
        with ThreadServer(settings.model_copy(update={"secret_keys": new_key})) as srv, \
                httpx.Client(base_url=srv.url + "/api/v1", timeout=30) as api:
            api.post(f"/webhooks/{hook['id']}/test")
            [got] = wait_for(rx.accepted, 10)
        signing.verify(hook["secret"], got.headers, got.body, time.time())  # still the same secret


def test_without_a_key_webhooks_cannot_be_created(sqlite_db):
    app = create_app(Settings(database_url=sqlite_db, open_mode=True, secret_keys="", allow_loopback_webhooks=True),
                     upgrade_schema=False)
    with local_client(app) as api:
        r = api.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/h"})
    assert r.status_code == 503 and "PARITYWATCH_SECRET_KEYS" in r.json()["error"]["message"]


def test_plaintext_secrets_from_before_are_encrypted_at_start(sqlite_db):
    db = Database(sqlite_db)
    with db.write() as s:
        s.add(Webhook(url="https://hooks.example/x", secret="whsec_bGVnYWN5LXNlY3JldC1ieXRlcw=="))
    app = create_app(Settings(database_url=sqlite_db, open_mode=True, run_background_workers=False),
                     upgrade_schema=False)
    with local_client(app):
        pass
    with db.read() as s:
        stored = s.scalar(select(Webhook.secret))
    db.dispose()
    assert stored.startswith("enc:") and app.state.dispatcher.box.open(stored) == "whsec_bGVnYWN5LXNlY3JldC1ieXRlcw=="


def test_the_sqlite_file_is_the_owners_only(tmp_path):
    old = os.umask(0o022)  # the usual umask would give 0644
    try:
        url = f"sqlite:///{tmp_path / 'private' / 'pw.db'}"
        migrate.upgrade(url)
        db = Database(url)
        with db.write() as s:  # WAL and shared-memory files appear with the first write
            s.add(Webhook(url="https://hooks.example/x", secret="x"))
        for path in (tmp_path / "private").iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        db.dispose()
    finally:
        os.umask(old)
