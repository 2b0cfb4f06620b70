"""Migration 0015: audited samples gain the identity, truncation, eos and image columns, and
audited batches a `failing` count that `?failing=true` reads; batches stored before it get theirs
from the two causes they had. The downgrade removes exactly what it added. SQLite and PostgreSQL."""
from __future__ import annotations

from sqlalchemy import inspect, text

from paritywatch.backend import migrate
from paritywatch.backend.db import make_engine
from tests.api.test_migrations import empty_db_url  # noqa: F401 - the fixture (sqlite and postgresql)

NEW_SAMPLE_COLUMNS = {"n_trainer_ids", "ids_mismatch", "ids_first_diff", "truncated", "finish_lost", "eos_ignored_at",
                      "images_mismatch", "rollout_images", "trainer_images"}
BATCHES = {1: (0, 0), 2: (3, 1), 3: (1, 7)}  # id: (length_mismatches, rerender_mismatches)


def columns(url: str, table: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def test_0015_adds_the_columns_backfills_failing_and_goes_back(empty_db_url):  # noqa: F811
    url = empty_db_url
    migrate.upgrade(url, "0012")
    engine = make_engine(url)
    now = "2026-12-03 09:00:00"
    with engine.begin() as c:
        c.execute(text("INSERT INTO runs (id, project, name, tags, config, created_at, control_state, control_version, "
                       f"control_updated_at, on_mismatch) VALUES (1, 'p', 'r', '{{}}', '{{}}', '{now}', 'running', 1, '{now}', 'pause')"))
        for audit_id, (length, rerender) in BATCHES.items():
            c.execute(text("INSERT INTO sample_audits (id, run_id, client_id, seq, received_at, samples, "
                           "length_mismatches, rerender_mismatches, truncated, counts) VALUES "
                           "(:id, 1, 'c', :id, :now, 8, :length, :rerender, 0, '{}')"),
                      {"id": audit_id, "now": now, "length": length, "rerender": rerender})
        c.execute(text("INSERT INTO sample_audit_samples (audit_id, run_id, rank, sample_index, finish, n_ids, "
                       "length_mismatch, prompt_len, windows) VALUES (2, 1, 0, 5, 'eos', 10, true, 4, '[]')"))
    migrate.upgrade(url)
    assert NEW_SAMPLE_COLUMNS <= columns(url, "sample_audit_samples") and "failing" in columns(url, "sample_audits")
    with engine.connect() as c:
        assert dict(c.execute(text("SELECT id, failing FROM sample_audits ORDER BY id")).all()) == {1: 0, 2: 3, 3: 7}
        row = c.execute(text("SELECT truncated, finish_lost, ids_mismatch, rollout_images FROM sample_audit_samples")).one()
        assert (bool(row[0]), bool(row[1]), row[2], row[3]) == (False, False, None, None)
    engine.dispose()
    migrate.downgrade(url, "0012")
    assert not NEW_SAMPLE_COLUMNS & columns(url, "sample_audit_samples")
    assert "failing" not in columns(url, "sample_audits")
    migrate.upgrade(url)  # and up again
    assert NEW_SAMPLE_COLUMNS <= columns(url, "sample_audit_samples")
