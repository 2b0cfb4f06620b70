"""Migration 0012: chunks record whether their points are in level 1. The upgrade flags stored
chunks by 0011's rule (under 256 points) and rebuilds nothing, so reads do not change; the
downgrade folds chunks under 256 points written outside level 1 into it, so 0011's rule holds
again and reads still do not change. On SQLite and PostgreSQL."""
from __future__ import annotations

import random

from sqlalchemy import inspect, text

from paritywatch.backend import migrate
from paritywatch.backend.db import Database, make_engine
from paritywatch.backend.models import Run
from paritywatch.backend.store import metric_packing
from paritywatch.backend.store.metrics import MetricStore, prepare_batch
from tests.api.test_migrations import empty_db_url  # noqa: F401 - the fixture (sqlite and postgresql)

OLD_DENSE_CHUNK = 256  # DENSE_CHUNK at 0011


def scalar(url: str, sql: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            return int(c.execute(text(sql)).scalar() or 0)
    finally:
        engine.dispose()


def chunk_columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("metric_chunks")}
    finally:
        engine.dispose()


def level1_points(url: str) -> int:
    return scalar(url, "SELECT sum(count) FROM metric_rollups WHERE level = 1")


def under_256_points(url: str) -> int:
    return scalar(url, f"SELECT sum(count) FROM metric_chunks WHERE count < {OLD_DENSE_CHUNK}")


def test_0012_keeps_what_every_read_returns_both_ways(empty_db_url, monkeypatch):  # noqa: F811
    url = empty_db_url
    migrate.upgrade(url)
    db = Database(url)
    with db.write() as s:
        run = Run(name="mig", project="p")
        s.add(run)
        s.flush()
        run_id = run.id
    rng, seq = random.Random(12), 0

    def write(steps: list[int]) -> None:
        nonlocal seq
        MetricStore(db).ingest(run_id, "c", seq, prepare_batch(steps, {"s": [rng.uniform(-1, 1) for _ in steps]},
                                                               10_000, 200))
        seq += 1

    # 0011-era data: what head writes with 0011's threshold is flagged as the upgrade flags it
    step = 0
    with monkeypatch.context() as m:
        m.setattr(metric_packing, "DENSE_CHUNK", OLD_DENSE_CHUNK)
        for n in [1, 7, 40, 100, 300, 900, 40, 7, 100, 1, 300]:
            write(list(range(step, step + n)))
            step += n + 3
    # whole series raw and at level 1, then ranges at 16..255-step buckets (level 1)
    ranges = [(None, None, 1000), (None, None, 30), (100, 3_000, 100), (0, step + 5_000, 200), (50, 1_500, 40),
              (100, 1_000, 50)]

    def reads() -> list:
        database = Database(url)
        try:
            with database.read() as s:
                return [MetricStore(database).series(s, run_id, "s", n, lo, hi) for lo, hi, n in ranges]
        finally:
            database.dispose()

    def flags_follow_0011() -> bool:
        return scalar(url, f"SELECT count(*) FROM metric_chunks WHERE in_level1 <> (count < {OLD_DENSE_CHUNK})") == 0

    old = reads()
    assert all(16 <= r["bucket_width"] < 256 for r in old[1:])
    assert flags_follow_0011() and 0 < level1_points(url) == under_256_points(url)
    migrate.downgrade(url, "0011")
    assert level1_points(url) == under_256_points(url)
    migrate.upgrade(url)
    assert flags_follow_0011() and reads() == old

    # head's threshold: chunks of 32..255 points outside level 1, some rewriting steps of level-1
    # chunks (equal last steps: the later write is the bucket's last, whichever side it is on)
    for n in [1, 7, 40, 100, 300, 900, 40, 7, 100]:
        write(list(range(step, step + n)))
        step += n + 3
    write(list(range(112, 152)))  # over a stored 100-point chunk in level 1 ...
    write([127, 143, 151])  # ... then a level-1 batch rewriting its buckets' last steps
    write([step + 15, step + 31])
    write(list(range(step, step + 40)))  # a batch outside level 1 rewriting them later
    step += 40
    db.dispose()
    assert level1_points(url) < under_256_points(url)
    new = reads()
    assert sum(new[0]["buckets"]["count"]) == scalar(url, "SELECT sum(count) FROM metric_chunks")
    migrate.downgrade(url, "0011")
    assert "in_level1" not in chunk_columns(url)
    assert level1_points(url) == under_256_points(url)  # 0011's rule again
    migrate.upgrade(url)  # reads as 0011 would (every chunk flagged by its count)
    assert flags_follow_0011() and reads() == new
