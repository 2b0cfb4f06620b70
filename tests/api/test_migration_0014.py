"""Migration 0014: the record of what a run trained on (`taint_spans`). Alerts still open at the
upgrade that mean misaligned training get an open span, exactly as the app would have opened it
(its frozen copy of the classification agrees with backend/detect/taint.py); other alerts, and
alerts that already resolved, get none. The downgrade drops the table."""
from __future__ import annotations

import json

from sqlalchemy import inspect, text

from paritywatch.backend import migrate
from paritywatch.backend.db import make_engine
from paritywatch.backend.detect import taint
from tests.api.test_migrations import empty_db_url  # noqa: F401 - the fixture (sqlite and postgresql)

NOW = "2026-12-03 09:00:00"
ALERTS = {  # id: (kind, severity, open, detail, step)
    1: ("processor_mismatch", "error", True, {"components": ["chat_template"], "worker_ids": ["w2"]}, 211),
    2: ("processor_mismatch", "warning", True, {"components": ["chat_template"], "worker_ids": ["w1"]}, 5),
    3: ("processor_mismatch", "error", False, {"components": ["vocab"], "worker_ids": ["w1"]}, 7),  # resolved before
    4: ("heartbeat_lost", "warning", True, {"worker_id": "w0"}, None),
    5: ("metric_threshold", "error", True, {"rule_key": "align/prompt_rerender_mismatch_frac", "comparison": ">",
                                           "threshold": 0.0, "steps": [50, 54]}, 54),
    6: ("metric_threshold", "error", True, {"rule_key": "loss", "comparison": ">", "threshold": 9.0}, 60),
    7: ("weights_mismatch", "error", True, {"worker_id": "w1"}, None),
    8: ("sample_audit", "error", True, {"cause": "rerender", "step": 41}, 41),
}


def test_0014_opens_spans_for_open_misalignment_alerts_only(empty_db_url):  # noqa: F811
    url = empty_db_url
    migrate.upgrade(url, "0012")
    engine = make_engine(url)
    with engine.begin() as c:
        c.execute(text("INSERT INTO runs (id, project, name, tags, config, created_at, last_step, control_state, "
                       f"control_version, control_updated_at, on_mismatch) VALUES (1, 'p', 'r', '{{}}', '{{}}', '{NOW}', "
                       f"300, 'running', 1, '{NOW}', 'pause')"))
        for i, (side, status) in enumerate([("trainer", "live"), ("rollout", "live"), ("rollout", "live"),
                                            ("rollout", "closed")]):
            c.execute(text("INSERT INTO components (id, run_id, side, worker_id, host, pid, started_at, last_heartbeat, "
                           f"status) VALUES ({i + 1}, 1, '{side}', 'w{i}', 'h', 1, '{NOW}', '{NOW}', '{status}')"))
        for alert_id, (kind, severity, is_open, detail, step) in ALERTS.items():
            c.execute(text("INSERT INTO alerts (id, run_id, kind, severity, dedup_key, status, open_key, title, detail, "
                           "step, fired_at, updated_at) VALUES (:id, 1, :kind, :severity, :key, :status, :open_key, 't', "
                           ":detail, :step, :now, :now)"),
                      {"id": alert_id, "kind": kind, "severity": severity, "key": f"k{alert_id}",
                       "status": "firing" if is_open else "resolved", "open_key": f"1:k{alert_id}" if is_open else None,
                       "detail": json.dumps(detail), "step": step, "now": NOW})
    engine.dispose()

    migrate.upgrade(url, "0014")
    engine = make_engine(url)
    with engine.connect() as c:
        rows = c.execute(text("SELECT alert_id, kind, cause, what, first_step, last_step, worker_ids, workers, "
                              "rollout_workers FROM taint_spans ORDER BY alert_id")).all()
    engine.dispose()
    got = {r.alert_id: (r.cause, r.what, r.first_step, r.last_step, _list(r.worker_ids), r.workers, r.rollout_workers)
           for r in rows}
    assert sorted(got) == [1, 5, 7, 8]
    for alert_id, (kind, severity, _, detail, step) in ALERTS.items():
        if alert_id not in got:
            continue
        cause = taint.cause_of(kind, severity, detail, step)  # what the app would have recorded
        first = 0 if kind == "weights_mismatch" else taint.first_step(cause, step if kind == "processor_mismatch" else 300)
        assert got[alert_id] == (cause.key, cause.what, first, None, list(cause.worker_ids), len(cause.worker_ids), 2)
    assert got[1][2] == 212 and got[5][2] == 50 and got[8][2] == 41  # the steps after the finding, or measured

    migrate.downgrade(url, "0012")
    engine = make_engine(url)
    try:
        assert "taint_spans" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def _list(value) -> list:
    return json.loads(value) if isinstance(value, str) else value
