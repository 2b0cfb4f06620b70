"""Keeps a run's record of what it trained on in step with its alerts: `track` runs in the
transaction of every alert change (backend/alerts/lifecycle.py), so the record and the alert
commit together. The rules are backend/detect/taint.py; the SQL backend/store/taint.py."""
from __future__ import annotations

from sqlalchemy.orm import Session

from paritywatch.backend.detect import taint as logic
from paritywatch.backend.models import Alert, Run, TaintSpan, utcnow
from paritywatch.backend.store import taint as store


def track(s: Session, run: Run, alert: Alert) -> None:
    """The alert fired, changed or resolved: open, refresh or close its span. A span opens when
    the alert starts to mean misaligned training (fired as an error, or a warning become one)
    and closes at the run's last step when it stops (resolved, or no longer an error)."""
    if alert.kind not in logic.TAINT_KINDS:
        return  # never a span: spare the lookup (a sweep may fire a hundred heartbeat alerts)
    cause = logic.cause_of(alert.kind, alert.severity, alert.detail, alert.step) if alert.status != "resolved" else None
    span = store.open_span_of(s, alert.id)
    if cause is None:
        if span is not None:
            store.close_span(span, run.last_step if run.last_step is not None else span.first_step - 1, utcnow())
        return
    rollout_workers = store.live_rollout_workers(s, run.id)
    if span is None:
        store.add_span(s, TaintSpan(run_id=run.id, alert_id=alert.id, kind=alert.kind, cause=cause.key, what=cause.what,
                                    first_step=logic.first_step(cause, run.last_step), worker_ids=list(cause.worker_ids),
                                    workers=len(cause.worker_ids), rollout_workers=rollout_workers, opened_at=utcnow()))
        return
    span.cause, span.what = cause.key, cause.what  # a re-posted processor may name one more component
    span.worker_ids = list(dict.fromkeys([*(span.worker_ids or []), *cause.worker_ids]))[:logic.MAX_WORKER_IDS]
    span.workers = max(span.workers, len(span.worker_ids))
    span.rollout_workers = max(span.rollout_workers, rollout_workers)


def records_of(s: Session, runs: list[Run]) -> dict[int, dict]:
    """run id -> its record (`logic.record`): tainted, first_step, steps, ranges, ranges_total."""
    spans = store.spans_of(s, [r.id for r in runs])
    return {r.id: logic.record([_span(x) for x in spans[r.id]], r.last_step) for r in runs}


def record_of(s: Session, run: Run) -> dict:
    return records_of(s, [run])[run.id]


def _span(row: TaintSpan) -> logic.Span:
    return logic.Span(row.alert_id, row.kind, row.cause, row.what, row.first_step, row.last_step,
                      tuple(row.worker_ids or ()), row.workers, row.rollout_workers)
