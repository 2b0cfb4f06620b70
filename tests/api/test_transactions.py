"""The store's convention (docs/design.md, "The store and its transactions"): an answer is one
transaction, begun at its first statement, so work before it holds no transaction and, on SQLite,
not the single writer."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterator

import pytest
from sqlalchemy import event, text

from paritywatch.backend.db import Database
from tests.api.conftest import new_run


@pytest.fixture
def settings(settings):
    """No background workers: their sweeps and polls would begin transactions of their own."""
    return settings.model_copy(update={"run_background_workers": False})


@contextmanager
def transactions_begun(app) -> Iterator[list]:
    begun: list = []

    def on_begin(conn) -> None:
        begun.append(conn)
    event.listen(app.state.db.engine, "begin", on_begin)
    try:
        yield begun
    finally:
        event.remove(app.state.db.engine, "begin", on_begin)


def test_a_list_answer_reads_in_one_transaction(client, app):
    for name in ("a", "b"):
        run = new_run(client, name)
        client.post(f"/api/v1/runs/{run['id']}/components",
                    json={"side": "trainer", "worker_id": "t0", "host": "h", "pid": 1})
    app.state.open_mode.ttl_s = 3600  # open mode's "no token yet" check: cached, not a read of its own
    client.get("/api/v1/runs")
    with transactions_begun(app) as begun:
        answer = client.get("/api/v1/runs")
    assert answer.status_code == 200 and len(answer.json()["runs"]) == 2
    assert len(begun) == 1  # runs, their processes, alert counts, packs and taint: one read


def test_a_write_answer_is_one_transaction(client, app):
    app.state.open_mode.ttl_s = 3600
    run = new_run(client)
    with transactions_begun(app) as begun:
        answer = client.post("/api/v1/runs", json={"name": "run-2", "project": "p"})
    assert answer.status_code == 200 and answer.json()["id"] != run["id"]
    assert len(begun) == 1  # the run, its rules, and the answer's reads of it


@pytest.mark.parametrize("fails", [False, True])
def test_sqlite_takes_the_writer_at_the_first_statement_and_frees_it_at_the_end(sqlite_url, fails):
    db = Database(sqlite_url)
    lock = db._write_lock
    try:
        with pytest.raises(RuntimeError) if fails else nullcontext():
            with db.write() as s:
                assert not lock.locked()  # validation, hashing, DNS before the first statement: no writer held
                s.execute(text("SELECT 1"))
                assert lock.locked()
                if fails:
                    raise RuntimeError("rolled back")
        assert not lock.locked()
    finally:
        db.dispose()

