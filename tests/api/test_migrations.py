import uuid

import pytest
from sqlalchemy import create_engine, inspect, text

from backend import migrate
from backend.models import Base
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


@pytest.mark.postgres
def test_postgresql_round_trip():
    name = f"paritywatch_mig_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        _round_trip(PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}")
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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
