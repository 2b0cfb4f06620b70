"""Alert lifecycle: firing -> acknowledged -> resolved, one open alert per (run, dedup key),
every change audited and announced through the webhook outbox in the same transaction."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.errors import Conflict, NotFound
from backend.models import Alert, AlertEvent, Run, utcnow
from backend.webhooks.outbox import enqueue_event


def alert_dict(a: Alert) -> dict:
    return {
        "id": a.id, "run_id": a.run_id, "kind": a.kind, "severity": a.severity, "status": a.status,
        "dedup_key": a.dedup_key, "title": a.title, "detail": a.detail or {}, "step": a.step,
        "fired_at": a.fired_at, "updated_at": a.updated_at, "resolved_at": a.resolved_at,
    }


def _event_data(run: Run, alert: Alert) -> dict:
    a = alert_dict(alert)
    for k in ("fired_at", "updated_at", "resolved_at"):
        a[k] = a[k].isoformat() if a[k] else None
    return {"alert": a, "run": {"id": run.id, "name": run.name, "project": run.project}}


def open_alert(s: Session, run_id: int, dedup_key: str) -> Alert | None:
    return s.scalar(select(Alert).where(Alert.open_key == f"{run_id}:{dedup_key}"))


def open_alerts(s: Session, run_id: int, kind: str) -> list[Alert]:
    return list(s.scalars(select(Alert).where(Alert.run_id == run_id, Alert.kind == kind, Alert.open_key.is_not(None))))


def fire(s: Session, run: Run, kind: str, severity: str, dedup_key: str, title: str, detail: dict,
         step: int | None = None) -> tuple[Alert, bool]:
    """Open an alert, or refresh the open one with this key. Returns (alert, newly_fired)."""
    existing = open_alert(s, run.id, dedup_key)
    now = utcnow()
    if existing is not None:
        existing.detail, existing.title, existing.updated_at = detail, title, now
        if severity != existing.severity:
            existing.severity = severity
        return existing, False
    alert = Alert(run_id=run.id, kind=kind, severity=severity, dedup_key=dedup_key,
                  open_key=f"{run.id}:{dedup_key}", status="firing", title=title, detail=detail,
                  step=step, fired_at=now, updated_at=now)
    s.add(alert)
    s.flush()
    s.add(AlertEvent(alert_id=alert.id, action="fired", actor="paritywatch", note=title))
    enqueue_event(s, "alert.firing", _event_data(run, alert), run.project)
    return alert, True


def resolve(s: Session, run: Run, alert: Alert, actor: str, note: str | None = None, auto: bool = False) -> Alert:
    if alert.status == "resolved":
        return alert
    now = utcnow()
    alert.status, alert.open_key, alert.resolved_at, alert.updated_at = "resolved", None, now, now
    s.add(AlertEvent(alert_id=alert.id, action="auto_resolved" if auto else "resolved", actor=actor, note=note))
    s.flush()
    enqueue_event(s, "alert.resolved", _event_data(run, alert), run.project)
    return alert


def acknowledge(s: Session, alert: Alert, actor: str, note: str | None = None) -> Alert:
    if alert.status == "resolved":
        raise Conflict("a resolved alert cannot be acknowledged")
    if alert.status == "firing":
        alert.status, alert.updated_at = "acknowledged", utcnow()
        s.add(AlertEvent(alert_id=alert.id, action="acknowledged", actor=actor, note=note))
    return alert


def get_alert(s: Session, alert_id: int) -> Alert:
    alert = s.get(Alert, alert_id)
    if alert is None:
        raise NotFound(f"alert {alert_id} does not exist")
    return alert
