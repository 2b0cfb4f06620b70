"""Migration 0016: metric batches and audits idempotent per run. Existing ledger rows, audits and
their samples survive (SQLite copies the tables: the samples must not cascade away), get no
digest, and the same (client_id, seq) may then be stored for another run."""
from __future__ import annotations

from sqlalchemy import text

from paritywatch.backend import migrate
from paritywatch.backend.db import make_engine
from tests.api.test_migrations import empty_db_url  # noqa: F401 - the fixture (sqlite and postgresql)

NOW = "2026-12-03 09:00:00"


def _run(c, run_id: int) -> None:
    c.execute(text("INSERT INTO runs (id, project, name, tags, config, created_at, control_state, control_version, "
                   f"control_updated_at, on_mismatch) VALUES ({run_id}, 'p', 'r{run_id}', '{{}}', '{{}}', '{NOW}', "
                   f"'running', 1, '{NOW}', 'pause')"))


def _batch(c, batch_id: int, run_id: int, client_id: str, seq: int) -> None:
    c.execute(text("INSERT INTO ingest_batches (id, run_id, client_id, seq, points, received_at) "
                   f"VALUES ({batch_id}, {run_id}, '{client_id}', {seq}, 1, '{NOW}')"))


def _audit(c, audit_id: int, run_id: int, client_id: str, seq: int) -> None:
    c.execute(text("INSERT INTO sample_audits (id, run_id, client_id, seq, received_at, samples, length_mismatches, "
                   f"rerender_mismatches, truncated, counts, failing) VALUES ({audit_id}, {run_id}, '{client_id}', "
                   f"{seq}, '{NOW}', 4, 1, 0, 0, '{{}}', 1)"))


def test_0016_keys_the_ledgers_per_run_and_keeps_every_row(empty_db_url):  # noqa: F811
    url = empty_db_url
    migrate.upgrade(url, "0015")
    engine = make_engine(url)
    with engine.begin() as c:
        _run(c, 1)
        _run(c, 2)
        _batch(c, 10, 1, "w0", 0)
        _audit(c, 20, 1, "w0", 0)
        for i in range(3):
            c.execute(text("INSERT INTO sample_audit_samples (id, audit_id, run_id, rank, sample_index, finish, n_ids, "
                           f"length_mismatch, prompt_len, windows) VALUES ({30 + i}, 20, 1, {i}, {i}, 'eos', 5, "
                           f"{'true' if i == 0 else 'false'}, 3, '[]')"))
    engine.dispose()

    migrate.upgrade(url, "0016")
    engine = make_engine(url)
    with engine.begin() as c:
        assert c.execute(text("SELECT id, run_id, digest FROM ingest_batches")).all() == [(10, 1, None)]
        assert c.execute(text("SELECT id, run_id, digest FROM sample_audits")).all() == [(20, 1, None)]
        assert [r[0] for r in c.execute(text("SELECT id FROM sample_audit_samples ORDER BY id"))] == [30, 31, 32]
        _batch(c, 11, 2, "w0", 0)  # the same client and seq, another run
        _audit(c, 21, 2, "w0", 0)
    with engine.connect() as c:
        try:
            _batch(c, 12, 2, "w0", 0)  # the same run: still one
            raise AssertionError("a second (run, client_id, seq) was stored")
        except Exception as exc:
            assert "unique" in str(exc).lower()
    with engine.begin() as c:  # the downgrade's old key cannot hold both runs' rows
        c.execute(text("DELETE FROM ingest_batches WHERE id = 11"))
        c.execute(text("DELETE FROM sample_audits WHERE id = 21"))
    engine.dispose()

    migrate.downgrade(url, "0015")
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            assert [r[0] for r in c.execute(text("SELECT id FROM sample_audit_samples ORDER BY id"))] == [30, 31, 32]
            assert c.execute(text("SELECT count(*) FROM ingest_batches")).scalar() == 1
    finally:
        engine.dispose()
