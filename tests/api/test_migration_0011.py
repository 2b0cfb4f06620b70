"""Migration 0011: existing runs' built-in align rules get the new 10-batch hold, unless someone
changed it; a user's own rules are left alone; the downgrade gives back exactly what it changed."""
from __future__ import annotations

from sqlalchemy import text

from paritywatch.backend import migrate
from paritywatch.backend.db import make_engine
from paritywatch.backend.detect.rules import BUILTIN_KEEP_FIRING_FOR
from tests.api.test_migrations import empty_db_url  # noqa: F401 - the fixture (sqlite and postgresql)

RULES = {  # id: (key, builtin, keep_firing_for before)
    1: ("align/kl_k3", True, 0),                   # built-in, as created: gets the hold
    2: ("align/decode_mismatch_frac", True, 3),    # built-in, changed by someone: kept
    3: ("align/kl_k3", False, 0),                  # a user's own rule on the same key: kept
    4: ("loss", True, 0),                          # not one of the built-in align keys: kept
}


def holds(url: str) -> dict[int, int]:
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            return dict(c.execute(text("SELECT id, keep_firing_for FROM rules ORDER BY id")).all())
    finally:
        engine.dispose()


def test_0011_sets_the_hold_on_untouched_builtin_rules_only(empty_db_url):  # noqa: F811
    url = empty_db_url
    migrate.upgrade(url, "0010")
    engine = make_engine(url)
    now = "2026-12-01 09:00:00"
    with engine.begin() as c:
        c.execute(text("INSERT INTO runs (id, project, name, tags, config, created_at, control_state, control_version, "
                       f"control_updated_at, on_mismatch) VALUES (1, 'p', 'r', '{{}}', '{{}}', '{now}', 'running', 1, '{now}', 'pause')"))
        for rule_id, (key, builtin, keep) in RULES.items():
            c.execute(text("INSERT INTO rules (id, run_id, key, aggregate, \"window\", comparison, threshold, consecutive, "
                           "severity, action, enabled, builtin, keep_firing_for, kind, per_worker) VALUES "
                           "(:id, 1, :key, 'last', 1, '>', 0.0, 1, 'warning', 'alert', true, :builtin, :keep, "
                           "'threshold', false)"), {"id": rule_id, "key": key, "builtin": builtin, "keep": keep})
    engine.dispose()
    migrate.upgrade(url, "0011")
    assert holds(url) == {1: BUILTIN_KEEP_FIRING_FOR, 2: 3, 3: 0, 4: 0}
    migrate.downgrade(url, "0010")
    assert holds(url) == {1: 0, 2: 3, 3: 0, 4: 0}
