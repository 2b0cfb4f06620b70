"""Whether a chunk's points are in the level-1 roll-ups is stored per chunk (`in_level1`), not
derived from its count: a series holding chunks written under another DENSE_CHUNK (0011's 256:
chunks of 16..255 points in level 1) beside today's (16: those same sizes outside it) still
counts every point once, in reads at every bucket width and through retention. On SQLite and
PostgreSQL."""
from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from paritywatch.backend.db import Database
from paritywatch.backend.models import Run
from paritywatch.backend.store import metric_packing
from paritywatch.backend.store.metrics import MetricStore, prepare_batch
from paritywatch.backend.store.retention import RowRemover
from tests.api.test_series_ties import brute_force

SIZES = [1, 7, 15, 16, 40, 100, 255, 256, 300, 900]  # around both thresholds


@pytest.fixture
def db(db_url):
    database = Database(db_url)
    yield database
    database.dispose()


def new_run(db: Database) -> int:
    with db.write() as s:
        run = Run(name="level1", project="p")
        s.add(run)
        s.flush()
        return run.id


def write_both_eras(db: Database, monkeypatch, seed: int, overlap: bool) -> tuple[int, list]:
    """A run whose series "s" mixes batches packed under DENSE_CHUNK 256 and 16, each size in
    SIZES under both; `overlap`: some batches rewrite steps already written. Returns the run and
    every point in write order."""
    run_id, store, rng = new_run(db), MetricStore(db), random.Random(seed)
    written, step = [], 0
    batches = [(n, dense) for n in SIZES for dense in (256, 16)] * 2
    rng.shuffle(batches)
    for seq, (n, dense_chunk) in enumerate(batches):
        start = rng.randrange(max(step - 600, 0), step + 1) if overlap and rng.random() < 0.4 else step
        steps = list(range(start, start + 2 * n, 2))  # every other step: buckets mix batches
        step = max(step, steps[-1] + 1 + rng.choice([0, 5]))
        vals = [round(rng.uniform(-10, 10), 3) for _ in steps]
        with monkeypatch.context() as m:
            m.setattr(metric_packing, "DENSE_CHUNK", dense_chunk)
            batch = prepare_batch(steps, {"s": vals}, 10_000, 200)
        store.ingest(run_id, "c", seq, batch)
        written += list(zip(steps, vals))
    return run_id, written


def flags(db: Database) -> set[tuple[int, bool]]:
    with db.read() as s:
        return {(n, bool(f)) for n, f in s.execute(text("SELECT count, in_level1 FROM metric_chunks"))}


def assert_reads_match(db: Database, run_id: int, written, reads) -> None:
    store = MetricStore(db)
    for points, lo, hi in reads:
        with db.read() as s:
            got = store.series(s, run_id, "s", points, lo, hi)
        in_range = [p for p in written if lo <= p[0] <= hi]
        expected = sorted(brute_force(in_range, got["origin"], got["bucket_width"]).items())
        b, where = got["buckets"], f"points={points} [{lo}, {hi}] width={got['bucket_width']}"
        assert b["count"] == [e[4] for _, e in expected], where
        assert b["min"] == [e[0] for _, e in expected], where
        assert b["max"] == [e[1] for _, e in expected], where
        assert b["last"] == [e[3] for _, e in expected], where


@pytest.mark.parametrize("seed", [0, 1])
def test_reads_count_chunks_of_either_threshold_once(db, monkeypatch, seed):
    run_id, written = write_both_eras(db, monkeypatch, seed, overlap=True)
    # chunks of 16..255 points are in level 1 under one threshold and not under the other
    assert {(16, True), (16, False), (255, True), (255, False), (15, True), (300, False)} <= flags(db)
    hi = max(p[0] for p in written)
    # points -> bucket width: raw, 16..240 (level 1 and dense chunks' raw points), 256+, 4096+
    assert_reads_match(db, run_id, written, [(50_000, 0, hi), (600, 0, hi), (300, 0, hi), (100, 0, hi),
                                             (2, 0, hi), (333, 17, 10_001), (61, 4_000, 8_300)])


def test_retention_folds_only_chunks_outside_level1(db, monkeypatch):
    # no equal steps: prune_some lets a pruned chunk win a tie with level 1, even over a later point (known)
    run_id, written = write_both_eras(db, monkeypatch, 2, overlap=False)
    store = MetricStore(db)
    with db.read() as s:
        whole = store.series(s, run_id, "s", 50, None, None)
        sid = s.execute(text("SELECT id FROM metric_keys")).scalar()
        batch_ids = list(s.execute(text("SELECT id FROM ingest_batches ORDER BY id")).scalars())
    remover = RowRemover(db, store)
    while remover.prune_some(sid, batch_ids[len(batch_ids) * 2 // 3], 3)[0]:  # small steps, as the janitor
        pass
    with db.read() as s:
        floor = s.execute(text("SELECT raw_floor FROM metric_keys")).scalar()
        level1 = s.execute(text("SELECT sum(count) FROM metric_rollups WHERE level = 1")).scalar()
        raw_outside = s.execute(text("SELECT coalesce(sum(count), 0) FROM metric_chunks WHERE NOT in_level1")).scalar()
    assert level1 + raw_outside == len(written)  # every point in level 1 or in a raw chunk outside it, once
    with db.read() as s:
        assert store.series(s, run_id, "s", 50, None, None)["buckets"] == whole["buckets"]
    # from below the raw floor reads come from roll-ups (and dense chunks' raw points), exact per
    # bucket; ranges end on the 16-step grid, which such reads widen to
    below, hi = floor // 16 * 16 - 1, max(p[0] for p in written)
    assert_reads_match(db, run_id, written, [(1000, 0, below), (200, 0, below), (1000, 0, hi)])
