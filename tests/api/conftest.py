from __future__ import annotations

import pytest

from paritywatch.backend.auth import create_token
from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.support.live import local_client


@pytest.fixture
def settings(db_url) -> Settings:
    return Settings(database_url=db_url, host="127.0.0.1", max_body_bytes=2 * 1024 * 1024, max_points_per_batch=50_000,
                    open_mode=True)


@pytest.fixture
def app(settings):
    return create_app(settings, upgrade_schema=False)


@pytest.fixture
def client(app):
    """An open (no tokens, loopback) server: every local caller is admin."""
    with local_client(app) as c:
        yield c


def make_token(app, *scopes: str) -> str:
    _, secret = create_token(app.state.db, "test-" + "-".join(scopes), list(scopes))
    app.state.open_mode._checked_at = -1e9  # re-check at once: the server is no longer open
    return secret


@pytest.fixture
def tokens(app, client) -> dict[str, str]:
    return {scope: make_token(app, scope) for scope in ("ingest", "read", "admin")}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def new_run(client, name="run-1", **extra) -> dict:
    r = client.post("/api/v1/runs", json={"name": name, **extra})
    assert r.status_code == 200, r.text
    return r.json()
