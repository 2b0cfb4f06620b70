"""Engine, sessions and the one write path per database.

SQLite: WAL, a busy timeout, foreign keys, and writers funnelled through one lock per process so
threads queue in Python instead of failing with "database is locked".
PostgreSQL: a normal pool for sessions; concurrency is the server's job.
Both: metric batches (`run_raw`) go through one group-commit writer thread per process.
"""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("paritywatch.db")
GROUP_MAX = 64  # most jobs one group-commit transaction takes
CHECKPOINT_EVERY_S = 0.2  # SQLite group writer: WAL checkpoint cadence while there are commits


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
            _create_private_file(Path(path).expanduser())
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
        def _begin(conn):
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

        event.listen(engine, "connect", _disable_pysqlite_begin)
        return engine
    return create_engine(url, pool_size=20, max_overflow=20, pool_pre_ping=True)


def _create_private_file(path: Path) -> None:
    """Create the SQLite file owner-only (0600) before SQLite does with the umask's mode: it holds
    token hashes and webhook data. SQLite gives its -wal and -shm files the database's mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass


def _disable_pysqlite_begin(dbapi_conn, _record) -> None:
    # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's own BEGIN is lazy).
    dbapi_conn.isolation_level = None


@dataclass(frozen=True)
class FirstThen:
    """A job whose first statement needs nothing the job computes: on PostgreSQL the group writer
    sends the first statements of a group's jobs together (psycopg's pipeline mode: one round trip
    for the group, where each was a round trip of the one writer), then runs each job's `then`
    with the cursor holding its first statement's result. Called as a plain job, it runs the
    statement and `then` in turn."""
    sql: str
    params: tuple
    then: Callable[[Any, Any], Any]  # (cursor, the first statement's cursor) -> the job's result

    def __call__(self, cur) -> Any:
        cur.execute(self.sql, self.params)
        return self.then(cur, cur)


class Database:
    """Owns the engine; every store call goes through `read()` or `write()`."""

    def __init__(self, url: str):
        self.url = normalise_url(url)
        self.dialect = dialect_of(self.url)
        self.engine = make_engine(self.url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_lock = threading.Lock() if self.dialect == "sqlite" else None
        if self._write_lock is None:
            self._write_sessions = self._sessions
        else:  # BEGIN IMMEDIATE, under the process's write lock, at the session's first statement
            self._write_sessions = sessionmaker(self.engine.execution_options(sqlite_begin="IMMEDIATE"),
                                                expire_on_commit=False)
            event.listen(self._write_sessions, "after_transaction_create", self._lock_writer)
            event.listen(self._write_sessions, "after_transaction_end", self._unlock_writer)
        self._group: _GroupWriter | None = None
        self._group_init = threading.Lock()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction, committed on success, rolled back whole on any error.

        It begins at the session's first statement, not here: on SQLite the process's write lock
        and BEGIN IMMEDIATE are taken then and held to the commit, so what a caller does before
        its first statement (validating a body, hashing it, resolving a webhook's host) never
        holds the single writer."""
        with self._write_sessions() as session:
            yield session
            if session.in_transaction():
                session.commit()

    def _lock_writer(self, _session: Session, transaction) -> None:
        if transaction.parent is None:  # the outer transaction; SAVEPOINTs nest inside it
            self._write_lock.acquire()

    def _unlock_writer(self, _session: Session, transaction) -> None:
        if transaction.parent is None:
            self._write_lock.release()

    def run_raw(self, job: Callable[[Any], Any]) -> Any:
        """Run `job(cursor)` on a driver cursor, all or nothing, and return its result once
        committed (its exception, with nothing written, if it raised).

        Jobs go to one writer thread per process that commits several per transaction (group
        commit). A failing job never poisons others: the group is rolled back and run again with
        each job inside its own SAVEPOINT, so the failing one rolls back alone. A job may therefore
        run twice: it must act only through the cursor and `merge_at_commit`. SQLite: one commit
        (and no lock hand-offs) for many batches. PostgreSQL: one WAL flush for many batches, and
        the rows every batch of a run updates (its series' stats, its last step) are locked by one
        transaction at a time instead of by a convoy. A `FirstThen` job's first statement is sent
        with the group's others.
        """
        return self._group_writer().submit(job).result()

    def merge_at_commit(self, cur, flush: Callable[[Any, list], None], rows: list) -> None:
        """Write `rows` with `flush(cur, rows)`: rows a group writes better all at once (a batch's
        chunks: one statement, not one round trip a batch) or that many batches of one group write
        to the same few rows (a series' roll-up buckets, its stats, the run's last step). Inside a
        group-commit job they are staged, and `flush` runs once for the whole group just before its
        commit, with every successful job's rows in job order (a failed job stages nothing):
        PostgreSQL writes a new row version per UPDATE, and 64 jobs merging into one bucket made 64
        versions of it a transaction (the load bench: 10k points/s on PostgreSQL against 60k on
        SQLite). Anywhere else, at once."""
        group = self._group
        if group is None or not group.stage(flush, rows):
            flush(cur, rows)

    async def run_raw_async(self, job: Callable[[Any], Any]) -> Any:
        """`run_raw` for the event loop: awaits the commit without holding a thread (the ingest
        route: a thread parked per in-flight batch cost more than the write)."""
        return await asyncio.wrap_future(self._group_writer().submit(job))

    def _group_writer(self) -> "_GroupWriter":
        group = self._group
        if group is None:
            with self._group_init:
                if self._group is None:
                    self._group = _GroupWriter(self)
                group = self._group
        return group

    def writer_backlog(self) -> int:
        """Jobs (metric batches) waiting for the group-commit writer; 0 when it is idle. Lets
        background work (backend/background/janitor.py) step aside while ingest is busy."""
        group = self._group
        return group.jobs.qsize() if group is not None else 0

    def dispose(self) -> None:
        if self._group is not None:
            self._group.stop()
            self._group = None
        self.engine.dispose()


class _GroupWriter:
    """Group commit: one thread drains queued jobs, up to GROUP_MAX a transaction. On SQLite it
    holds the process's write lock (so ORM writers in this process queue behind it as before)."""

    def __init__(self, db: Database):
        self.db = db
        self.sqlite = db.dialect == "sqlite"
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="paritywatch-group-commit", daemon=True)
        self._staged: dict[Callable, list] | None = None  # merge_at_commit's rows of the running job
        # SQLite: WAL checkpoints (which fsync the database file) run beside the writer, not
        # inside its commits: its connection has auto-checkpoint off, this thread checkpoints
        # (PASSIVE: never blocks the writer or readers) whenever there were commits. Other
        # connections keep SQLite's default auto-checkpoint.
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self.checkpointer = threading.Thread(target=self._checkpoint_loop, name="paritywatch-checkpoint", daemon=True)
        self.thread.start()
        if self.sqlite:
            self.checkpointer.start()

    def _checkpoint_loop(self) -> None:
        conn = None
        while not self._stopping.is_set():
            self._dirty.wait(1.0)
            if self._stopping.wait(CHECKPOINT_EVERY_S) or not self._dirty.is_set():
                continue
            self._dirty.clear()
            try:
                if conn is None:
                    conn = self.db.engine.raw_connection()
                conn.cursor().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except Exception:
                log.warning("WAL checkpoint failed", exc_info=True)
                if conn is not None:
                    conn.invalidate()
                    conn = None
        if conn is not None:
            conn.close()

    def stage(self, flush: Callable[[Any, list], None], rows: list) -> bool:
        """Stage rows for the group's commit; False when not called from a job of this writer."""
        if self._staged is None or threading.current_thread() is not self.thread:
            return False
        self._staged.setdefault(flush, []).extend(rows)
        return True

    def submit(self, job: Callable[[Any], Any]) -> Future:
        fut: Future = Future()
        self.jobs.put((job, fut))
        return fut

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=10)
        self._stopping.set()
        self._dirty.set()
        if self.checkpointer.is_alive():
            self.checkpointer.join(timeout=10)

    def _loop(self) -> None:
        conn = None
        stopping = False
        while not stopping:
            item = self.jobs.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < GROUP_MAX:
                try:
                    item = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            # A request cancelled while its job waited (run_raw_async's caller went away) is
            # dropped, never written half-answered; a running job can no longer be cancelled.
            batch = [(job, fut) for job, fut in batch if fut.set_running_or_notify_cancel()]
            if not batch:
                continue
            try:
                if conn is None:
                    conn = self.db.engine.raw_connection()
                    if self.sqlite:
                        conn.cursor().execute("PRAGMA wal_autocheckpoint=0").fetchall()
                self._run_group(conn, batch)
                self._dirty.set()
            except BaseException as exc:  # connection-level trouble: fail this group, start afresh
                log.warning("group commit failed", exc_info=True)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if conn is not None:
                    try:
                        conn.invalidate()
                    except Exception:
                        pass
                    conn = None
        if conn is not None:
            if self.sqlite:
                conn.cursor().execute("PRAGMA wal_autocheckpoint=1000").fetchall()  # back to the default
            conn.close()
        while True:  # anything queued after stop() fails rather than hangs
            try:
                item = self.jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_exception(RuntimeError("database is closed"))

    def _run_group(self, conn, batch: list) -> None:
        """Commit the jobs of `batch` in one transaction, then answer them. Tried first with no
        savepoints (two round trips a job on PostgreSQL, a fifth of the writer's time under the
        load bench); a job that raises rolls the whole try back, and the group runs again with a
        savepoint around each job, so the failing one alone is undone."""
        cur = conn.cursor()
        try:
            with self.db._write_lock or nullcontext():
                outcomes = self._try_group(conn, cur, batch, savepoints=False)
                if outcomes is None:
                    outcomes = self._try_group(conn, cur, batch, savepoints=True)
        finally:
            cur.close()
        for fut, ok, value in outcomes:  # answered only once committed
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def _try_group(self, conn, cur, batch: list, savepoints: bool) -> list | None:
        """Run and commit the group: [(future, ok, result or exception)]; None, with everything
        rolled back, when a job raised and there were no savepoints to undo it alone."""
        outcomes: list = []
        if self.sqlite:
            cur.execute("BEGIN IMMEDIATE")
        # (psycopg opens the transaction itself with the first statement)
        try:
            firsts = {} if savepoints or self.sqlite else self._send_firsts(conn, batch)
            if firsts is None:
                return None
            merges: dict[Callable, list] = {}
            for i, (job, fut) in enumerate(batch):
                if savepoints:
                    cur.execute("SAVEPOINT pw_job")
                self._staged = {}
                try:
                    first = firsts.get(i)
                    outcomes.append((fut, True, job.then(cur, first) if first is not None else job(cur)))
                    for flush, rows in self._staged.items():
                        merges.setdefault(flush, []).extend(rows)
                except Exception as exc:  # this job only: undo its statements
                    if not savepoints:
                        conn.rollback()
                        return None
                    cur.execute("ROLLBACK TO SAVEPOINT pw_job")
                    outcomes.append((fut, False, exc))
                finally:
                    self._staged = None
                if savepoints:
                    cur.execute("RELEASE SAVEPOINT pw_job")
            # A failure here fails the whole group. PostgreSQL: the merged writes and the commit go
            # out in one pipeline (they need no answer; each was a round trip of the one writer).
            with nullcontext() if self.sqlite else conn.driver_connection.pipeline():
                for flush, rows in merges.items():
                    flush(cur, rows)
                conn.commit()
        except BaseException:
            conn.rollback()
            raise
        return outcomes

    @staticmethod
    def _send_firsts(conn, batch: list) -> dict[int, Any] | None:
        """{job index: cursor with its first statement's result} for the group's FirstThen jobs,
        sent in one pipeline; None, with the transaction rolled back, when one of them failed."""
        jobs = [(i, job) for i, (job, _) in enumerate(batch) if isinstance(job, FirstThen)]
        if not jobs:
            return {}
        firsts = {i: conn.cursor() for i, _ in jobs}
        try:
            with conn.driver_connection.pipeline():
                for i, job in jobs:
                    firsts[i].execute(job.sql, job.params)
        except Exception:
            conn.rollback()
            return None
        return firsts
