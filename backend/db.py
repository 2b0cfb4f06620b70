"""Engine, sessions and the one write path per database.

SQLite: WAL, a busy timeout, foreign keys, and writers funnelled through one lock per process so
threads queue in Python instead of failing with "database is locked".
PostgreSQL: a normal pool; concurrency is the server's job.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def normalise_url(url: str) -> str:
    """Accept plain postgres URLs and use psycopg 3 for them."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def dialect_of(url: str) -> str:
    return make_url(normalise_url(url)).get_backend_name()


def _prepare_sqlite_connection(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL: a crash loses no committed txn
    cur.close()


def make_engine(url: str) -> Engine:
    url = normalise_url(url)
    if dialect_of(url) == "sqlite":
        path = make_url(url).database
        if path and path != ":memory:":
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=16,
            max_overflow=16,
        )
        event.listen(engine, "connect", _prepare_sqlite_connection)
        # Writers take the database lock at BEGIN (IMMEDIATE): no read->write upgrade that
        # fails at once across processes. Readers stay DEFERRED and run beside them (WAL).
        @event.listens_for(engine, "begin")
        def _begin(conn):  # noqa: ANN001
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

        event.listen(engine, "connect", _disable_pysqlite_begin)
        return engine
    return create_engine(url, pool_size=20, max_overflow=20, pool_pre_ping=True)


def _disable_pysqlite_begin(dbapi_conn, _record) -> None:
    # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's own BEGIN is lazy).
    dbapi_conn.isolation_level = None


class Database:
    """Owns the engine; every store call goes through `read()` or `write()`."""

    def __init__(self, url: str):
        self.url = normalise_url(url)
        self.dialect = dialect_of(self.url)
        self.engine = make_engine(self.url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_lock = threading.Lock() if self.dialect == "sqlite" else None

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction, committed on success, rolled back whole on any error."""
        if self._write_lock is None:
            with self._sessions.begin() as session:
                yield session
            return
        with self._write_lock:
            with self._sessions.begin() as session:
                session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
                yield session

    def dispose(self) -> None:
        self.engine.dispose()
