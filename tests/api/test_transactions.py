"""The store's convention (docs/design.md, "The store and its transactions"): an answer is one
transaction, begun at its first statement, so work before it holds no transaction and, on SQLite,
not the single writer."""
from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace
from typing import Iterator

import anyio
import pytest
from sqlalchemy import event, text
from starlette.concurrency import run_in_threadpool

from paritywatch.backend.api.deps import write_session
from paritywatch.backend.db import Database
from paritywatch.backend.store import runs as run_store
from tests.api.conftest import new_run
from tests.support.live import wait_for


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



def test_an_answer_ends_its_transaction_while_every_route_thread_waits_for_it(client, app):
    """An answer holds the run (SQLite: the single writer; PostgreSQL: the run's row) and every
    thread of the routes' pool waits for it (one thread here; 40 heartbeats queued behind the
    group-commit writer in bench/alerts.py's 256 workers). Its transaction still ends, and the
    waiters go on: ending never waits for a thread of that pool (it did: a deadlock)."""
    run_id = new_run(client)["id"]
    db = app.state.db

    def the_run_in_another_transaction() -> None:
        with db.write() as other:
            run_store.lock_run(other, run_id)

    async def scenario() -> None:
        routes_pool = anyio.to_thread.current_default_thread_limiter()
        routes_pool.total_tokens = 1
        answer = write_session(SimpleNamespace(app=app))
        s = await answer.__anext__()
        await run_in_threadpool(run_store.lock_run, s, run_id)
        waiter = asyncio.ensure_future(run_in_threadpool(the_run_in_another_transaction))
        while routes_pool.borrowed_tokens < 1:  # the pool's one thread is waiting for the answer
            await asyncio.sleep(0.01)
        try:
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(answer.__anext__(), timeout=30)
        except TimeoutError:
            s.close()  # end it here, so that the test fails instead of hanging
            await waiter
            pytest.fail("the answer's transaction never ended: its end waited for the threads that waited for it")
        await asyncio.wait_for(waiter, timeout=30)

    asyncio.run(scenario())


def test_a_route_ends_its_transaction_before_its_answer_needs_another_thread(client, app):
    """Registrations wait for the run (SQLite: the single writer; PostgreSQL: the run's row) and
    hold every thread of the routes' pool (two here; 40 in production, taken by 200 workers
    registering at once in bench/alerts.py), one more waits for a thread. FastAPI validates a
    plain `def` route's answer on another thread of that pool: had the first registration kept
    its transaction until then, it would wait for a thread held by the registrations waiting for
    it, and the server would stop answering (it did). Each answer comes back."""
    app.state.open_mode.ttl_s = 3600  # open mode's check, cached: no thread of its own per request
    run_id = new_run(client)["id"]
    pool = client.portal.call(anyio.to_thread.current_default_thread_limiter)
    client.portal.call(setattr, pool, "total_tokens", 2)
    answers: dict[str, int] = {}

    def register(worker: str) -> None:
        answers[worker] = client.post(f"/api/v1/runs/{run_id}/components",
                                      json={"side": "rollout", "worker_id": worker, "host": "h", "pid": 1}).status_code

    registrations = [threading.Thread(target=register, args=(f"w{i}",), daemon=True) for i in range(3)]
    with app.state.db.write() as held:
        run_store.lock_run(held, run_id)
        for thread in registrations:
            thread.start()
        wait_for(lambda: pool.borrowed_tokens == 2 and pool.statistics().tasks_waiting == 1, timeout_s=30)
    deadline = time.monotonic() + 30
    for thread in registrations:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in registrations):
        client.portal.call(setattr, pool, "total_tokens", 40)  # let them through: fail, do not hang
        for thread in registrations:
            thread.join()
        pytest.fail("the server stopped answering: an answer held its transaction while it waited for a thread")
    assert answers == {"w0": 200, "w1": 200, "w2": 200}
