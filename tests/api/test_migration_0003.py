"""Migration 0003 both ways with data in the tables it alters: nothing is lost (a SQLite table copy
with foreign keys on would cascade-delete the rows pointing at `rules` and `webhooks`)."""
from __future__ import annotations

from sqlalchemy import text

from paritywatch.backend import migrate
from paritywatch.backend.db import make_engine
from tests.api.test_migrations import empty_db_url  # noqa: F401 - the fixture (sqlite and postgresql)


def counts(url: str) -> dict[str, int]:
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            return {t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar()
                    for t in ("runs", "components", "rules", "rule_states", "webhooks", "webhook_deliveries", "alerts")}
    finally:
        engine.dispose()


def test_0003_keeps_every_row_both_ways(empty_db_url):  # noqa: F811
    url = empty_db_url
    migrate.upgrade(url, "0002")
    engine = make_engine(url)
    now = "2026-12-01 09:00:00"
    with engine.begin() as c:
        c.execute(text("INSERT INTO runs (id, project, name, tags, config, created_at, control_state, control_version, "
                       f"control_updated_at, on_mismatch) VALUES (1, 'p', 'r', '{{}}', '{{}}', '{now}', 'running', 1, '{now}', 'pause')"))
        c.execute(text("INSERT INTO components (id, run_id, side, worker_id, host, pid, started_at, last_heartbeat) "
                       f"VALUES (1, 1, 'trainer', 't', '', 0, '{now}', '{now}')"))
        c.execute(text("INSERT INTO rules (id, run_id, key, aggregate, \"window\", comparison, threshold, consecutive, "
                       "severity, action, enabled, builtin) VALUES (1, 1, 'loss', 'last', 1, '>', 1.0, 1, 'warning', 'alert', "
                       "true, false)"))
        c.execute(text("INSERT INTO rule_states (rule_id, run_id, streak) VALUES (1, 1, 2)"))
        c.execute(text("INSERT INTO webhooks (id, url, format, secret, events, enabled, created_at) "
                       f"VALUES (1, 'https://x.example/h', 'standard', 's', '[]', true, '{now}')"))
        c.execute(text("INSERT INTO webhook_deliveries (id, webhook_id, event_id, event_type, payload, status, attempts, "
                       f"next_attempt_at, created_at) VALUES (1, 1, 'msg_1', 'test', '{{}}', 'pending', 0, '{now}', '{now}')"))
    engine.dispose()
    before = counts(url)
    migrate.upgrade(url)
    assert counts(url) == before
    engine = make_engine(url)
    with engine.begin() as c:
        assert c.execute(text("SELECT status FROM components")).scalar() == "live"
        assert c.execute(text("SELECT keep_firing_for FROM rules")).scalar() == 0
        c.execute(text("UPDATE runs SET control_state = 'finished'"))
    engine.dispose()
    migrate.downgrade(url, "0002")
    assert counts(url) == before
    engine = make_engine(url)
    with engine.connect() as c:
        assert c.execute(text("SELECT control_state FROM runs")).scalar() == "stopped"  # 0002 has no finished
        assert c.execute(text("SELECT streak FROM rule_states")).scalar() == 2
    engine.dispose()
    migrate.upgrade(url)
    assert counts(url) == before
