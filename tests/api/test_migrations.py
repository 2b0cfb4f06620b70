import contextlib
import random
import uuid

import pytest
from sqlalchemy import create_engine, inspect, text

from paritywatch.backend import migrate
from paritywatch.backend.models import Base
from tests.conftest import PG_ADMIN_URL


def _round_trip(url: str) -> None:
    assert migrate.current_revision(url) is None
    migrate.upgrade(url)
    assert migrate.current_revision(url) == migrate.head_revision()
    engine = create_engine(migrate.alembic_config(url).get_main_option("sqlalchemy.url").replace("%%", "%"))
    tables = set(inspect(engine).get_table_names())
    engine.dispose()
    assert set(Base.metadata.tables) <= tables
    migrate.downgrade(url, "base")
    assert migrate.current_revision(url) is None
    migrate.upgrade(url)
    assert migrate.current_revision(url) == migrate.head_revision()


def test_sqlite_round_trip(tmp_path):
    _round_trip(f"sqlite:///{tmp_path / 'm.db'}")


@contextlib.contextmanager
def empty_postgresql_db():
    name = f"paritywatch_mig_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.mark.postgres
def test_postgresql_round_trip():
    with empty_postgresql_db() as url:
        _round_trip(url)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'data.db'}"
    else:
        with empty_postgresql_db() as url:
            yield url


def test_level1_rollups_are_rebuilt_both_ways_and_reads_do_not_change(empty_db_url):
    """0002 changes what level-1 roll-ups hold (sparse chunks only); a series written under
    either meaning reads the same buckets after the upgrade, and the downgrade restores 0001's."""
    from paritywatch.backend.db import Database, make_engine
    from paritywatch.backend.models import Run
    from paritywatch.backend.store.metrics import MetricStore, prepare_batch

    url = empty_db_url
    migrate.upgrade(url)
    db = Database(url)
    with db.write() as s:
        run = Run(name="mig", project="p")
        s.add(run)
        s.flush()
        run_id = run.id
    rng = random.Random(7)
    store, step, total = MetricStore(db), 0, 0
    for seq in range(40):  # dense and sparse batches of one series, interleaved
        n = rng.choice([1, 7, 40, 300, 900])
        steps = list(range(step, step + n))
        step += n + rng.choice([0, 3])
        store.ingest(run_id, "c", seq, prepare_batch(steps, {"s": [rng.uniform(-1, 1) for _ in steps]}, 10_000, 200))
        total += n
    with db.read() as s:
        sparse_points = s.execute(text("SELECT sum(count) FROM metric_chunks WHERE in_level1")).scalar()
        under_256 = s.execute(text("SELECT sum(count) FROM metric_chunks WHERE count < 256")).scalar()
    ranges = [(None, None, 1000), (100, 9_000, 300), (0, step, 500)]

    def reads(database) -> list:
        with database.read() as s:
            return [MetricStore(database).series(s, run_id, "s", n, lo, hi) for lo, hi, n in ranges]

    def level1_count() -> int:
        engine = make_engine(url)
        with engine.connect() as c:
            got = c.execute(text("SELECT coalesce(sum(count), 0) FROM metric_rollups WHERE level = 1")).scalar()
        engine.dispose()
        return int(got)

    before = reads(db)
    assert all(r["bucket_width"] < 256 for r in before[1:])  # these reads use level 1
    assert sum(sum(r["buckets"]["count"]) for r in before[:1]) == total
    db.dispose()
    assert 0 < level1_count() == sparse_points < under_256 < total

    migrate.downgrade(url, "0001")
    assert level1_count() == total  # 0001: every point in level 1
    migrate.upgrade(url)
    assert level1_count() == under_256  # 0002 rebuilds level 1 from these, 0012 flags them so
    db = Database(url)
    try:
        assert reads(db) == before
    finally:
        db.dispose()


def test_models_match_migrations(tmp_path):
    """A model change without a migration fails here (autogenerate finds nothing to do)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    url = f"sqlite:///{tmp_path / 'diff.db'}"
    migrate.upgrade(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []
