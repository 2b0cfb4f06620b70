"""Shared fixtures: one database per engine per test session, a clean state per test.

API tests run against SQLite and the PostgreSQL at 127.0.0.1:5432 (override with
PARITYWATCH_TEST_PG_URL; set it to "skip" to run SQLite only).
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from paritywatch.backend import migrate
from paritywatch.backend.db import Database
from paritywatch.backend.models import Base

# Webhook secrets are stored encrypted (backend/webhooks/secrets.py): servers started by tests,
# in this process or as subprocesses, share one throwaway key.
os.environ.setdefault("PARITYWATCH_SECRET_KEYS", "hbLq1eH2UQd3m5rFWC2p1gTQyqB8aYy4wuXj2wq6aEw=")

PG_ADMIN_URL = os.environ.get("PARITYWATCH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'paritywatch.db'}"
    migrate.upgrade(url)
    return url


@pytest.fixture(scope="session")
def postgresql_url():
    if PG_ADMIN_URL == "skip":
        pytest.skip("PostgreSQL tests disabled by PARITYWATCH_TEST_PG_URL=skip")
    name = f"paritywatch_test_{uuid.uuid4().hex[:10]}"
    # pre_ping: a dropped connection (a busy server) must not fail the DROP at the end.
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request) -> str:
    """A migrated, empty database of each engine (rows deleted before every test)."""
    url = request.getfixturevalue(f"{request.param}_url")
    _empty_all_tables(url)
    return url


def _empty_all_tables(url: str) -> None:
    db = Database(url)
    try:
        with db.write() as s:
            if db.dialect == "postgresql":
                names = ", ".join(t.name for t in Base.metadata.sorted_tables)
                s.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
            else:
                for table in reversed(Base.metadata.sorted_tables):
                    s.execute(table.delete())
    finally:
        db.dispose()


@pytest.fixture(autouse=True)
def _private_fingerprint_cache(monkeypatch, tmp_path_factory) -> None:
    """`paritywatch diff` / `fingerprint` cache folder fingerprints on disk: each test (and every
    process it starts) gets its own cache, so no test is answered from another's loads."""
    monkeypatch.setenv("PARITYWATCH_FINGERPRINT_CACHE", str(tmp_path_factory.mktemp("fingerprint-cache")))


# ---------------------------------------------------------------- the order of files across workers
DURATIONS = Path(__file__).with_name("durations.json")  # scripts/test_durations.py writes it
UNLISTED_FILE_S = 30.0  # a file not in it yet counts as a long one: a new e2e file is not left for last


def pytest_collection_modifyitems(config, items) -> None:
    """Under xdist (`make test`: whole files per worker, --no-loadscope-reorder), the longest files
    go first. xdist's own order (most tests first) left the e2e files, few tests of a minute each,
    to the end, where one ran alone for minutes while the other workers idled. Only the order
    changes: a stale figure costs time, never a result."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda item: -seconds.get(item.nodeid.partition("::")[0], UNLISTED_FILE_S))  # stable
