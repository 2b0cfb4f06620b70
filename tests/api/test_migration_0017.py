"""Migration 0017: on PostgreSQL, metric_rollups pages keep room for the updates every batch makes
(fillfactor 70), so most are HOT updates: no new primary-key entry per update. Down again: the
default. A fresh database built from the models gets the same setting."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from paritywatch.backend import migrate
from paritywatch.backend.db import make_engine
from paritywatch.backend.models import Base
from tests.api.test_migrations import empty_postgresql_db

pytestmark = pytest.mark.postgres


def _options(url: str) -> list | None:
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            return c.scalar(text("SELECT reloptions FROM pg_class WHERE relname = 'metric_rollups'"))
    finally:
        engine.dispose()


def test_0017_leaves_room_on_rollup_pages_and_gives_it_back():
    with empty_postgresql_db() as url:
        migrate.upgrade(url, "0016")
        assert _options(url) is None
        migrate.upgrade(url)
        assert _options(url) == ["fillfactor=70"]
        migrate.downgrade(url, "0016")
        assert _options(url) is None


def test_the_models_ask_for_the_same_fillfactor():
    with empty_postgresql_db() as url:
        engine = make_engine(url)
        try:
            Base.metadata.create_all(engine)
        finally:
            engine.dispose()
        assert _options(url) == ["fillfactor=70"]
